"""The vertical job as a CPU without AVX-512 IFMA runs it, beside this CPU's IFMA kernel, at the peers' shapes
(issue 38): for each shape and scheme, the same run measures the IFMA arm (``TREEFLARE_NATIVE=ifma``: what this
CPU picks) and the portable arm (``TREEFLARE_NATIVE=portable``: what x86-64 before Zen 4 or Ice Lake, and aarch64,
pick), interleaved, each party in its own process (``scripts/bench_vertical.py``'s ``split_run``), and checks both
against the plaintext oracle.  Targets: at the FATE shape (100,000 rows) the portable arm within 2x of the IFMA arm
per tree; at the a9a shape the portable OU arm within FedTree's published 5.25 s per tree.

Writes scripts/results/vertical_bench/noifma.json (and .md) and the README block ``vertical_noifma``.

    flock /tmp/treeflare-bench.lock python scripts/bench_vertical_noifma.py [--shapes a9a,fate]
        [--schemes ou32,paillier] [--repeats a9a=3,fate=1] [--trees 1]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"vertical_noifma": "README.md"}

import bench_vertical as bv  # noqa: E402
from bench_common import bench_settings, cpu_model, write_bench_block  # noqa: E402
from treeflare.files import write_json_atomic, write_text_atomic  # noqa: E402
from treeflare.vertical import VerticalParams  # noqa: E402

# scheme arm -> (label, parameters); the arm names with a kernel suffix are bench_vertical.ARM_NATIVE's
SCHEMES = {"ou32": ("Okamoto-Uchiyama, 32-bit fixed point (--precision 32)", dict(scheme="ou", precision=32)),
           "paillier": ("Paillier, 53-bit fixed point (the default)", {})}
KERNELS = ("ifma", "portable")
RATIO_TARGET = {"fate": 2.0}                          # portable / IFMA per tree, at most (issue 38)
ABSOLUTE_TARGET = {("a9a", "ou32"): (5.25, "FedTree-Verti+HE's published 5.25 s per tree")}


def measure(args, log, save) -> list:
    tmp = Path(tempfile.mkdtemp(prefix="treeflare-noifma-"))
    try:
        code = None if args.code_ref == "worktree" else bv.extract_legacy(args.code_ref, tmp / "measured")
        shapes = {s[0]: s for s in bv.peers_shapes(argparse.Namespace(tiny=args.tiny, quick=args.tiny))}
        rows = []
        for name in args.shapes.split(","):
            name, desc, factory, over = shapes[name]
            dpath = factory(tmp)
            n_train = int(bv._meta(dpath)["n_train"])
            for scheme in args.schemes.split(","):
                label, o = SCHEMES[scheme]
                P = VerticalParams(key_bits=args.key_bits, obfuscation="full", allow_insecure_key=args.key_bits < 2048,
                                   n_trees=args.trees, workers=2, **over, **o)
                orc = bv.split_run(dpath, replace(P, scheme="mock", workers=1), tmp, code)
                pair = [{"section": "noifma", "workload": name, "description": desc, "scheme_arm": scheme,
                         "kernel_arm": k, "arm": f"{scheme}_{k}", "arm_label": f"{label}, {k}",
                         "precision": P.precision, "cpu": cpu_model(), "n_train": n_train, "trees_per_run": P.n_trees,
                         "depth": P.max_depth, "bins": P.bins, "key_bits": P.key_bits, "workers": P.workers,
                         "target_s_per_tree": None} for k in KERNELS]
                bv.interleaved_runs(pair, bv.repeats_for(args.repeats, name),
                                    lambda arm: bv.split_run(dpath, P, tmp, code, arm=arm), orc,
                                    lambda m: log(f"{name} {m}"))
                rows += pair
                save(rows)
        return rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(res: dict) -> str:
    """The README block: per shape and scheme, the IFMA and portable arms of the same run, and the targets."""
    S, rows = res["settings"], res["rows"]
    hdr = ["shape", "scheme", "IFMA kernel, s per tree (this CPU)", "portable kernel, s per tree (a CPU without IFMA)",
           "portable / IFMA", "target", "met", "identical to oracle (IFMA, portable)", "load avg per run"]
    tab = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for i in range(0, len(rows), 2):
        a, b = rows[i], rows[i + 1]
        shape, scheme = a["workload"], a["scheme_arm"]

        def cell(r):
            if not r.get("runs"):
                return f"failed: {r.get('failed')}"
            return (f"{bv.fmt(r['per_tree_s'], 2)} ({', '.join(f'{t:.2f}' for t in r['tree_s_all'])}; "
                    f"{r['native_kernel']})")

        def same(r):
            return str(r.get("identical_to_oracle")) + (f" ({r['oracle_note']})" if r.get("oracle_note") else "")

        ok = a.get("runs") and b.get("runs")
        q = b["per_tree_s"] / a["per_tree_s"] if ok else None
        target, met = "", ""
        if shape in RATIO_TARGET:
            target = f"portable <= {RATIO_TARGET[shape]:g}x IFMA"
            met = "" if q is None else "met" if q <= RATIO_TARGET[shape] else "**not met**"
        if (shape, scheme) in ABSOLUTE_TARGET:
            lim, what = ABSOLUTE_TARGET[(shape, scheme)]
            target = f"portable <= {lim:g} s ({what})"
            met = "" if not b.get("runs") else "met" if b["per_tree_s"] <= lim else "**not met**"
        loads = "; ".join(", ".join(f"{x:.1f}" for x in r.get("loadavg_runs", [])) for r in (a, b))
        tab.append("| " + " | ".join([
            a["description"], SCHEMES[scheme][0], cell(a), cell(b), "" if q is None else f"{q:.2f}x", target, met,
            f"{same(a)}, {same(b)}", loads]) + " |")
    part = " **Stopped before every arm ran** (the rows are those it measured)." if res.get("partial") else ""
    return (f"**Without AVX-512 IFMA, at the peers' shapes** (run {S['time']}, commit {S['commit']}, {S['cores']} cores "
            f"({S['cpu']}) shared with other work, load average {S['loadavg']} at start; "
            f"`{' '.join(['scripts/bench_vertical_noifma.py', *S['argv']])}`).{part} Both arms in one run, interleaved, "
            f"each party in its own process with 2 local worker processes, {S['key_bits']}-bit keys, `full` "
            f"randomness, {S['trees']} tree(s) per run; seconds per tree = the median of every tree (the figures in "
            f"brackets, then the kernel as the run reported it); key generation and binning, once per run, are not in "
            f"them. The portable arm is this CPU forced to the kernel a CPU without IFMA runs "
            f"(`TREEFLARE_NATIVE=portable`), not another machine: on x86-64 with BMI2 and ADX (since Broadwell and Zen "
            f"1) its mulx/adcx/adox path, as here; aarch64 and older x86-64 run its C path, 12-25% slower per "
            f"operation (`scripts/bench_modmul.py`'s table in docs/vertical.md).\n\n" + "\n".join(tab) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="a9a,fate")
    ap.add_argument("--schemes", default="ou32,paillier")
    ap.add_argument("--repeats", default="a9a=3,fate=1", help="runs per arm: N, or SHAPE=N,... (default a9a=3,fate=1)")
    ap.add_argument("--trees", type=int, default=1, help="trees per run (default 1)")
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--code-ref", default="HEAD",
                    help="the commit measured (git archive; default HEAD), or 'worktree'")
    ap.add_argument("--tiny", action="store_true", help="a few hundred rows (the smoke test's size; no docs block)")
    ap.add_argument("--results-dir", default=str(REPO / "scripts" / "results" / "vertical_bench"))
    ap.add_argument("--render-only", action="store_true",
                    help="no runs: write the page and the README block again from the stored results")
    a = ap.parse_args(argv)
    if bad := set(a.shapes.split(",")) - {"a9a", "fate"} or set(a.schemes.split(",")) - set(SCHEMES):
        ap.error(f"unknown shapes or schemes: {sorted(bad)}")
    d = Path(a.results_dir)
    d.mkdir(parents=True, exist_ok=True)
    name = "noifma_tiny" if a.tiny else "noifma"

    def publish(res: dict) -> str:
        md = render(res)
        write_text_atomic(d / f"{name}.md", "# Vertical benchmark without AVX-512 IFMA\n\n" + md)
        return md

    if not a.render_only:
        commit = "working tree" if a.code_ref == "worktree" else subprocess.run(
            ["git", "rev-parse", "--short", a.code_ref], cwd=REPO, capture_output=True, text=True,
            check=True).stdout.strip()
        res = {"settings": {**bench_settings(argv=sys.argv[1:] if argv is None else list(argv), key_bits=a.key_bits,
                                             trees=a.trees, repeats=a.repeats, cpu=cpu_model()), "commit": commit},
               "rows": []}

        def save(rows, done=False):
            # after every pair of arms, so that a run stopped midway keeps what it measured (marked partial), page too
            res.update(rows=rows, loadavg_end=[round(x, 2) for x in os.getloadavg()], partial=not done)
            write_json_atomic(d / f"{name}.json", res)
            publish(res)

        save(measure(a, lambda m: print(m, flush=True), save), done=True)
    md = publish(json.loads((d / f"{name}.json").read_text()))
    print(md)
    if not a.tiny:
        write_bench_block(REPO / BENCH_BLOCKS["vertical_noifma"], "vertical_noifma", md)
    return 0

if __name__ == "__main__":
    sys.exit(main())
