/* The C kernel of treeflare.crypto.native: eight independent Montgomery products at once, one per AVX-512
   lane, on 52-bit digits (AVX-512 IFMA).  Same integers as the package's gmpy2 arithmetic; the Python side
   checks that before it trusts the kernel for a modulus.

   Built at run time by treeflare/crypto/native/loader.py (with its CFLAGS, into a private cache named
   after a hash of this file, the compiler and its flags); compiles clean with -Wall -Wextra
   (tests/test_crypto_native.py).  The exported functions' C signatures are mirrored by the ctypes
   declarations in treeflare/crypto/native/__init__.py: change both together. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t u64;
#define MAXL 160
#define MASK52 ((1ULL << 52) - 1)
#define IFMA __attribute__((target("avx512f,avx512ifma")))

int fb_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512ifma");
}

/* 64-bit limbs (n64, little-endian) -> L digits of 52 bits */
void fb_to52(const u64 *in, long n64, u64 *out, long L) {
    for (long j = 0; j < L; j++) {
        long bit = 52 * j, w = bit / 64, s = bit % 64;
        u64 v = 0;
        if (w < n64) v = in[w] >> s;
        if (s > 12 && w + 1 < n64) v |= in[w + 1] << (64 - s);
        out[j] = v & MASK52;
    }
}

void fb_to52_many(const u64 *in, long count, long n64, u64 *out, long L) {
    for (long e = 0; e < count; e++) fb_to52(in + e * n64, n64, out + e * L, L);
}

/* L digits of 52 bits -> n64 64-bit limbs */
static void from52(const u64 *in, long L, u64 *out, long n64) {
    memset(out, 0, n64 * sizeof(u64));
    for (long j = 0; j < L; j++) {
        long bit = 52 * j, w = bit / 64, s = bit % 64;
        if (w < n64) out[w] |= in[j] << s;
        if (s > 12 && w + 1 < n64) out[w + 1] |= in[j] >> (64 - s);
    }
}

/* 8 independent Montgomery products, one per lane: out = a b / 2^(52 L) mod m (< 2m, normalised digits).
   a, b: normalised digits, values < 2m; 4m < 2^(52 L). out may alias a. */
static IFMA void mont_mul8(__m512i *out, const __m512i *a, const __m512i *b, const u64 *m, u64 minv, long L) {
    __m512i t[2 * MAXL + 2];
    const __m512i zero = _mm512_setzero_si512(), vmask = _mm512_set1_epi64(MASK52), vminv = _mm512_set1_epi64(minv);
    for (long k = 0; k < 2 * L + 2; k++) t[k] = zero;
    const __m512i m0 = _mm512_set1_epi64((long long)m[0]);
    for (long i = 0; i < L; i++) {
        __m512i bi = b[i];
        __m512i lo = _mm512_madd52lo_epu64(t[i], a[0], bi);
        __m512i q = _mm512_and_si512(_mm512_madd52lo_epu64(zero, lo, vminv), vmask);
        lo = _mm512_madd52lo_epu64(lo, q, m0);
        __m512i hi = _mm512_add_epi64(t[i + 1], _mm512_srli_epi64(lo, 52));
        hi = _mm512_madd52hi_epu64(hi, a[0], bi);
        hi = _mm512_madd52hi_epu64(hi, q, m0);
        for (long j = 1; j < L; j++) {
            __m512i mj = _mm512_set1_epi64((long long)m[j]);
            hi = _mm512_madd52lo_epu64(hi, a[j], bi);
            t[i + j] = _mm512_madd52lo_epu64(hi, q, mj);
            hi = _mm512_madd52hi_epu64(t[i + j + 1], a[j], bi);
            hi = _mm512_madd52hi_epu64(hi, q, mj);
        }
        t[i + L] = hi;
    }
    __m512i carry = zero;
    for (long j = 0; j < L; j++) {
        __m512i v = _mm512_add_epi64(t[L + j], carry);
        out[j] = _mm512_and_si512(v, vmask);
        carry = _mm512_srli_epi64(v, 52);
    }
}

