"""Per-tree time of the vertical protocol with a party's crypto on local worker processes and on a Dask cluster
(``--workers N`` against ``dask-local:1`` and ``dask-local:2``), on the FATE Hetero-SecureBoost benchmark's shape
at reduced rows: synthetic data (``treeflare.vertical.synthetic``, seed 0) with 30 active and 300 passive
features, binary GBDT, depth 5, 32 bins, one tree, 2048-bit Paillier, ``full`` randomness.

Both parties run in this process (``run_vertical``), each with its own pool of the arm's kind: a ``dask-local``
arm starts two local clusters (the active party's and the passive party's), each of N worker processes.  One key
is generated first and used by every arm (key generation is not part of a tree's time); each arm's pool start is
reported on its own (``start``).  Arms run in turn, ``--repeats`` rounds, medians reported; load average and
cores beside them.  The block ``vertical_dask`` of docs/vertical.md is written by this script only (``--write``).

The block ``vertical_dask_model`` is a model, not a measurement: the operation counts of the same tree (counted on
the plaintext oracle) and the dask-local:1 arm's measured phases, read back from the ``vertical_dask`` block, give
the per-tree time N workers per party would take (``--model-only`` writes it from the block as it stands).

    flock /tmp/treeflare-bench.lock python scripts/bench_vertical_dask.py --rows 20000 --write
    python scripts/bench_vertical_dask.py --rows 20000 --model-only
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH_BLOCKS = {"vertical_dask": "docs/vertical.md", "vertical_dask_model": "docs/vertical.md"}

from treeflare.crypto import PaillierKeyHolder  # noqa: E402
from bench_common import bench_settings, write_bench_block# noqa: E402
from treeflare.vertical import VerticalParams, compare_runs, run_vertical, synthetic  # noqa: E402

PHASES = ("encrypt", "decrypt", "split_search")
PASSIVE_PHASES = ("binning", "histogram", "cumulate", "compress")


def one_run(data, params, kh) -> dict:
    t = time.perf_counter()
    a, ps = run_vertical(data, params, key_holder=PaillierKeyHolder(kh.key))
    wall = time.perf_counter() - t
    (p,) = ps.values()
    row = {"total": wall, "tree": a.timings["tree_0"], "start": a.timings.get("workers_start", 0.0)}
    row.update({k: a.timings.get(k, 0.0) for k in PHASES})
    row.update({f"p_{k}": p.timings.get(k, 0.0) for k in PASSIVE_PHASES})
    return row, (a, ps)


def operation_counts(data, params) -> dict:
    """The operations of one tree, counted on the plaintext oracle (the mock cipher runs the same protocol on the
    same integers, so the counts are the encrypted run's): encryptions, decryptions, histogram multiplications,
    compression shifts, and the node histograms the passive computes (count and ciphertexts each)."""
    from treeflare.vertical import histo

    seen = {"nodes": 0, "cells": 0}
    orig = histo.HistEngine.histograms

    def counting(self, nodes):
        out = orig(self, nodes)
        seen["nodes"] += len(nodes)
        seen["cells"] = sum(self.nbins) * self.units
        return out

    histo.HistEngine.histograms = counting
    try:
        a, ps = run_vertical(data, VerticalParams(**{**params.to_dict(), "scheme": "mock", "workers": 1}))
    finally:
        histo.HistEngine.histograms = orig
    ops = a.ops()
    return {"encryptions": int(ops.get("encryptions", 0)), "decryptions": int(ops.get("decryptions", 0)),
            "multiplications": int(ops.get("additions", 0)) - int(ops.get("shifts", 0)),
            "shifts": int(ops.get("shifts", 0)), "nodes": seen["nodes"], "hist_cts": seen["cells"]}


def model_lines(one: dict, counts: dict, ns=(1, 2, 4, 8, 16, 32)) -> list:
    """Per-tree time for N workers per party, modelled from the 1-worker arm's measured phases and the operation
    counts: the parallel phases (encryption, decryption, histograms, compression) divided by N, the rest (split
    search, cumulative sums and messages in the parties' own processes) unchanged, plus the tree reduction's
    critical path: ceil(log2 N) merge levels of every node histogram (multiplications at the measured rate)."""
    import math

    par = one["encrypt"] + one["decrypt"] + one["p_histogram"] + one["p_compress"]
    serial = max(0.0, one["tree"] - par)
    t_mul = one["p_histogram"] / max(1, counts["multiplications"])
    out = ["| workers per party (N) | modelled per tree (s) | of which parallel phases | tree-reduction path |",
           "|---|---|---|---|"]
    for n in ns:
        red = math.ceil(math.log2(n)) * counts["nodes"] * counts["hist_cts"] * t_mul if n > 1 else 0.0
        out.append(f"| {n} | {serial + par / n + red:.1f} | {par / n:.1f} | {red:.1f} |")
    return out


def model_text(one: dict, counts: dict) -> str:
    return ("**A model, not a measurement**: what the operation counts of this tree (counted on the "
            f"plaintext oracle: {counts['encryptions']:,} encryptions, {counts['decryptions']:,} decryptions, "
            f"{counts['multiplications']:,} histogram multiplications, {counts['shifts']:,} compression shifts, "
            f"{counts['nodes']} node histograms of {counts['hist_cts']:,} ciphertexts) imply for N Dask workers "
            "per party, each on its own core, from the dask-local:1 arm's measured phase times in the table above: "
            "the encryption, decryption, histogram and compression phases divided by N; split search, cumulative "
            "sums and messages unchanged; plus the tree reduction's critical path (ceil(log2 N) levels of "
            "merging every node histogram, at the measured histogram rate). It ignores network transfer between "
            f"hosts (a node histogram is {counts['hist_cts'] * 512 / 1e6:.1f} MB at 2048 bits) and the per-shard "
            "cell overhead (each worker also multiplies its rows' joint cells, which matters once a node has fewer "
            "rows per worker than cells).\n\n" + "\n".join(model_lines(one, counts)))


def one_arm_from_block(page: Path) -> dict:
    """The dask-local:1 row of the ``vertical_dask`` block (this script's own table) as phase times."""
    text = page.read_text()
    block = text[text.index("<!-- bench:vertical_dask:start -->"):text.index("<!-- bench:vertical_dask:end -->")]
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "dask-local:1":
            vals = [float(c) for c in cells[1:10]]
            keys = ["tree", "start", *PHASES, *[f"p_{k}" for k in PASSIVE_PHASES]]
            return dict(zip(keys, vals))
    raise ValueError(f"{page}: no dask-local:1 row in the vertical_dask block")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arms", default="2,dask-local:1,dask-local:2",
                    help="comma-separated workers settings (default: 2 local processes, dask-local:1, dask-local:2)")
    ap.add_argument("--write", action="store_true", help="write the docs blocks (docs/vertical.md)")
    ap.add_argument("--model-only", action="store_true",
                    help="no timing: count the operations and write the model block from the vertical_dask block")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    data = synthetic(n=args.rows, n_test=200, active_features=30, passive_features=(300,), n_classes=2, seed=0)
    base = VerticalParams(model="gbdt", objective="binary", n_trees=1, max_depth=5, bins=32, key_bits=2048,
                          obfuscation="full").validate()
    if args.model_only:
        one = one_arm_from_block(REPO / BENCH_BLOCKS["vertical_dask"])
        text = model_text(one, operation_counts(data, base)) + (
            f"\n\nWritten by `scripts/bench_vertical_dask.py --rows {args.rows} --model-only` (operation counts at "
            f"{args.rows:,} rows; phase times from the dask-local:1 row above).")
        print(text)
        write_bench_block(REPO / BENCH_BLOCKS["vertical_dask_model"], "vertical_dask_model", text)
        return
    t = time.perf_counter()
    kh = PaillierKeyHolder.generate(2048, "full", allow_insecure=False)
    print(f"key generated in {time.perf_counter() - t:.1f} s (not counted)", flush=True)
    rows = {a: [] for a in arms}
    loads = []
    ref = None
    for r in range(args.repeats):
        for arm in arms:
            P = VerticalParams(**{**base.to_dict(), "workers": int(arm) if arm.isdigit() else arm}).validate()
            row, run = one_run(data, P, kh)
            loads.append(os.getloadavg()[0])
            if ref is None:
                ref = run
            row["same_model"] = compare_runs(ref, run)["identical"]
            rows[arm].append(row)
            print(f"round {r} {arm}: tree {row['tree']:.1f} s, load {loads[-1]:.2f}", flush=True)
    cols = ["tree", "start", *PHASES, *[f"p_{k}" for k in PASSIVE_PHASES]]
    head = ("| workers | per tree (s) | pool start (s) | encrypt | decrypt | split search | passive binning "
            "| passive histograms | passive cumulate | passive compress | same model |")
    lines = [head, "|" + "---|" * 11]
    for arm in arms:
        med = {c: statistics.median(x[c] for x in rows[arm]) for c in cols}
        same = all(x["same_model"] for x in rows[arm])
        label = f"{arm} local processes" if arm.isdigit() else arm
        lines.append(f"| {label} | {med['tree']:.1f} | {med['start']:.1f} | "
                     + " | ".join(f"{med[c]:.1f}" for c in cols[2:]) + f" | {'yes' if same else 'NO'} |")
    st = bench_settings(rows=args.rows, repeats=args.repeats, seed=0, randomness="full", key_bits=2048,
                        native=__import__("treeflare.crypto.native", fromlist=["status"]).status())
    text = "\n".join(lines) + (
        f"\n\nFATE-like shape at {args.rows:,} rows (synthetic, seed 0): active 30 features, passive 300, binary "
        f"GBDT, depth 5, 32 bins, 1 tree; medians of {args.repeats} round(s); load average during the runs "
        f"{min(loads):.1f}-{max(loads):.1f} on {st['cores']} cores; C kernel {st['native']}; commit {st['commit']}, "
        f"{st['time']}.  Both parties in one process, each with its own pool (a dask-local arm starts two local "
        f"clusters).  Written by `scripts/bench_vertical_dask.py --rows {args.rows}"
        f"{' --repeats ' + str(args.repeats) if args.repeats != 1 else ''}`.")
    model = None
    if "dask-local:1" in arms:
        one = {c: statistics.median(x[c] for x in rows["dask-local:1"]) for c in cols}
        model = model_text(one, operation_counts(data, base)) + (
            f"\n\nWritten by `scripts/bench_vertical_dask.py --rows {args.rows}` with the table above.")
    print(text)
    if model:
        print(model)
    if args.write:
        write_bench_block(REPO / BENCH_BLOCKS["vertical_dask"], "vertical_dask", text)
        if model:
            write_bench_block(REPO / BENCH_BLOCKS["vertical_dask_model"], "vertical_dask_model", model)


if __name__ == "__main__":
    main()
