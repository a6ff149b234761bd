"""What one modular product and one modular squaring cost on this CPU, in every arithmetic the vertical job can run
and in two reference libraries: the floor under any kernel on 64-bit limbs.

The vertical job's time is almost all products and squarings of 4096-bit numbers (mod n^2 of a 2048-bit key: the
passive party's histogram sums and compression) and of 2048-bit ones (mod p^2 and q^2: the key holder's decryption;
Okamoto-Uchiyama's n).  Arms, each in its own process, interleaved, ``--repeats`` times (medians):

* ``gmpy2``: the Python path (``TREEFLARE_NATIVE=0``): ``a * b % m`` per product, ``powmod(a, 2^w, m)`` per w
  squarings, as ``pub.add`` and ``pub.shift`` run them;
* ``portable``, ``portable-c`` and ``ifma``: the package's C kernels (``TREEFLARE_NATIVE=portable`` / ``ifma``; the
  portable kernel as this CPU picks it, mulx/adcx/adox assembly on x86-64 with BMI2 and ADX, and its C path,
  ``TREEFLARE_PORTABLE_ADX=0``, which aarch64 and older x86-64 run), through the calls
  the histogram engine makes (``segment_products``: chains of products; ``horner_mont``: w squarings per field),
  many at once (IFMA: eight lanes);
* ``gmp-mpn``: GMP's public mpn layer, the library inside gmpy2, called from C with no interpreter
  (``mpn_mul_n`` / ``mpn_sqr`` then ``mpn_tdiv_qr``): what gmpy2 costs without Python;
* ``openssl``: OpenSSL's ``BN_mod_mul_montgomery`` (libcrypto's mulx/adcx/adox assembly on x86-64), called from C.

The two reference arms are compiled here with the system C compiler against the libraries already loaded by
gmpy2 and Python's ssl module; an arm that cannot run says why.  Writes scripts/results/vertical_bench/modmul.json
and the docs block ``vertical_modmul``.

    python scripts/bench_modmul.py [--repeats 5] [--bits 2048,4096]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "custom"))
sys.path.insert(0, str(REPO / "scripts"))
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"vertical_modmul": "docs/vertical.md"}

from bench_common import bench_settings, cpu_model, write_bench_block  # noqa: E402
from treeflare.files import write_json_atomic  # noqa: E402

ARMS = ["gmpy2", "portable", "portable-c", "ifma", "gmp-mpn", "openssl"]
LABELS = {"gmpy2": "gmpy2 from Python (the Python path, TREEFLARE_NATIVE=0)",
          "portable": "treeflare portable kernel, 64-bit limbs, as this CPU picks it (TREEFLARE_NATIVE=portable)",
          "portable-c": "treeflare portable kernel, its C path (TREEFLARE_PORTABLE_ADX=0: what aarch64 and x86-64 "
                        "without ADX run)",
          "ifma": "treeflare AVX-512 IFMA C kernel (8 lanes of 52-bit digits; TREEFLARE_NATIVE=ifma)",
          "gmp-mpn": "GMP mpn from C (gmpy2's library: mpn_mul_n / mpn_sqr, mpn_tdiv_qr)",
          "openssl": "OpenSSL libcrypto from C (BN_mod_mul_montgomery: mulx/adcx/adox assembly on x86-64)"}
# the package's kernels: each arm's environment, and how the status its process reports must start
KERNEL_ARMS = {"portable": ({"TREEFLARE_NATIVE": "portable"}, "on (portable"),
               "portable-c": ({"TREEFLARE_NATIVE": "portable", "TREEFLARE_PORTABLE_ADX": "0"},
                              "on (portable 64-bit C;"),
               "ifma": ({"TREEFLARE_NATIVE": "ifma"}, "on (AVX-512 IFMA)")}
SQUARINGS = 2000        # squarings per field in the squaring measurements (a compression step of 15 fields)

# One C file for both reference libraries, loaded with dlopen from the paths given (no headers needed: the
# prototypes below are GMP's and OpenSSL 3's public ones).  argv: gmp|openssl LIB BITS MOD A B N (hex numbers).
HARNESS = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef uint64_t u64;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) { fprintf(stderr, "missing symbol %s\n", name); exit(3); }
    return p;
}
static void limbs(const char *hex, u64 *out, long L) {   /* hex -> little-endian 64-bit limbs */
    memset(out, 0, 8 * L);
    long n = strlen(hex);
    for (long i = 0; i < n; i++) {
        char c = hex[n - 1 - i];
        u64 v = c <= '9' ? c - '0' : (c | 32) - 'a' + 10;
        out[i / 16] |= v << (4 * (i % 16));
    }
}
static void print_limbs(const u64 *x, long L) {          /* big-endian hex */
    for (long i = L - 1; i >= 0; i--) printf("%016llx", (unsigned long long)x[i]);
    printf("\n");
}
int main(int argc, char **argv) {
    if (argc != 8) return 2;
    void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
    long bits = atol(argv[3]), N = atol(argv[7]), L = (bits + 63) / 64;
    double tm, ts;
    if (!strcmp(argv[1], "gmp")) {
        void (*mul_n)(u64 *, const u64 *, const u64 *, long) = sym(h, "__gmpn_mul_n");
        void (*sqr)(u64 *, const u64 *, long) = sym(h, "__gmpn_sqr");
        void (*tdiv_qr)(u64 *, u64 *, long, const u64 *, long, const u64 *, long) = sym(h, "__gmpn_tdiv_qr");
        u64 *m = calloc(L, 8), *a = calloc(L, 8), *b = calloc(L, 8), *t = calloc(2 * L, 8), *q = calloc(L + 1, 8);
        limbs(argv[4], m, L); limbs(argv[5], a, L); limbs(argv[6], b, L);
        double t0 = now();
        for (long i = 0; i < N; i++) { mul_n(t, a, b, L); tdiv_qr(q, a, 0, t, 2 * L, m, L); }
        tm = (now() - t0) / N;
        print_limbs(a, L);                                    /* a b^N mod m: checked by the Python side */
        t0 = now();
        for (long i = 0; i < N; i++) { sqr(t, a, L); tdiv_qr(q, a, 0, t, 2 * L, m, L); }
        ts = (now() - t0) / N;
        print_limbs(a, L);                                    /* then ^(2^N) */
    } else {
        void *(*ctx_new)(void) = sym(h, "BN_CTX_new");
        void *(*mont_new)(void) = sym(h, "BN_MONT_CTX_new");
        int (*hex2bn)(void **, const char *) = sym(h, "BN_hex2bn");
        int (*mont_set)(void *, const void *, void *) = sym(h, "BN_MONT_CTX_set");
        int (*to_mont)(void *, const void *, void *, void *) = sym(h, "BN_to_montgomery");
        int (*mul_mont)(void *, const void *, const void *, void *, void *) = sym(h, "BN_mod_mul_montgomery");
        int (*from_mont)(void *, const void *, void *, void *) = sym(h, "BN_from_montgomery");
        char *(*bn2hex)(const void *) = sym(h, "BN_bn2hex");
        void *(*bn_new)(void) = sym(h, "BN_new");
        void *ctx = ctx_new(), *mont = mont_new(), *m = NULL, *a = NULL, *b = NULL, *r = bn_new();
        if (!hex2bn(&m, argv[4]) || !hex2bn(&a, argv[5]) || !hex2bn(&b, argv[6]) || !mont_set(mont, m, ctx) ||
            !to_mont(a, a, mont, ctx) || !to_mont(b, b, mont, ctx)) return 4;
        double t0 = now();
        for (long i = 0; i < N; i++) if (!mul_mont(a, a, b, mont, ctx)) return 5;
        tm = (now() - t0) / N;
        if (!from_mont(r, a, mont, ctx)) return 6;
        printf("%s\n", bn2hex(r));
        t0 = now();
        for (long i = 0; i < N; i++) if (!mul_mont(a, a, a, mont, ctx)) return 5;
        ts = (now() - t0) / N;
        if (!from_mont(r, a, mont, ctx)) return 6;
        printf("%s\n", bn2hex(r));
    }
    printf("%.6f %.6f\n", tm * 1e6, ts * 1e6);
    return 0;
}
"""


