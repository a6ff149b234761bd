"""Single-core Paillier rates at a key size: encryptions, decryptions and additions per second.

Checks the vertical job's target of at least 1,000 encryptions per second per core at 2048 bits.
Run it pinned to one core; the machine is shared, so it prints the median of several bursts.

    taskset -c 1 python scripts/bench_paillier.py [--key-bits 2048] [--bursts 5] [--values 1500]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time

from treeflare.crypto import make_key_holder
from treeflare.reporting import format_table


def rate(fn, n: int, bursts: int) -> tuple[float, float]:
    runs = []
    for _ in range(bursts):
        t = time.perf_counter()
        fn()
        runs.append(n / (time.perf_counter() - t))
    return statistics.median(runs), max(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--key-bits", type=int, default=2048)
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--values", type=int, default=1500)
    args = p.parse_args()
    rows = []
    for obfuscation in ("full", "djn"):
        t = time.perf_counter()
        holder = make_key_holder("paillier", args.key_bits, obfuscation=obfuscation)
        keygen = time.perf_counter() - t
        values = [secrets.randbits(args.key_bits - 250) for _ in range(args.values)]
        enc_med, enc_best = rate(lambda: holder.encrypt_many(values, workers=1), len(values), args.bursts)
        cts = holder.encrypt_many(values[:300], workers=1)
        dec_med, _ = rate(lambda: holder.decrypt_many(cts, workers=1), len(cts), args.bursts)
        pub = holder.public
        add_med, _ = rate(lambda: [pub.add(a, b) for a, b in zip(cts, reversed(cts))], len(cts), args.bursts)
        rows.append([obfuscation, f"{keygen:.1f}", round(enc_med), round(enc_best), round(dec_med), round(add_med)])
    print(f"Paillier {args.key_bits} bits, one process, median of {args.bursts} bursts "
          f"(load average {os.getloadavg()[0]:.2f})")
    print(format_table(["randomness", "keygen s", "enc/s median", "enc/s best", "dec/s", "add/s"], rows))


if __name__ == "__main__":
    main()
