/* The portable C kernel of treeflare.crypto.native: the functions of fixed_base.c (the AVX-512 IFMA kernel),
   same names, same C signatures, same contracts (values below the kernel's bound in and out: 2m there, R here, see
   below; the Python side converts and checks against gmpy2 before it trusts a modulus), for CPUs without IFMA
   (x86-64 before Ice Lake or Zen 4, aarch64).  Plain C99 plus unsigned __int128 (GCC and Clang on every 64-bit
   target): no intrinsics, so one source builds on x86-64 and aarch64 alike; a separate file because fixed_base.c
   includes <immintrin.h>, which an aarch64 compiler does not have, and because each file is compiled and cached on
   its own (loader.py).

   The kernel's form: L limbs of 64 bits, little-endian, m < R = 2^(64 L) (the Montgomery radix): no spare limb,
   so a 2048-bit p^2 takes 32 limbs and a 4096-bit n^2 64 (the 4m < R of fixed_base.c's lazy bound would take 33
   and 65: 3-6% more multiplications).  Every value in and out is below R, not necessarily below m ("almost
   Montgomery" products): a product's result is below R + m, and where it reaches R (its carry limb is 1), m is
   subtracted, with a mask, not a branch.  Leaving Montgomery form gives at most m (the Python side reduces).
   One product at a time, by product scanning (column by column, a three-word accumulator in registers, the
   Montgomery quotient digits interleaved: "FIPS"), which runs at about one 64x64-bit multiplication per cycle;
   squarings compute each cross product once (on long operands in the same loop as the reduction's products).
   Neither has a branch or a memory access that depends on the values, so the secret exponentiation
   (fb_powm_sec_many) is constant-time in its exponent as in fixed_base.c.

   On x86-64 with BMI2 and ADX (mulx, adcx, adox: Intel since Broadwell, AMD since Zen 1) the products and squarings
   take another path, because C's 128-bit sums make one serial carry chain: operand scanning in inline assembly, the
   whole product (each cross product once for a squaring) and then the reduction, row by row, each row t += x[0..n-1] y
   with two carry chains side by side (adcx: the product's high words, adox: the running sum).  About 12-15% faster
   products and 25% faster squarings from 22 to 64 limbs (Zen 4), the same results to the bit (the same R, the same
   quotient, the same masked subtraction), no branch or address that depends on the values either.  Chosen once, at the
   first product, from cpuid; TREEFLARE_PORTABLE_ADX=0 keeps the C path (to compare the two: both are in the one
   library, which loader.py caches by its source).  Elsewhere (aarch64) only the C is compiled.  (Over 400 lines: the
   assembly path sits beside the C it replaces, in the one file the loader builds, checks and caches as this kernel.)

   Compiles clean with -Wall -Wextra (tests/crypto/test_crypto_native.py).  The ctypes declarations in
   treeflare/crypto/native/loader.py serve both kernels: change all three together. */

#include <stdint.h>
#include <string.h>

typedef uint64_t u64;
typedef unsigned __int128 u128;
#define MAXL 130 /* limbs: moduli up to 8192 bits (n^2 of a 4096-bit key); _MAX_DIGITS in __init__.py */

int fb_supported(void) { return 1; }

/* which kernel this is: the Python side checks that the library it loaded is this one */
int fb_digit_bits(void) { return 64; }

/* A (128 bits) + T (64 bits above it) += x * y */
#define MAC3(A, T, x, y)                                                                                           \
    do {                                                                                                           \
        u128 p_ = (u128)(x) * (y);                                                                                 \
        A += p_;                                                                                                   \
        T += A < p_;                                                                                               \
    } while (0)
#define MAC(x, y) MAC3(acc, top, x, y)
#define NEXT_COLUMN()                                                                                              \
    do {                                                                                                           \
        acc = (acc >> 64) | ((u128)top << 64);                                                                     \
        top = 0;                                                                                                   \
    } while (0)

