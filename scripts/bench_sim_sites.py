#!/usr/bin/env python
"""How many sites can the FLARE simulator run on this machine?

Runs ``jobs/icdta4fl/job.py`` (CART, IID) in the simulator for growing site counts, as a user would, and samples
the whole process tree it starts (the simulator gives every site a process of its own) every 0.5 s: peak memory
(sum of PSS, which shares library pages fairly; RSS is shown too), peak process count, wall time, and whether the
job completed with every site. Repeats are interleaved (site counts in turn); medians are quoted.

    python scripts/bench_sim_sites.py --sites 5,10,20,40,60 --repeats 3
    python scripts/bench_sim_sites.py --probe --sites 80,100 --max-gb 16    # once each, to find the limit

Stops growing when a run fails, or when the tree's memory passes --max-gb (the machine is shared). Writes
scripts/results/sim_sites.{csv,md} and the docs block ``sim_sites`` (``--probe``: sim_sites_probe.*, block
``sim_sites_probe``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
from bench_common import bench_settings, write_bench_block# noqa: E402
from treeflare.console import format_table# noqa: E402
from treeflare.files import write_text_atomic# noqa: E402

RESULTS = REPO / "scripts" / "results"
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"sim_sites": "docs/DEPLOY.md", "sim_sites_probe": "docs/DEPLOY.md"}


def tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """(sum of PSS, sum of RSS, process count) of ``root`` and everything below it."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0, 0
    pss = rss = n = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        pss += getattr(info, "pss", info.rss)
        rss += info.rss
        n += 1
    return pss, rss, n


def run_once(sites: int, args, work: Path) -> dict:
    ws = work / f"k{sites}"
    cmd = [sys.executable, str(REPO / "jobs" / "icdta4fl" / "job.py"), "--algorithm", "cart", "--dataset",
           args.dataset, "--sites", str(sites), "--min-clients", str(sites), "--partition", "iid", "--seed", "0",
           "--max-depth", "4", "--task-timeout", str(args.task_timeout), "--workspace", str(ws)]
    env = {**os.environ, "HOME": str(work / "home"), "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    root = psutil.Process(proc.pid)
    peak_pss = peak_rss = peak_n = 0
    aborted = None
    while proc.poll() is None:
        pss, rss, n = tree_memory(root)
        peak_pss, peak_rss, peak_n = max(peak_pss, pss), max(peak_rss, rss), max(peak_n, n)
        if pss > args.max_gb * 2**30:
            aborted = f"memory above {args.max_gb} GB"
        elif time.perf_counter() - t0 > args.timeout:
            aborted = f"over {args.timeout} s"
        if aborted:
            proc.terminate()  # the job script ends the simulator and its sites (SIGTERM handling)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            break
        time.sleep(0.5)
    err = proc.communicate()[1] if proc.stderr else ""
    wall = time.perf_counter() - t0
    report = ws / "report.json"
    status = "aborted: " + aborted if aborted else "failed"
    n_done = 0
    if not aborted and report.is_file():
        r = json.loads(report.read_text())
        n_done = int(r.get("n_sites") or 0)
        if r.get("status", "completed") == "completed" and n_done == sites:
            status = "completed"
        else:
            status = f"{r.get('status', 'partial')}: {str(r.get('error') or f'{n_done} sites')[:70]}"
    if status == "completed":
        shutil.rmtree(ws, ignore_errors=True)
    else:
        print(f"kept the failed run's workspace (logs): {ws}", file=sys.stderr)
    return {"sites": sites, "status": status, "wall_s": round(wall, 1), "peak_pss_gb": round(peak_pss / 2**30, 2),
            "peak_rss_gb": round(peak_rss / 2**30, 2), "peak_processes": peak_n, "rc": proc.returncode,
            "stderr_tail": (err or "")[-300:].replace("\n", " ")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", default="5,10,20,40", help="site counts, ascending")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dataset", default="car")
    p.add_argument("--max-gb", type=float, default=12.0, help="stop a run whose process tree passes this (PSS)")
    p.add_argument("--timeout", type=float, default=900.0, help="stop a run after this many seconds")
    p.add_argument("--task-timeout", type=int, default=300, help="the job's --task-timeout (its default: 300)")
    p.add_argument("--probe", action="store_true", help="one run per count, written apart (sim_sites_probe)")
    p.add_argument("--no-docs", action="store_true", help="do not rewrite the docs block")
    args = p.parse_args(argv)
    if args.probe:
        args.repeats = 1
    name = "sim_sites_probe" if args.probe else "sim_sites"
    counts = sorted(int(k) for k in args.sites.split(","))
    settings = bench_settings(dataset=args.dataset, algorithm="cart", partition="iid", seed=0, repeats=args.repeats,
                              memory_gb=round(psutil.virtual_memory().total / 2**30, 1),
                              available_gb=round(psutil.virtual_memory().available / 2**30, 1))
    runs: list[dict] = []
    alive = list(counts)
    tmp = tempfile.mkdtemp(prefix="bench-sim-sites-")  # a failed run's workspace is kept there for its logs
    for rep in range(args.repeats):
        for k in list(alive):
            r = run_once(k, args, Path(tmp) / f"r{rep}")
            r["repeat"] = rep
            r["loadavg_1m"] = round(os.getloadavg()[0], 2)
            runs.append(r)
            print(json.dumps(r), flush=True)
            if r["status"] != "completed":  # a larger federation will not do better
                alive = [c for c in alive if c < k]
                break
    rows = []
    for k in counts:
        rs = [r for r in runs if r["sites"] == k]
        if not rs:
            continue
        ok = [r for r in rs if r["status"] == "completed"]
        med = (lambda key: statistics.median(r[key] for r in ok)) if ok else (lambda key: None)
        rows.append([k, f"{len(ok)}/{len(rs)}", med("wall_s"), med("peak_pss_gb"), med("peak_rss_gb"),
                     med("peak_processes"), "; ".join(sorted({r["status"] for r in rs if r["status"] != "completed"}))])
    headers = ["sites", "completed", "wall s (median)", "peak PSS GB", "peak RSS GB", "processes", "other outcomes"]
    table = format_table(headers, rows)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    loads = [r["loadavg_1m"] for r in runs]
    settings["run_loadavg_1m"] = [min(loads), max(loads)]
    with open(RESULTS / f"{name}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(runs[0]))
        w.writeheader()
        w.writerows(runs)
    md = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join("" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v)) for v in r) + " |"
           for r in rows]
    largest = max((r[0] for r in rows if r[1] == f"{args.repeats}/{args.repeats}"), default=None)
    what = "one run each (a probe for the limit)" if args.probe else f"medians of {args.repeats} interleaved runs"
    note = (f"\nICDTA4FL-CART on {args.dataset}, IID, simulator, `--min-clients` = sites; {what}; load average "
            f"(1 min) {min(loads)}-{max(loads)} during the runs. Largest federation that completed every run: "
            f"**{largest} sites** (of those tried). Settings: {json.dumps(settings)}\n")
    write_text_atomic(RESULTS / f"{name}.md", "\n".join(md) + "\n" + note)
    if not args.no_docs:
        write_bench_block(REPO / BENCH_BLOCKS[name], name, "\n".join(md) + "\n" + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