/* ---- lanes: eight records at a time; a lane past the end repeats record 0 of the batch (its result is dropped) */
static IFMA __m512i lane_index(long base, long lanes, long stride) {
    long long idx[8];
    for (long k = 0; k < 8; k++) idx[k] = (base + (k < lanes ? k : 0)) * stride;
    return _mm512_loadu_si512(idx);
}

static IFMA void gather(__m512i *x, __m512i vidx, const u64 *p, long L) {
    for (long j = 0; j < L; j++) x[j] = _mm512_i64gather_epi64(vidx, (const void *)(p + j), 8);
}

static IFMA void broadcast(__m512i *x, const u64 *v, long L) {
    for (long j = 0; j < L; j++) x[j] = _mm512_set1_epi64((long long)v[j]);
}

static IFMA void set_one(__m512i *x, long L) {
    x[0] = _mm512_set1_epi64(1);
    for (long j = 1; j < L; j++) x[j] = _mm512_setzero_si512();
}

/* each lane's L digits, as they are (Montgomery form kept) */
static IFMA void store_digits(const __m512i *x, long base, long lanes, u64 *out, long L) {
    for (long j = 0; j < L; j++) {
        u64 tmp[8];
        _mm512_storeu_si512(tmp, x[j]);
        for (long k = 0; k < lanes; k++) out[(base + k) * L + j] = tmp[k];
    }
}

/* each lane out of Montgomery form (x / R, < 2m) as n64 64-bit limbs */
static IFMA void store_normal(__m512i *x, long base, long lanes, const u64 *m, u64 minv, long L, u64 *out,
                              long n64) {
    __m512i one[MAXL];
    u64 lane[8][MAXL];
    set_one(one, L);
    mont_mul8(x, x, one, m, minv, L);
    for (long j = 0; j < L; j++) {
        u64 tmp[8];
        _mm512_storeu_si512(tmp, x[j]);
        for (long k = 0; k < 8; k++) lane[k][j] = tmp[k];
    }
    for (long k = 0; k < lanes; k++) from52(lane[k], L, out + (base + k) * n64, n64);
}

#define LANES(base, count) ((count) - (base) < 8 ? (count) - (base) : 8)

/* out[e] = prod_i table[i][digits[e][i]] mod m (normal form, < 2m, n64 limbs each).
   table: rows x 256 entries of L digits in Montgomery form (x R mod m); one = R mod m. */
IFMA int fb_pow_many(const u64 *table, long rows, long L, const u64 *m, u64 minv, const u64 *one,
                     const uint8_t *digits, long count, u64 *out, long n64) {
    if (L < 1 || L > MAXL) return -1;
    __m512i acc[MAXL], b[MAXL];
    for (long base = 0; base < count; base += 8) {
        long lanes = LANES(base, count);
        broadcast(acc, one, L);
        for (long i = 0; i < rows; i++) {
            long long idx[8];
            for (long k = 0; k < 8; k++) idx[k] = k < lanes ? (long long)digits[(base + k) * rows + i] * L : 0;
            gather(b, _mm512_loadu_si512(idx), table + (size_t)i * 256 * L, L);
            mont_mul8(acc, acc, b, m, minv, L);
        }
        store_normal(acc, base, lanes, m, minv, L, out, n64);
    }
    return 0;
}

/* Horner packing of ciphertexts (a passive party's compression): for each of ``count`` groups of g values
   v_0..v_(g-1) (normal form, L digits each, group-major), acc = v_(g-1), then for k = 0..g-2:
   acc = acc^(2^shifts[k]) * v_(g-2-k) mod m.  r2 = R^2 mod m (into Montgomery form); with r2 NULL the values
   are in Montgomery form already (a passive party's histogram sums straight from the merge).  Results < 2m. */