/* (A, T) += (B, U), both three-word sums */
#define ADD3(A, T, B, U)                                                                                           \
    do {                                                                                                           \
        A += B;                                                                                                    \
        T += U + (A < B);                                                                                          \
    } while (0)

/* out (L limbs) and the carry c (0 or 1) above them hold a value below R + m: subtract m where c is 1, with a
   mask (no branch): below R after */
static void carry_sub(u64 *out, u64 c, const u64 *m, long L) {
    u64 mask = (u64)0 - c, borrow = 0;
    for (long i = 0; i < L; i++) {
        u128 d = (u128)out[i] - (m[i] & mask) - borrow;
        out[i] = (u64)d;
        borrow = (u64)(d >> 64) & 1;
    }
}

/* out = a b / R mod m, < R, for a, b < R (m < R odd).  Column i < L finds the quotient digit t[i] that clears it;
   columns L .. 2L-1 are the result, below (R^2 + R m) / R = R + m: where it carries into limb L, m is subtracted.
   The products a b and the reduction terms t m go into separate accumulators, added once per column: two carry
   chains the CPU runs side by side (about 10% faster than one).  out may alias a or b: out[k] is written after
   the last column that reads a[k], b[k]. */
static void mont_mul_c(u64 *out, const u64 *a, const u64 *b, const u64 *m, u64 minv, long L) {
    u64 t[MAXL];
    u128 acc = 0;
    u64 top = 0;
    for (long i = 0; i < 2 * L - 1; i++) {
        long lo = i < L ? 0 : i - L + 1, hi = i < L ? i : L;
        u128 r = 0;
        u64 rt = 0;
        for (long j = lo; j < hi; j++) {
            MAC(a[j], b[i - j]);
            MAC3(r, rt, t[j], m[i - j]);
        }
        ADD3(acc, top, r, rt);
        if (i < L) {
            MAC(a[i], b[0]);
            t[i] = (u64)acc * minv;
            MAC(t[i], m[0]);
        } else {
            out[i - L] = (u64)acc;
        }
        NEXT_COLUMN();
    }
    out[L - 1] = (u64)acc;
    carry_sub(out, (u64)(acc >> 64), m, L);
}

/* The end of a squaring's column i, both variants: the cross products doubled, added with the reduction's and the
   square a[i/2]^2, the quotient digit (columns below L) or the result digit; then, after the last column, the top
   digit and the masked subtraction. */
#define SQR_COLUMN_END()                                                                                           \
    do {                                                                                                           \
        ctop = (ctop << 1) | (u64)(cross >> 127);                                                                  \
        cross <<= 1;                                                                                               \
        ADD3(acc, top, cross, ctop);                                                                               \
        ADD3(acc, top, r, rt);                                                                                     \
        if (!(i & 1)) MAC(a[i / 2], a[i / 2]);                                                                     \
        if (i < L) {                                                                                               \
            t[i] = (u64)acc * minv;                                                                                \
            MAC(t[i], m[0]);                                                                                       \
        } else {                                                                                                   \
            out[i - L] = (u64)acc;                                                                                 \
        }                                                                                                          \
        NEXT_COLUMN();                                                                                             \
    } while (0)
#define SQR_FINISH()                                                                                               \
    do {                                                                                                           \
        out[L - 1] = (u64)acc;                                                                                     \
        carry_sub(out, (u64)(acc >> 64), m, L);                                                                    \
    } while (0)

/* out = a^2 / R mod m (< R): as mont_mul, each cross product a[j] a[i-j] (j < i-j) once, then doubled.  Short
   operands (a 2048-bit p^2): the cross products and the reduction's products in two loops per column. */
