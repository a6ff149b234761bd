"""An optional C kernel for the two hottest modular products of the vertical job.

* The key holder's fixed-base products (the r^n of every encryption): ``g^e mod p^2`` and ``g^e mod q^2``
  from 8-bit window tables, about 128 modular multiplications per half.
* A passive party's compression (Horner packing): ``acc = acc^(2^w) * c mod n^2``, w squarings per field.

In Python each step is a gmpy2 multiplication and division.  On CPUs with AVX-512 IFMA (52-bit
multiply-add, e.g. AMD Zen 4/5, Intel Ice Lake and later) this kernel computes eight independent
products at once, one per vector lane, as Montgomery multiplications on 52-bit digits.  Same inputs,
the same integers out (checked against the Python arithmetic before the kernel is trusted for a
modulus); only the arithmetic is faster (about 7-10x per product on this project's machine).

It is compiled on first use with the system C compiler into a private per-user cache folder
(``$TREEFLARE_NATIVE_CACHE``, else ``~/.cache/treeflare``).  The kernel runs inside the key holder, so no other
user may be able to replace it: the folder must be this user's and writable by nobody else, no folder above it
may let another user rename its entries (:func:`_check_path`), and the library is opened without following
links, checked on its descriptor and loaded through that descriptor.  Without a compiler, without IFMA, with
``TREEFLARE_NATIVE=0`` or with a cache that fails these checks, the Python product is used (slower, same
results).  :func:`status` says which.

Decryption's exponentiations are constant-time in the secret exponent (fixed windows, every table entry
read); encryption's fixed-base table reads depend on the random exponent, as in Python (SECURITY.md).

(Over 400 lines: about 300 are the C source, kept in this module so that the package ships and builds it
as one file; about 150 build, check and load it safely.)
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import gmpy2
import numpy as np
from gmpy2 import mpz

_SOURCE = r"""
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
   acc = acc^(2^shifts[k]) * v_(g-2-k) mod m.  r2 = R^2 mod m (into Montgomery form).  Results < 2m. */
IFMA int fb_horner_many(const u64 *vals, long g, const long *shifts, long L, const u64 *m, u64 minv,
                        const u64 *r2, long count, u64 *out, long n64) {
    if (L < 1 || L > MAXL || g < 1) return -1;
    __m512i acc[MAXL], x[MAXL], rr[MAXL];
    broadcast(rr, r2, L);
    for (long base = 0; base < count; base += 8) {
        long lanes = LANES(base, count);
        __m512i vidx = lane_index(base, lanes, g * L);
        gather(acc, vidx, vals + (g - 1) * L, L);
        mont_mul8(acc, acc, rr, m, minv, L);
        for (long k = 0; k < g - 1; k++) {
            for (long s = 0; s < shifts[k]; s++) mont_mul8(acc, acc, acc, m, minv, L);
            gather(x, vidx, vals + (g - 2 - k) * L, L);
            mont_mul8(x, x, rr, m, minv, L);
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
"""

_LIB = None
_STATUS = "not loaded yet"
_LOCK = threading.Lock()
_MAX_DIGITS = 160           # MAXL in the C source: moduli up to 8192 bits (n^2 of a 4096-bit key)


def _disabled() -> bool:
    return os.environ.get("TREEFLARE_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


def _cache_dir() -> Path:
    """The cache folder's real path, refused unless no other user can replace what is in it (see
    :func:`_check_path`); folders that do not exist yet are made private to this user."""
    base = os.environ.get("TREEFLARE_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "treeflare")
    path = Path(base).resolve()             # the real folder, checked and used from here on
    _check_path(path)                       # before anything is made under a folder others can change
    missing, p = [], path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass                            # a parallel worker made it: checked below like any other
    if path.resolve() != path:
        raise OSError("native cache refused: its path changed while it was made")
    _check_path(path)
    return path


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group (a user private group: the user's primary group, named after the
    user, listing no other member), so that its write bit lets nobody else in."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == os.getgid() and group.gr_name == user and set(group.gr_mem) <= {user}


def _check_path(path: Path) -> None:
    """Every existing folder above the cache folder, up to /, must keep other users from renaming what is in it:
    a folder (not a link) owned by this user or root, and not writable by other users unless it has the sticky
    bit (like /tmp: then only an entry's owner may rename it, and every entry on the path is checked to be this
    user's or root's).  Group write counts as writable by others unless the group is this user's own."""
    uid = os.getuid()
    for folder in path.parents:
        try:
            st = os.lstat(folder)
        except FileNotFoundError:
            continue                        # made by us, private, in _cache_dir
        if not stat.S_ISDIR(st.st_mode):
            raise OSError("native cache refused: a folder on its path is a link or not a folder")
        if st.st_uid not in (0, uid):
            raise OSError("native cache refused: a folder on its path belongs to another user")
        others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid))
        if others_write and not st.st_mode & stat.S_ISVTX:
            raise OSError("native cache refused: a folder on its path can be written by other users and has "
                          "no sticky bit")


