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
static void mont_mul(u64 *out, const u64 *a, const u64 *b, const u64 *m, u64 minv, long L) {
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

static void mont_sqr(u64 *out, const u64 *a, const u64 *m, u64 minv, long L) {
    if (L >= SQR_LONG)
        mont_sqr_long(out, a, m, minv, L);
    else
        mont_sqr_short(out, a, m, minv, L);
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