static void mont_sqr_short(u64 *out, const u64 *a, const u64 *m, u64 minv, long L) {
    u64 t[MAXL];
    u128 acc = 0;
    u64 top = 0;
    for (long i = 0; i < 2 * L - 1; i++) {
        long lo = i < L ? 0 : i - L + 1, hi = i < L ? i : L;
        u128 cross = 0, r = 0;
        u64 ctop = 0, rt = 0;
        for (long j = lo; j < i - j; j++) MAC3(cross, ctop, a[j], a[i - j]);
        for (long j = lo; j < hi; j++) MAC3(r, rt, t[j], m[i - j]);
        SQR_COLUMN_END();
    }
    SQR_FINISH();
}

/* mont_sqr for long operands (a 4096-bit n^2): while a column has cross products left, each step takes one cross
   product and one of the reduction's (two carry chains), then the rest of the reduction's, four per step (about
   3-8% faster than mont_sqr_short there; slower on short operands, whose columns are too short to pay for it). */
static void mont_sqr_long(u64 *out, const u64 *a, const u64 *m, u64 minv, long L) {
    u64 t[MAXL];
    u128 acc = 0;
    u64 top = 0;
    for (long i = 0; i < 2 * L - 1; i++) {
        long lo = i < L ? 0 : i - L + 1, hi = i < L ? i : L;
        long ch = (i + 1) / 2; /* cross products a[j] a[i-j] for lo <= j < ch (j < i - j) */
        u128 cross = 0, r = 0;
        u64 ctop = 0, rt = 0;
        const u64 *ai = a + i, *mi = m + i;
        long j = lo;
        for (; j + 2 <= ch; j += 2) {
            MAC3(cross, ctop, a[j], ai[-j]);
            MAC3(r, rt, t[j], mi[-j]);
            MAC3(cross, ctop, a[j + 1], ai[-j - 1]);
            MAC3(r, rt, t[j + 1], mi[-j - 1]);
        }
        for (; j < ch; j++) {
            MAC3(cross, ctop, a[j], ai[-j]);
            MAC3(r, rt, t[j], mi[-j]);
        }
        for (; j + 4 <= hi; j += 4) {
            MAC3(r, rt, t[j], mi[-j]);
            MAC3(r, rt, t[j + 1], mi[-j - 1]);
            MAC3(r, rt, t[j + 2], mi[-j - 2]);
            MAC3(r, rt, t[j + 3], mi[-j - 3]);
        }
        for (; j < hi; j++) MAC3(r, rt, t[j], mi[-j]);
        SQR_COLUMN_END();
    }
    SQR_FINISH();
}

#define SQR_LONG 48 /* limbs: mont_sqr_long from here (measured: 4096-bit n^2, 64 limbs, gains; 32 limbs lose) */

static void mont_sqr_c(u64 *out, const u64 *a, const u64 *m, u64 minv, long L) {
    if (L >= SQR_LONG)
        mont_sqr_long(out, a, m, minv, L);
    else
        mont_sqr_short(out, a, m, minv, L);
}

#if defined(__x86_64__) && defined(__LP64__)
#include <cpuid.h>
#include <stdlib.h>

/* One step of addmul_adx: (hi:lo) = x[k] y (mulx), lo += the previous step's hi (H, the CF chain) and t[k] (the OF
   chain), stored to t[k]; the new hi goes to N. */
#define ADX_STEP(k, H, N)                                                                                          \
    "mulx " #k "(%[x]), %[lo], %[" #N "]\n\t"                                                                      \
    "adcx %[" #H "], %[lo]\n\t"                                                                                    \
    "adox " #k "(%[t]), %[lo]\n\t"                                                                                 \
    "mov %[lo], " #k "(%[t])\n\t"

/* t[0..n-1] += x[0..n-1] y (n >= 1); returns the word carried out above t[n-1].  The loops move their pointers with
   lea and test their counter with jrcxz, neither of which touches the flags, so the two chains run through the
   whole row: the n mod 4 single steps, 4 more where n mod 8 >= 4, then blocks of 8. */