def _check_private(st: os.stat_result, kind, what: str) -> None:
    """A library loaded from a place others can write to could be replaced under us: the folder and the
    library must be this user's and writable by nobody else (checked on their open descriptors)."""
    if not kind(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(f"native cache {what} is not private to this user")


_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_checked(name: str, dir_fd: int) -> int:
    """A descriptor of the library ``name`` in the cache folder, never through a link, checked on itself."""
    try:
        fd = os.open(name, _NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError("native cache library is a symbolic link") from None
        raise
    try:
        _check_private(os.fstat(fd), stat.S_ISREG, "library")
    except OSError:
        os.close(fd)
        raise
    return fd


def _compile(cc: str, cache: Path, dir_fd: int, name: str) -> None:
    """Compile into a private temporary name in the cache folder, fsync, then rename to ``name`` (atomic: a
    party's workers may build at the same time, and a reader never sees half a library)."""
    src_fd, src = tempfile.mkstemp(dir=cache, prefix=".fixed_base_", suffix=".c")
    out_fd, part = tempfile.mkstemp(dir=cache, prefix=".fixed_base_", suffix=".part")
    os.close(out_fd)
    try:
        with os.fdopen(src_fd, "w") as fh:
            fh.write(_SOURCE)
        subprocess.run([cc, "-O2", "-fPIC", "-shared", "-o", part, src], check=True, capture_output=True,
                       timeout=120)
        fd = os.open(os.path.basename(part), _NOFOLLOW, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o500)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(os.path.basename(part), name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    finally:
        for leftover in (src, part):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _open_kernel(cc: str) -> int:
    """A checked descriptor of the compiled kernel (built first if the cache has none).  The caller loads it
    through ``/proc/self/fd/N``, so what is loaded is the file that was checked, whatever its name points to by
    then."""
    if not os.path.isdir("/proc/self/fd"):
        raise OSError("no /proc/self/fd to load the checked library through")
    name = f"fixed_base_{hashlib.sha256((_SOURCE + cc).encode()).hexdigest()[:16]}.so"
    cache = _cache_dir()
    dir_fd = os.open(cache, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _check_private(os.fstat(dir_fd), stat.S_ISDIR, "folder")
        try:
            return _open_checked(name, dir_fd)
        except FileNotFoundError:
            _compile(cc, cache, dir_fd, name)
            return _open_checked(name, dir_fd)
    finally:
        os.close(dir_fd)


def _reason(e: Exception) -> str:
    """Why the kernel is off, without a path (the status goes into report.json)."""
    if isinstance(e, subprocess.CalledProcessError):
        return f"the C compiler failed (exit status {e.returncode})"
    if isinstance(e, subprocess.TimeoutExpired):
        return "the C compiler timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)[:200]


def _load():
    with _LOCK:
        return _load_locked()


def _load_locked():
    global _LIB, _STATUS
    if _LIB is not None or _STATUS != "not loaded yet":
        return _LIB
    if _disabled():
        _STATUS = "off (TREEFLARE_NATIVE=0)"
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        _STATUS = "off: no C compiler found"
        return None
    try:
        fd = _open_kernel(cc)
        try:
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}")     # the checked file itself, not its name
        finally:
            os.close(fd)
        lib.fb_supported.restype = ctypes.c_int
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        _STATUS = f"off: {type(e).__name__}: {_reason(e)}"
        return None
    if not lib.fb_supported():
        _STATUS = "off: this CPU has no AVX-512 IFMA"
        return None
    lib.fb_to52_many.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_long]
    lib.fb_to52_many.restype = None
    lib.fb_pow_many.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_uint64,
                                ctypes.c_char_p, ctypes.c_char_p, ctypes.c_long, ctypes.c_char_p, ctypes.c_long]
    lib.fb_pow_many.restype = ctypes.c_int
    lib.fb_horner_many.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_char_p, ctypes.c_long, ctypes.c_char_p,
                                   ctypes.c_uint64, ctypes.c_char_p, ctypes.c_long, ctypes.c_char_p, ctypes.c_long]
    lib.fb_horner_many.restype = ctypes.c_int
    lib.fb_to_mont.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_uint64,
                               ctypes.c_char_p, ctypes.c_char_p]
    lib.fb_from_mont.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_uint64,
                                 ctypes.c_char_p, ctypes.c_long]
    lib.fb_segprod.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p,
                               ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p]
    lib.fb_powm_sec_many.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_char_p, ctypes.c_long, ctypes.c_long,
                                     ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_long]
    for fn in (lib.fb_to_mont, lib.fb_from_mont, lib.fb_segprod, lib.fb_powm_sec_many):
        fn.restype = ctypes.c_int
    _LIB = lib
    _STATUS = "on (AVX-512 IFMA)"
    return _LIB