IFMA int fb_horner_many(const u64 *vals, long g, const long *shifts, long L, const u64 *m, u64 minv,
                        const u64 *r2, long count, u64 *out, long n64) {
    if (L < 1 || L > MAXL || g < 1) return -1;
    __m512i acc[MAXL], x[MAXL], rr[MAXL];
    if (r2) broadcast(rr, r2, L);
    for (long base = 0; base < count; base += 8) {
        long lanes = LANES(base, count);
        __m512i vidx = lane_index(base, lanes, g * L);
        gather(acc, vidx, vals + (g - 1) * L, L);
        if (r2) mont_mul8(acc, acc, rr, m, minv, L);
        for (long k = 0; k < g - 1; k++) {
            for (long s = 0; s < shifts[k]; s++) mont_mul8(acc, acc, acc, m, minv, L);
            gather(x, vidx, vals + (g - 2 - k) * L, L);
            if (r2) mont_mul8(x, x, rr, m, minv, L);
            mont_mul8(acc, acc, x, m, minv, L);
        }
        store_normal(acc, base, lanes, m, minv, L, out, n64);
    }
    return 0;
}

/* Montgomery form in (x R mod m) for count values (normal form digits, < 2m); r2 = R^2 mod m. */
IFMA int fb_to_mont(const u64 *vals, long count, long L, const u64 *m, u64 minv, const u64 *r2, u64 *out) {
    if (L < 1 || L > MAXL) return -1;
    __m512i x[MAXL], rr[MAXL];
    broadcast(rr, r2, L);
    for (long base = 0; base < count; base += 8) {
        long lanes = LANES(base, count);
        gather(x, lane_index(base, lanes, L), vals, L);
        mont_mul8(x, x, rr, m, minv, L);
        store_digits(x, base, lanes, out, L);
    }
    return 0;
}

/* Montgomery form out: count values -> n64 64-bit limbs each (< 2m). */
IFMA int fb_from_mont(const u64 *vals, long count, long L, const u64 *m, u64 minv, u64 *out, long n64) {
    if (L < 1 || L > MAXL) return -1;
    __m512i x[MAXL];
    for (long base = 0; base < count; base += 8) {
        long lanes = LANES(base, count);
        gather(x, lane_index(base, lanes, L), vals, L);
        store_normal(x, base, lanes, m, minv, L, out, n64);
    }
    return 0;
}

#define PREFETCH_AHEAD 2

/* Start lane k on the next segment that has more than one value (one-value segments are copied through). */
static int next_segment(const u64 *tab, const int32_t *idx, const int64_t *starts, long nseg, long L, long *next,
                        u64 (*accm)[8], int k, long *seg, long *pos, long *end, u64 *out) {
    while (*next < nseg) {
        long s = (*next)++;
        const u64 *v = tab + (size_t)idx[starts[s]] * L;
        if (starts[s + 1] - starts[s] == 1) { memcpy(out + s * L, v, L * sizeof(u64)); continue; }
        for (long j = 0; j < L; j++) accm[j][k] = v[j];
        seg[k] = s; pos[k] = starts[s] + 1; end[k] = starts[s + 1];
        return 1;
    }
    return 0;
}

/* Segment products (a passive party's histogram cells and bins), Montgomery form in and out:
   out[s] = prod of tab[idx[i]] for i in [starts[s], starts[s+1]); every segment non-empty, every index < n_tab.
   Eight segments are multiplied at once; a lane that finishes takes the next segment. */