__attribute__((target("bmi2,adx"), always_inline)) static inline u64 addmul_adx(u64 *t, const u64 *x, long n,
                                                                               u64 y) {
    u64 h0 = 0, h1, lo, z;
    long cnt = n & 3, four = (n >> 2) & 1, blocks = n >> 3;
    __asm__ volatile("xor %k[z], %k[z]\n\t" /* z = 0, CF = OF = 0 */
                     "jrcxz 2f\n"
                     "1:\n\t" ADX_STEP(0, h0, h1) "mov %[h1], %[h0]\n\t"
                     "lea 8(%[x]), %[x]\n\t"
                     "lea 8(%[t]), %[t]\n\t"
                     "lea -1(%%rcx), %%rcx\n\t"
                     "jrcxz 2f\n\t"
                     "jmp 1b\n"
                     "2:\n\t"
                     "mov %[four], %%rcx\n\t"
                     "jrcxz 3f\n\t" ADX_STEP(0, h0, h1) ADX_STEP(8, h1, h0) ADX_STEP(16, h0, h1)
                         ADX_STEP(24, h1, h0)
                     "lea 32(%[x]), %[x]\n\t"
                     "lea 32(%[t]), %[t]\n"
                     "3:\n\t"
                     "mov %[blocks], %%rcx\n\t"
                     "jrcxz 5f\n\t" /* jrcxz reaches 127 bytes: 9f through a jmp */
                     "jmp 4f\n"
                     "5:\n\t"
                     "jmp 9f\n"
                     "4:\n\t" ADX_STEP(0, h0, h1) ADX_STEP(8, h1, h0) ADX_STEP(16, h0, h1) ADX_STEP(24, h1, h0)
                         ADX_STEP(32, h0, h1) ADX_STEP(40, h1, h0) ADX_STEP(48, h0, h1) ADX_STEP(56, h1, h0)
                     "lea 64(%[x]), %[x]\n\t"
                     "lea 64(%[t]), %[t]\n\t"
                     "lea -1(%%rcx), %%rcx\n\t"
                     "jrcxz 9f\n\t"
                     "jmp 4b\n"
                     "9:\n\t"
                     "adcx %[z], %[h0]\n\t" /* below 2^64: t + x y < 2^(64 (n + 1)) */
                     "adox %[z], %[h0]\n\t"
                     /* every written operand early-clobber: four and blocks (often equal to h0 or cnt, e.g. 0)
                        are read after t, x, h0 and rcx change, so no input may share their registers */
                     : [t] "+&r"(t), [x] "+&r"(x), [h0] "+&r"(h0), [h1] "=&r"(h1), [lo] "=&r"(lo), [z] "=&r"(z),
                       "+&c"(cnt)
                     : [four] "r"(four), [blocks] "r"(blocks), "d"(y)
                     : "cc", "memory");
    return h0;
}

/* s (2L limbs, a's cross products) = 2 s + the squares a[i]^2 at limbs 2i, 2i+1: doubling on the CF chain (adcx
   w, w), the squares on the OF chain; no carry out (a^2 < R^2). */
__attribute__((target("bmi2,adx"))) static void sqr_diag_adx(u64 *s, const u64 *a, long L) {
    u64 dx, lo, hi, w, z;
    __asm__ volatile("xor %k[z], %k[z]\n"
                     "1:\n\t"
                     "mov (%[a]), %%rdx\n\t"
                     "mulx %%rdx, %[lo], %[hi]\n\t"
                     "mov (%[s]), %[w]\n\t"
                     "adcx %[w], %[w]\n\t"
                     "adox %[lo], %[w]\n\t"
                     "mov %[w], (%[s])\n\t"
                     "mov 8(%[s]), %[w]\n\t"
                     "adcx %[w], %[w]\n\t"
                     "adox %[hi], %[w]\n\t"
                     "mov %[w], 8(%[s])\n\t"
                     "lea 8(%[a]), %[a]\n\t"
                     "lea 16(%[s]), %[s]\n\t"
                     "lea -1(%%rcx), %%rcx\n\t"
                     "jrcxz 9f\n\t"
                     "jmp 1b\n"
                     "9:\n\t"
                     : [s] "+r"(s), [a] "+r"(a), "+c"(L), "=&d"(dx), [lo] "=&r"(lo), [hi] "=&r"(hi), [w] "=&r"(w),
                       [z] "=&r"(z)
                     :
                     : "cc", "memory");
}