def _operands(bits: int, seed: int) -> tuple:
    rng = random.Random(seed)
    m = rng.getrandbits(bits) | (1 << (bits - 1)) | 1
    return m, rng.randrange(m), rng.randrange(m)


def _loaded_library(fragment: str) -> str | None:
    """The path of a shared library this process has mapped whose file name contains ``fragment``."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if fragment in Path(path).name:
            return path
    return None


def measure_python(bits: int, n: int) -> dict:
    import gmpy2

    m, a, b = (gmpy2.mpz(v) for v in _operands(bits, bits))
    vals = [a, b, (a * b) % m, (a + b) % m]
    t = time.perf_counter()
    acc = a
    for i in range(n):
        acc = acc * vals[i & 3] % m
    prod = (time.perf_counter() - t) / n
    reps = max(1, n // SQUARINGS)
    t = time.perf_counter()
    for _ in range(reps):
        acc = gmpy2.powmod(acc, gmpy2.mpz(1) << SQUARINGS, m)
    sq = (time.perf_counter() - t) / (reps * SQUARINGS)
    return {"product_us": prod * 1e6, "squaring_us": sq * 1e6}


def measure_kernel(arm: str, bits: int, n: int) -> dict:
    import numpy as np

    from treeflare.crypto import native

    m, a, b = _operands(bits, bits)
    nat = native.products(m)
    status = native.status()
    if nat is None or not status.startswith(KERNEL_ARMS[arm][1]):
        return {"unavailable": f"this CPU or build runs no {arm} kernel ({status})"}
    rng = np.random.default_rng(bits)
    table = nat.load([(a * (i + 1) + b) % m for i in range(256)])
    segs = 64                                          # many chains at once: every IFMA lane busy
    idx = rng.integers(0, 256, size=segs * max(2, n // segs)).astype(np.int32)
    starts = np.linspace(0, idx.size, segs + 1).astype(np.int64)
    t = time.perf_counter()
    nat.segment_products(table, idx, starts)
    prod = (time.perf_counter() - t) / (idx.size - segs)
    groups = 64
    reps = max(1, n // (groups * SQUARINGS))
    fields = table[:groups * 2 * 8 * nat.L]
    t = time.perf_counter()
    for _ in range(reps):
        nat.horner_mont(fields, [SQUARINGS, 1])       # per group: SQUARINGS squarings and one product
    sq = ((time.perf_counter() - t) / reps - groups * prod) / (groups * SQUARINGS)
    return {"product_us": prod * 1e6, "squaring_us": sq * 1e6, "kernel": status}


def measure_reference(arm: str, bits: int, n: int, workdir: Path) -> dict:
    import gmpy2  # noqa: F401  (maps gmpy2's libgmp into this process, so its path can be found)
    import ssl  # noqa: F401  (likewise Python's libcrypto)

    lib = _loaded_library("libgmp" if arm == "gmp-mpn" else "libcrypto")
    if lib is None:
        return {"unavailable": f"no shared {'libgmp' if arm == 'gmp-mpn' else 'libcrypto'} loaded by Python here"}
    exe = workdir / "modmul_harness"
    if not exe.exists():
        src = workdir / "modmul_harness.c"
        src.write_text(HARNESS)
        try:
            subprocess.run(["cc", "-O2", "-o", str(exe), str(src), "-ldl"], check=True, capture_output=True,
                           timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"unavailable": f"the C harness did not build ({type(exc).__name__})"}
    m, a, b = _operands(bits, bits)
    proc = subprocess.run([str(exe), "gmp" if arm == "gmp-mpn" else "openssl", lib, str(bits),
                           format(m, "x"), format(a, "x"), format(b, "x"), str(n)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"unavailable": f"the harness failed ({proc.returncode}: {proc.stderr.strip()[:200]})"}
    lines = proc.stdout.splitlines()
    if len(lines) < 3:
        return {"unavailable": "the harness printed no results"}
    *values, times = lines[-3:]
    # the harness's own results, checked: a b^N mod m after the products, then its 2^N-th power (a number a wrong
    # call would also produce, only faster, is refused)
    after_products = a * pow(b, n, m) % m
    want = [after_products, pow(after_products, 1 << n, m)]
    try:
        got = [int(v, 16) for v in values]
    except ValueError:
        got = []
    if got != want:
        return {"unavailable": "the harness's results differ from Python's (a wrong call into the library)"}
    prod, sq = (float(v) for v in times.split())
    return {"product_us": prod, "squaring_us": sq, "library": Path(lib).name}


def run_arm(arm: str, bits: int, n: int, workdir: Path) -> dict:
    """One measurement in a fresh process (the kernel is chosen once per process, from TREEFLARE_NATIVE)."""
    env = {**os.environ, **KERNEL_ARMS.get(arm, ({"TREEFLARE_NATIVE": "0"},))[0]}
    proc = subprocess.run([sys.executable, __file__, "--one-arm", arm, "--bits", str(bits), "--ops", str(n),
                           "--one-arm-workdir", str(workdir)], capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        return {"unavailable": f"the arm's process failed: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cell(rows, arm, bits, key):
    vals = [r[key] for r in rows if r["arm"] == arm and r["bits"] == bits and key in r]
    return statistics.median(vals) if vals else None


def render(results: dict) -> str:
    settings, rows = results["settings"], results["rows"]
    bits_list = settings["bits"]
    head = ["arithmetic"] + [f"{k} at {b} bits, us" for b in bits_list for k in ("product", "squaring")]
    head += [f"x gmpy2 at {bits_list[-1]} bits (product, squaring)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = {k: _cell(rows, "gmpy2", bits_list[-1], k) for k in ("product_us", "squaring_us")}
    for arm in settings["arms"]:
        why = next((r["unavailable"] for r in rows if r["arm"] == arm and "unavailable" in r), None)
        cells = []
        for b in bits_list:
            for k in ("product_us", "squaring_us"):
                v = _cell(rows, arm, b, k)
                cells.append("-" if v is None else f"{v:.2f}")
        p, s = _cell(rows, arm, bits_list[-1], "product_us"), _cell(rows, arm, bits_list[-1], "squaring_us")
        ratio = (f"{p / base['product_us']:.2f}, {s / base['squaring_us']:.2f}"
                 if None not in (p, s) and None not in base.values() else "-")
        kernel = next((r["kernel"] for r in rows if r["arm"] == arm and "kernel" in r), None)
        label = LABELS[arm] + (f": {kernel}" if kernel else "") + (f" (not run: {why})" if why and p is None else "")
        lines.append("| " + " | ".join([label] + cells + [ratio]) + " |")
    s = settings
    need = (f" The vertical job's per-tree time is these operations almost entirely (scripts/bench_vertical.py's "
            f"phase timings), so a kernel at most 0.4x the Python path per tree (issue 38) needs about 0.4x gmpy2's "
            f"per-operation time at {bits_list[-1]} bits: {0.4 * base['product_us']:.2f} us per product and "
            f"{0.4 * base['squaring_us']:.2f} us per squaring." if None not in base.values() else "")
    return (f"**One modular product and squaring, per arithmetic** (one core per arm, arms interleaved, median of "
            f"{s['repeats']} runs of {s['ops']:,} operations each; random odd moduli of full size, fixed seeds; "
            f"run {s['time']}, commit {s['commit']}, {s['cpu']}, load average {s['loadavg']} at start; "
            f"`scripts/bench_modmul.py --repeats {s['repeats']}`). The IFMA kernel's figures are per product with "
            f"its eight lanes busy (throughput).{need}\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bits", default="2048,4096")
    ap.add_argument("--ops", type=int, default=40_000, help="operations per measurement")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--out", default=str(REPO / "scripts/results/vertical_bench/modmul.json"))
    ap.add_argument("--one-arm", help=argparse.SUPPRESS)
    ap.add_argument("--one-arm-workdir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    bits_list = [int(b) for b in a.bits.split(",")]
    if a.one_arm:                                       # one measurement, in this (fresh) process
        bits, wd = bits_list[0], Path(a.one_arm_workdir)
        if a.one_arm == "gmpy2":
            out = measure_python(bits, a.ops)
        elif a.one_arm in KERNEL_ARMS:
            out = measure_kernel(a.one_arm, bits, a.ops)
        else:
            out = measure_reference(a.one_arm, bits, a.ops, wd)
        print(json.dumps(out))
        return 0
    arms = [x for x in a.arms.split(",") if x]
    if unknown := set(arms) - set(ARMS):
        ap.error(f"unknown arms: {', '.join(sorted(unknown))} (known: {', '.join(ARMS)})")
    settings = bench_settings(repeats=a.repeats, ops=a.ops, bits=bits_list, arms=arms, cpu=cpu_model())
    rows = []
    with tempfile.TemporaryDirectory(prefix="treeflare-modmul-") as wd:
        for rep in range(a.repeats):
            for bits in bits_list:
                for arm in arms:
                    r = run_arm(arm, bits, a.ops, Path(wd))
                    rows.append({"arm": arm, "bits": bits, "repeat": rep, **r})
                    shown = ("not run: " + r["unavailable"] if "unavailable" in r else
                             f"product {r['product_us']:.2f} us, squaring {r['squaring_us']:.2f} us")
                    print(f"[{rep + 1}/{a.repeats}] {bits} bits {arm}: {shown}", flush=True)
    results = {"settings": settings, "rows": rows}
    write_json_atomic(Path(a.out), results)
    md = render(results)
    print(md)
    if not a.no_docs:
        write_bench_block(REPO / BENCH_BLOCKS["vertical_modmul"], "vertical_modmul", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