def status() -> str:
    """'on (AVX-512 IFMA)', or 'off...' with the reason (loads the kernel if that was not tried yet)."""
    _load()
    return _STATUS


class _Modulus:
    """An odd modulus m in the kernel's form: L digits of 52 bits with 4m < 2^(52 L) (so Montgomery products of
    values below 2m stay below 2m)."""

    def __init__(self, lib, mod):
        self._lib = lib
        self.mod = mpz(mod)
        bits = int(self.mod.bit_length())
        if self.mod % 2 == 0:
            raise ValueError("the C kernel needs an odd modulus")
        self.L = (bits + 2) // 52 + 1
        if self.L > _MAX_DIGITS:
            raise ValueError(f"a {bits}-bit modulus is beyond the C kernel")
        self.n64 = (bits + 1 + 63) // 64          # results are < 2m before the last reduction
        self.shift = 52 * self.L
        self._minv = int((-pow(int(self.mod), -1, 1 << 52)) % (1 << 52))
        self._m = self._digits([self.mod])
        self._r2 = self._digits([(mpz(1) << (2 * self.shift)) % self.mod])     # R^2 mod m: into Montgomery form

    @staticmethod
    def _check(rc):
        if rc != 0:
            raise ValueError(f"the C kernel refused its arguments ({rc})")

    def _digits(self, values) -> bytes:
        nb, top = 8 * self.n64, 2 * self.mod          # the kernel's bound on every input: below 2m
        vals = [int(v) for v in values]
        if any(v < 0 or v >= top for v in vals):
            raise ValueError("a value outside [0, 2m) for the C kernel")
        raw = b"".join(v.to_bytes(nb, "little") for v in vals)
        count = len(raw) // nb
        out = ctypes.create_string_buffer(8 * self.L * count)
        self._lib.fb_to52_many(raw, count, self.n64, out, self.L)
        return out.raw

    def _results(self, out) -> list:
        nb, raw, m = 8 * self.n64, out.raw, self.mod
        return [mpz.from_bytes(raw[i:i + nb], "little") % m for i in range(0, len(raw), nb)]