/* out = s / R mod m, almost (< R), for s < R^2 (2L limbs, overwritten): row i adds q m at limb i, q clearing
   it; the row's carry word and the carry bit of the row before go into limb i + L. */
__attribute__((target("bmi2,adx"))) static void redc_adx(u64 *out, u64 *s, const u64 *m, u64 minv, long L) {
    u64 cy = 0;
    for (long i = 0; i < L; i++) {
        u128 v = (u128)s[i + L] + addmul_adx(s + i, m, L, s[i] * minv) + cy;
        s[i + L] = (u64)v;
        cy = (u64)(v >> 64);
    }
    memcpy(out, s + L, L * sizeof(u64));
    carry_sub(out, cy, m, L);
}

/* mont_mul and mont_sqr by operand scanning: the whole product (rows a[i] b), then the reduction (rows q m) */
__attribute__((target("bmi2,adx"))) static void mont_mul_adx(u64 *out, const u64 *a, const u64 *b, const u64 *m,
                                                             u64 minv, long L) {
    u64 s[2 * MAXL];
    memset(s, 0, L * sizeof(u64));
    for (long i = 0; i < L; i++) s[i + L] = addmul_adx(s + i, b, L, a[i]);
    redc_adx(out, s, m, minv, L);
}

__attribute__((target("bmi2,adx"))) static void mont_sqr_adx(u64 *out, const u64 *a, const u64 *m, u64 minv,
                                                             long L) {
    u64 s[2 * MAXL];
    memset(s, 0, L * sizeof(u64));
    s[2 * L - 1] = 0;
    for (long i = 0; i + 1 < L; i++) s[i + L] = addmul_adx(s + 2 * i + 1, a + i + 1, L - 1 - i, a[i]);
    sqr_diag_adx(s, a, L);
    redc_adx(out, s, m, minv, L);
}

static int adx_state = -1; /* -1 before the first product, then whether the mulx/adcx/adox path runs */

static int adx_init(void) {
    unsigned eax, ebx = 0, ecx, edx;
    const char *env = getenv("TREEFLARE_PORTABLE_ADX");
    int on = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ebx & bit_BMI2) && (ebx & bit_ADX) &&
             !(env && env[0] == '0');
    __atomic_store_n(&adx_state, on, __ATOMIC_RELAXED);
    return on;
}

static inline int use_adx(void) {
    int s = __atomic_load_n(&adx_state, __ATOMIC_RELAXED);
    return s >= 0 ? s : adx_init();
}
#endif

static void mont_mul(u64 *out, const u64 *a, const u64 *b, const u64 *m, u64 minv, long L) {
#if defined(__x86_64__) && defined(__LP64__)
    if (use_adx()) {
        mont_mul_adx(out, a, b, m, minv, L);
        return;
    }
#endif
    mont_mul_c(out, a, b, m, minv, L);
}

static void mont_sqr(u64 *out, const u64 *a, const u64 *m, u64 minv, long L) {
#if defined(__x86_64__) && defined(__LP64__)
    if (use_adx()) {
        mont_sqr_adx(out, a, m, minv, L);
        return;
    }
#endif
    mont_sqr_c(out, a, m, minv, L);
}

/* which path the products take: 1 for mulx/adcx/adox, 0 for the C (the report's native_kernel says which) */
int fb_portable_adx(void) {
#if defined(__x86_64__) && defined(__LP64__)
    return use_adx();
#else
    return 0;
#endif
}

