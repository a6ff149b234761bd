"""What each Paillier key size costs: key generation, single-core encryption (both randomness modes),
decryption and addition rates, ciphertext size and packing capacity, at 2048, 3072 and 4096 bits (the sizes
the jobs accept).  Checks the vertical job's target of >= 2,000 encryptions per second per core at 2048 bits
with the default (`full`) randomness.  Medians of ``--bursts`` bursts (and of ``--keygens`` key generations);
the machine is shared, so the load average is recorded beside every figure.  Writes
scripts/results/paillier_keys.{json,md} and the docs block ``paillier_keys``.

    taskset -c 1 python scripts/bench_paillier.py [--sizes 2048,3072,4096] [--bursts 5] [--keygens 3]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"paillier_keys": "docs/vertical.md"}

from treeflare.crypto import PaillierPrivateKey, SlotLayout, security_bits  # noqa: E402
from treeflare.console import format_table  # noqa: E402
from treeflare.files import write_json_atomic, write_text_atomic  # noqa: E402
from bench_common import bench_settings, write_bench_block  # noqa: E402


def rate(fn, n: int, bursts: int) -> float:
    runs = []
    for _ in range(bursts):
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        runs.append(n / (time.perf_counter() - t))
    return statistics.median(runs)


def measure(bits: int, bursts: int, keygens: int, n: int) -> dict:
    gen = []
    key = None
    for _ in range(keygens):
        t = time.perf_counter()
        key = PaillierPrivateKey.generate(bits, "full", allow_insecure=False)
        gen.append(time.perf_counter() - t)
    vals = [secrets.randbits(bits - 8) for _ in range(n)]
    enc_full = rate(lambda i: key.encrypt(vals[i]), n, bursts)
    t = time.perf_counter()
    djn = PaillierPrivateKey.generate(bits, "djn", allow_insecure=False)
    gen_djn = time.perf_counter() - t
    enc_djn = rate(lambda i: djn.encrypt(vals[i]), n, bursts)
    cts = [key.encrypt(v) for v in vals[:64]]
    dec = rate(lambda i: key.decrypt(cts[i % 64]), max(30, n // 4), bursts)
    pub = key.public
    add = rate(lambda i: pub.add(cts[i % 64], cts[(i + 1) % 64]), 20 * n, bursts)
    p = 53
    lay = SlotLayout.for_channels([-(1 << p), 0], [1 << p, 1 << (p - 2)], 100_000)
    return {"key_bits": bits, "security_bits": security_bits(bits), "keygen_s_median": statistics.median(gen),
            "keygen_s_runs": gen, "keygen_djn_s": gen_djn, "enc_per_s_full": enc_full, "enc_per_s_djn": enc_djn,
            "dec_per_s": dec, "add_per_s": add, "ciphertext_bytes": pub.ct_bytes,
            "gbdt_pairs_per_ct_100k_rows_p53": pub.usable_bits // lay.total_width,
            "loadavg_1m_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2048,3072,4096")
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--keygens", type=int, default=3)
    ap.add_argument("--values", type=int, default=600, help="operations per burst")
    ap.add_argument("--out", default=str(REPO / "scripts" / "results" / "paillier_keys"))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the docs block")
    args = ap.parse_args()
    if args.values < 64:
        ap.error("--values must be >= 64 (additions cycle over 64 ciphertexts)")
    settings = bench_settings(argv=sys.argv[1:], bursts=args.bursts, keygens=args.keygens, values=args.values,
                              process="one process, one core")
    rows = []
    for bits in (int(b) for b in args.sizes.split(",")):
        r = measure(bits, args.bursts, args.keygens, args.values)
        rows.append(r)
        print(f"{bits}: {r}", flush=True)
    base = next((r for r in rows if r["key_bits"] == 2048), None)  # the target and the ratios are about 2048 bits
    table = [[r["key_bits"], r["security_bits"], f"{r['keygen_s_median']:.1f} ({', '.join(f'{v:.1f}' for v in r['keygen_s_runs'])})",
              f"{r['enc_per_s_full']:,.0f}", f"{r['enc_per_s_djn']:,.0f}", f"{r['dec_per_s']:,.0f}", f"{r['add_per_s']:,.0f}",
              f"{base['enc_per_s_full'] / r['enc_per_s_full']:.1f}x" if base else "not measured", r["ciphertext_bytes"],
              r["gbdt_pairs_per_ct_100k_rows_p53"], f"{r['loadavg_1m_after']:.1f}"]
             for r in rows]
    hdr = ["key bits", "security bits", "key generation s, median (runs)", "enc/s, full", "enc/s, djn", "dec/s",
           "add/s", "time per encryption vs 2048", "ciphertext bytes", "GBDT (g,h) pairs per ciphertext (100k rows)",
           "load average"]
    md = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)] + ["| " + " | ".join(map(str, r)) + " |" for r in table]
    verdict = ("not measured (2048 bits not in --sizes)" if base is None else
               f"{'met' if base['enc_per_s_full'] >= 2000 else 'MISSED'} ({base['enc_per_s_full']:,.0f}/s)")
    note = (f"Single core, median of {args.bursts} bursts of {args.values} operations, key generation median of "
            f"{args.keygens} (safe primes for `full` randomness; its time varies widely between draws). Measured "
            f"{settings['time']} at commit {settings['commit']}, load average {settings['loadavg']} at start. "
            f"Encryption target >= 2,000/s per core at 2048 bits with `full` randomness: "
            f"{verdict}. The jobs accept 2048, 3072 and 4096 "
            "bits only (smaller keys with --allow-insecure-key, for tests).")
    print(format_table(hdr, table))
    print(note)
    out = Path(args.out)
    write_json_atomic(out.with_suffix(".json"), {"settings": settings, "rows": rows})
    write_text_atomic(out.with_suffix(".md"), "# Paillier key sizes\n\n" + "\n".join(md) + "\n\n" + note + "\n")
    if not args.no_docs:
        write_bench_block(REPO / BENCH_BLOCKS["paillier_keys"], "paillier_keys", "\n".join(md) + "\n\n" + note)


if __name__ == "__main__":
    main()