IFMA int fb_segprod(const u64 *tab, long n_tab, const int32_t *idx, long n_idx, const int64_t *starts, long nseg,
                    long L, const u64 *m, u64 minv, u64 *out) {
    if (L < 1 || L > MAXL) return -1;
    if (nseg > 0 && (starts[0] < 0 || starts[nseg] > n_idx)) return -2;
    for (long s = 0; s < nseg; s++) {
        if (starts[s + 1] <= starts[s]) return -2;
        for (int64_t i = starts[s]; i < starts[s + 1]; i++)
            if (idx[i] < 0 || idx[i] >= n_tab) return -3;
    }
    __m512i acc[MAXL], b[MAXL], prod[MAXL];
    u64 accm[MAXL][8] __attribute__((aligned(64)));
    long seg[8], pos[8], end[8], next = 0;
    int active[8];
    for (int k = 0; k < 8; k++) active[k] = next_segment(tab, idx, starts, nseg, L, &next, accm, k, seg, pos, end, out);
    for (;;) {
        __mmask8 mask = 0;
        long long gi[8];
        for (int k = 0; k < 8; k++) {
            gi[k] = active[k] ? (long long)idx[pos[k]] * L : 0;
            if (active[k]) mask |= (__mmask8)(1u << k);
        }
        if (!mask) break;
        /* the rows of a node's cells are spread over a table larger than the caches: fetch each lane's operand
           PREFETCH_AHEAD products ahead while this one multiplies */
        for (int k = 0; k < 8; k++) {
            if (active[k] && pos[k] + PREFETCH_AHEAD < end[k]) {
                const char *row = (const char *)(tab + (size_t)idx[pos[k] + PREFETCH_AHEAD] * L);
                for (long off = 0; off < L * 8; off += 64) _mm_prefetch(row + off, _MM_HINT_T0);
            }
        }
        gather(b, _mm512_loadu_si512(gi), tab, L);
        for (long j = 0; j < L; j++) acc[j] = _mm512_load_si512((const void *)accm[j]);
        mont_mul8(prod, acc, b, m, minv, L);
        for (long j = 0; j < L; j++) _mm512_store_si512((void *)accm[j], _mm512_mask_blend_epi64(mask, acc[j], prod[j]));
        for (int k = 0; k < 8; k++) {
            if (!active[k] || ++pos[k] < end[k]) continue;
            for (long j = 0; j < L; j++) out[seg[k] * L + j] = accm[j][k];
            active[k] = next_segment(tab, idx, starts, nseg, L, &next, accm, k, seg, pos, end, out);
        }
    }
    return 0;
}

/* vals^e mod m for count values (normal form digits, < 2m) and one exponent e (exp_bytes big-endian bytes), in
   constant time with respect to e: fixed 4-bit windows from the top, every window 4 squarings and one
   multiplication by a table entry chosen by reading all 16 entries with masks.  Results < 2m, n64 limbs. */
IFMA int fb_powm_sec_many(const u64 *vals, long count, const uint8_t *exp, long exp_bytes, long L, const u64 *m,
                          u64 minv, const u64 *r2, u64 *out, long n64) {
    if (L < 1 || L > MAXL || exp_bytes < 1) return -1;
    __m512i (*tab)[MAXL] = aligned_alloc(64, 16 * sizeof(*tab));     /* 16 x L digits: off the stack */
    if (!tab) return -4;
    __m512i acc[MAXL], sel[MAXL], one[MAXL];
    set_one(one, L);
    for (long base = 0; base < count; base += 8) {
        long lanes = LANES(base, count);
        gather(tab[1], lane_index(base, lanes, L), vals, L);
        broadcast(tab[0], r2, L);
        mont_mul8(tab[1], tab[1], tab[0], m, minv, L);        /* x R */
        mont_mul8(tab[0], tab[0], one, m, minv, L);           /* R, the Montgomery one */
        for (int i = 2; i < 16; i++) mont_mul8(tab[i], tab[i - 1], tab[1], m, minv, L);
        for (long j = 0; j < L; j++) acc[j] = tab[0][j];
        for (long byte = 0; byte < exp_bytes; byte++) {
            for (int half = 0; half < 2; half++) {
                unsigned d = half ? (exp[byte] & 15u) : (exp[byte] >> 4);
                for (int s = 0; s < 4; s++) mont_mul8(acc, acc, acc, m, minv, L);
                for (long j = 0; j < L; j++) sel[j] = _mm512_setzero_si512();
                for (unsigned i = 0; i < 16; i++) {
                    /* all ones when i == d, computed without a branch */
                    u64 eq = (u64)0 - (u64)(((u64)(i ^ d) - 1) >> 63);
                    __m512i mk = _mm512_set1_epi64((long long)eq);
                    for (long j = 0; j < L; j++) sel[j] = _mm512_or_si512(sel[j], _mm512_and_si512(tab[i][j], mk));
                }
                mont_mul8(acc, acc, sel, m, minv, L);
            }
        }
        store_normal(acc, base, lanes, m, minv, L, out, n64);
    }
    free(tab);
    return 0;
}