/* the kernel's form is 64-bit limbs already: n64 limbs -> L limbs, zero-padded (the name is fixed_base.c's, whose
   form is 52-bit digits: the Python side calls both kernels by the same names) */
void fb_to52_many(const u64 *in, long count, long n64, u64 *out, long L) {
    long k = n64 < L ? n64 : L;
    for (long e = 0; e < count; e++) {
        memcpy(out + e * L, in + e * n64, k * sizeof(u64));
        memset(out + e * L + k, 0, (L - k) * sizeof(u64));
    }
}

/* x (Montgomery form) out of it, as n64 limbs: x / R mod m is at most m */
static void store_normal(const u64 *x, const u64 *m, u64 minv, long L, u64 *out, long n64) {
    u64 one[MAXL], v[MAXL];
    memset(one, 0, L * sizeof(u64));
    one[0] = 1;
    mont_mul(v, x, one, m, minv, L);
    long k = n64 < L ? n64 : L;
    memcpy(out, v, k * sizeof(u64));
    memset(out + k, 0, (n64 - k) * sizeof(u64));
}

/* out[e] = prod_i table[i][digits[e][i]] mod m (normal form, <= m, n64 limbs each).
   table: rows x 256 entries of L limbs in Montgomery form (x R mod m); one = R mod m. */
int fb_pow_many(const u64 *table, long rows, long L, const u64 *m, u64 minv, const u64 *one, const uint8_t *digits,
                long count, u64 *out, long n64) {
    if (L < 1 || L > MAXL) return -1;
    u64 acc[MAXL];
    for (long e = 0; e < count; e++) {
        memcpy(acc, one, L * sizeof(u64));
        for (long i = 0; i < rows; i++)
            mont_mul(acc, acc, table + ((size_t)i * 256 + digits[e * rows + i]) * L, m, minv, L);
        store_normal(acc, m, minv, L, out + e * n64, n64);
    }
    return 0;
}

/* Horner packing (fixed_base.c's fb_horner_many): for each group v_0..v_(g-1), acc = v_(g-1), then for
   k = 0..g-2: acc = acc^(2^shifts[k]) * v_(g-2-k) mod m.  r2 = R^2 mod m (values in normal form), or NULL (values
   in Montgomery form already).  Results <= m, n64 limbs. */
int fb_horner_many(const u64 *vals, long g, const long *shifts, long L, const u64 *m, u64 minv, const u64 *r2,
                   long count, u64 *out, long n64) {
    if (L < 1 || L > MAXL || g < 1) return -1;
    u64 acc[MAXL], x[MAXL];
    for (long e = 0; e < count; e++) {
        const u64 *grp = vals + e * g * L;
        memcpy(acc, grp + (g - 1) * L, L * sizeof(u64));
        if (r2) mont_mul(acc, acc, r2, m, minv, L);
        for (long k = 0; k < g - 1; k++) {
            for (long s = 0; s < shifts[k]; s++) mont_sqr(acc, acc, m, minv, L);
            memcpy(x, grp + (g - 2 - k) * L, L * sizeof(u64));
            if (r2) mont_mul(x, x, r2, m, minv, L);
            mont_mul(acc, acc, x, m, minv, L);
        }
        store_normal(acc, m, minv, L, out + e * n64, n64);
    }
    return 0;
}

/* into Montgomery form (x R mod m, < R) for count values (< R); r2 = R^2 mod m */
int fb_to_mont(const u64 *vals, long count, long L, const u64 *m, u64 minv, const u64 *r2, u64 *out) {
    if (L < 1 || L > MAXL) return -1;
    for (long e = 0; e < count; e++) mont_mul(out + e * L, vals + e * L, r2, m, minv, L);
    return 0;
}