class NativeProducts(_Modulus):
    """A passive party's ciphertext arithmetic mod n^2, eight results at once: its encrypted histograms
    (products kept in Montgomery form between steps: :meth:`load` once, :meth:`segment_products` as often as
    needed, :meth:`values` at the end) and the packing of its replies (:meth:`horner_many`)."""

    def horner_many(self, groups, widths) -> list:
        """For groups of values x_0..x_(g-1) (lowest field first) with field widths w_j, all groups the same
        shape: acc = x_(g-1); acc = acc^(2^w_j) * x_j mod m for j = g-2 .. 0."""
        groups = [list(gr) for gr in groups]
        g = len(widths)
        if not groups:
            return []
        if any(len(gr) != g for gr in groups) or g < 1:
            raise ValueError("every group needs one value per width")
        if any(not 0 <= int(w) < 2**31 for w in widths):
            raise ValueError("field widths must be in [0, 2^31)")
        shifts = (ctypes.c_long * max(1, g - 1))(*[int(w) for w in reversed(widths[:-1])])
        vals = self._digits(v for gr in groups for v in gr)
        out = ctypes.create_string_buffer(8 * self.n64 * len(groups))
        self._check(self._lib.fb_horner_many(vals, g, ctypes.cast(shifts, ctypes.c_char_p), self.L, self._m,
                                             self._minv, self._r2, len(groups), out, self.n64))
        return self._results(out)

    def load(self, values) -> bytes:
        digits = self._digits(values)
        count = len(digits) // (8 * self.L)
        out = ctypes.create_string_buffer(len(digits))
        self._check(self._lib.fb_to_mont(digits, count, self.L, self._m, self._minv, self._r2, out))
        return out.raw

    def segment_products(self, table: bytes, idx, starts) -> bytes:
        """out[s] = prod of table[idx[i]] for i in [starts[s], starts[s+1]) (every segment non-empty)."""
        idx = np.ascontiguousarray(idx, dtype=np.int32)
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        if idx.ndim != 1 or starts.ndim != 1 or len(starts) < 1 or starts[0] != 0 or starts[-1] != len(idx):
            raise ValueError("segment starts must run from 0 to the number of indices")
        nseg = len(starts) - 1
        out = ctypes.create_string_buffer(8 * self.L * nseg)
        if nseg > 0:
            self._check(self._lib.fb_segprod(table, len(table) // (8 * self.L), idx.ctypes.data, len(idx),
                                             starts.ctypes.data, nseg, self.L, self._m, self._minv, out))
        return out.raw

    def values(self, table: bytes) -> list:
        count = len(table) // (8 * self.L)
        out = ctypes.create_string_buffer(8 * self.n64 * count)
        self._check(self._lib.fb_from_mont(table, count, self.L, self._m, self._minv, out, self.n64))
        return self._results(out)