/* out of Montgomery form: count values -> n64 limbs each */
int fb_from_mont(const u64 *vals, long count, long L, const u64 *m, u64 minv, u64 *out, long n64) {
    if (L < 1 || L > MAXL) return -1;
    for (long e = 0; e < count; e++) store_normal(vals + e * L, m, minv, L, out + e * n64, n64);
    return 0;
}

#define PREFETCH_AHEAD 2

/* Segment products, Montgomery form in and out: out[s] = prod of tab[idx[i]] for i in [starts[s], starts[s+1]);
   every segment non-empty, every index < n_tab (checked first, as in fixed_base.c). */
int fb_segprod(const u64 *tab, long n_tab, const int32_t *idx, long n_idx, const int64_t *starts, long nseg, long L,
               const u64 *m, u64 minv, u64 *out) {
    if (L < 1 || L > MAXL) return -1;
    if (nseg > 0 && (starts[0] < 0 || starts[nseg] > n_idx)) return -2;
    for (long s = 0; s < nseg; s++) {
        if (starts[s + 1] <= starts[s]) return -2;
        for (int64_t i = starts[s]; i < starts[s + 1]; i++)
            if (idx[i] < 0 || idx[i] >= n_tab) return -3;
    }
    for (long s = 0; s < nseg; s++) {
        u64 *acc = out + s * L;
        memcpy(acc, tab + (size_t)idx[starts[s]] * L, L * sizeof(u64));
        for (int64_t i = starts[s] + 1; i < starts[s + 1]; i++) {
            /* a node's rows are spread over a table larger than the caches: fetch ahead while this multiplies */
            if (i + PREFETCH_AHEAD < starts[s + 1]) {
                const char *row = (const char *)(tab + (size_t)idx[i + PREFETCH_AHEAD] * L);
                for (long off = 0; off < L * 8; off += 64) __builtin_prefetch(row + off);
            }
            mont_mul(acc, acc, tab + (size_t)idx[i] * L, m, minv, L);
        }
    }
    return 0;
}

/* vals^e mod m (fixed_base.c's fb_powm_sec_many): constant time with respect to e, fixed 4-bit windows from the
   top, every window 4 squarings and one multiplication by a table entry chosen by reading all 16 entries with
   masks.  Results <= m, n64 limbs. */
int fb_powm_sec_many(const u64 *vals, long count, const uint8_t *exp, long exp_bytes, long L, const u64 *m,
                     u64 minv, const u64 *r2, u64 *out, long n64) {
    if (L < 1 || L > MAXL || exp_bytes < 1) return -1;
    u64 tab[16][MAXL], acc[MAXL], sel[MAXL], one[MAXL];
    memset(one, 0, L * sizeof(u64));
    one[0] = 1;
    for (long e = 0; e < count; e++) {
        mont_mul(tab[1], vals + e * L, r2, m, minv, L); /* x R */
        mont_mul(tab[0], r2, one, m, minv, L);          /* R, the Montgomery one */
        for (int i = 2; i < 16; i++) mont_mul(tab[i], tab[i - 1], tab[1], m, minv, L);
        memcpy(acc, tab[0], L * sizeof(u64));
        for (long byte = 0; byte < exp_bytes; byte++) {
            for (int half = 0; half < 2; half++) {
                unsigned d = half ? (exp[byte] & 15u) : (exp[byte] >> 4);
                for (int s = 0; s < 4; s++) mont_sqr(acc, acc, m, minv, L);
                memset(sel, 0, L * sizeof(u64));
                for (unsigned i = 0; i < 16; i++) {
                    u64 mk = (u64)0 - (u64)(((u64)(i ^ d) - 1) >> 63); /* all ones when i == d, without a branch */
                    for (long j = 0; j < L; j++) sel[j] |= tab[i][j] & mk;
                }
                mont_mul(acc, acc, sel, m, minv, L);
            }
        }
        store_normal(acc, m, minv, L, out + e * n64, n64);
    }
    return 0;
}