class NativePowSec(_Modulus):
    """x^e mod m for many x and one secret exponent e (the key holder's decryption), constant-time in e."""

    def __init__(self, lib, mod, exponent):
        super().__init__(lib, mod)
        e = int(exponent)
        self._exp = e.to_bytes(max(1, (e.bit_length() + 7) // 8), "big")

    def pow_many(self, values) -> list:
        vals = self._digits(values)
        count = len(vals) // (8 * self.L)
        out = ctypes.create_string_buffer(8 * self.n64 * count)
        self._check(self._lib.fb_powm_sec_many(vals, count, self._exp, len(self._exp), self.L, self._m, self._minv,
                                               self._r2, out, self.n64))
        return self._results(out)


class NativeFixedBase(_Modulus):
    """One fixed-base table (rows of 256 entries: 8-bit digits) in Montgomery form (x 2^(52 L) mod m)."""

    def __init__(self, lib, tables, mod):
        if any(len(row) != 256 for row in tables):
            raise ValueError("the C kernel takes 8-bit windows (256 entries per row)")
        super().__init__(lib, mod)
        self.rows = len(tables)
        self._one = self._digits([(mpz(1) << self.shift) % self.mod])
        self._table = self._digits([(mpz(v) << self.shift) % self.mod for row in tables for v in row])

    def pow_many(self, exponents) -> list:
        """[prod_i table[i][byte i of e] mod m for e in exponents] (mpz)."""
        exps = list(exponents)
        digits = b"".join(int(e).to_bytes(self.rows, "little") for e in exps)
        nb = 8 * self.n64
        out = ctypes.create_string_buffer(nb * len(exps))
        self._check(self._lib.fb_pow_many(self._table, self.rows, self.L, self._m, self._minv, self._one, digits,
                                          len(exps), out, self.n64))
        return self._results(out)


def _checked(make, agrees, what: str):
    """``make(lib)``, trusted only if ``agrees(kernel)`` (its results equal ``what`` on test values); None when
    the kernel is not usable here, cannot take these arguments, or disagrees."""
    global _STATUS
    lib = _load()
    if lib is None:
        return None
    try:
        nat = make(lib)
    except ValueError:
        return None
    if not agrees(nat):
        _STATUS = f"off: the C kernel disagreed with {what}"
        return None
    return nat


def fixed_base(tables, mod, check) -> NativeFixedBase | None:
    """A :class:`NativeFixedBase` for ``tables`` mod ``mod``, checked against ``check(e)`` (the Python product)."""
    def agrees(nat):
        exps = [0, 1, (1 << (8 * nat.rows)) - 1] + [secrets.randbits(8 * nat.rows) for _ in range(13)]
        return nat.pow_many(exps) == [check(e) for e in exps]

    return _checked(lambda lib: NativeFixedBase(lib, tables, mod), agrees, "the Python product")


def products(mod) -> NativeProducts | None:
    """A :class:`NativeProducts` for values mod ``mod``, checked against gmpy2's products and powers of random
    values."""
    m = gmpy2.mpz(mod)

    def packs(nat):
        for widths in ([139, 139, 139], [7, 64, 1, 300], [5]):
            groups = [[gmpy2.mpz(secrets.randbelow(int(m))) for _ in widths] for _ in range(11)]
            want = []
            for gr in groups:
                acc = gr[-1]
                for c, w in zip(reversed(gr[:-1]), reversed(widths[:-1])):
                    acc = gmpy2.powmod(acc, gmpy2.mpz(1) << w, m) * c % m
                want.append(acc)
            if nat.horner_many(groups, widths) != want:
                return False
        return True

    def agrees(nat):
        if not packs(nat):
            return False
        vals = [gmpy2.mpz(secrets.randbelow(int(m))) for _ in range(40)]
        lens = [1, 2, 3, 17, 1, 5, 9, 1, 30, 4, 2]
        idx = [secrets.randbelow(len(vals)) for _ in range(sum(lens))]
        starts, want = [0], []
        for n_ in lens:
            acc = gmpy2.mpz(1)
            for i in idx[starts[-1]:starts[-1] + n_]:
                acc = acc * vals[i] % m
            want.append(acc)
            starts.append(starts[-1] + n_)
        return nat.values(nat.segment_products(nat.load(vals), idx, starts)) == want

    return _checked(lambda lib: NativeProducts(lib, mod), agrees, "gmpy2's products and powers")


def pow_sec(mod, exponent) -> NativePowSec | None:
    """A :class:`NativePowSec` for ``x^exponent mod mod``, checked against gmpy2's constant-time ``powmod_sec``."""
    m = gmpy2.mpz(mod)

    def agrees(nat):
        vals = [gmpy2.mpz(v) for v in (0, 1, int(m) - 1)] + [gmpy2.mpz(secrets.randbelow(int(m))) for _ in range(10)]
        return nat.pow_many(vals) == [gmpy2.powmod_sec(v, exponent, m) for v in vals]

    return _checked(lambda lib: NativePowSec(lib, mod, exponent), agrees, "gmpy2's powmod_sec")
