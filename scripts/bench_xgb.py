#!/usr/bin/env python
"""Benchmark the federated XGBoost histogram job against centralized and XGBoost-native distributed training.

    nice -n 10 flock /tmp/treeflare-flare.lock python scripts/bench_xgb.py                 # all workloads
    nice -n 10 flock /tmp/treeflare-flare.lock python scripts/bench_xgb.py --workloads synthetic200k \\
        --repeats 3 --poc --profile

For every workload, on the same federation folder and parameters:
  centralized        xgboost.train on the union of the sites' training rows (1 process)
  native             XGBoost's RabitTracker + one worker process per site (no NVFlare)
  xgb_federated      XGBoost's own federated gRPC server + one worker per site (NVFlare's protocol, no NVFlare)
  flare_sim          jobs/xgb_histogram in the NVFlare simulator (--messaging direct, this bundle's default)
  flare_sim_reliable the same with NVFlare's default ReliableMessage exchange (--reliable)
  flare_poc          the same job on a local POC system (--poc; isolated HOME and POC workspace, always stopped)

Times: ``train_s`` is the training phase (xgb.train of the slowest worker; for NVFlare, last site done loading
data -> model saved), ``wall_s`` the whole run (process start-up, data loading, shutdown included).
Results: medians over --repeats, as markdown and CSV (``scripts/results/xgb_bench.{md,csv}``).
With --profile, one extra simulator run records every XGBoost collective operation (probes in
scripts/xgb_profile/sitecustomize.py) and the markdown gets a per-exchange breakdown.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
JOB_PY = REPO / "jobs" / "xgb_histogram" / "job.py"
PROFILE_DIR = REPO / "scripts" / "xgb_profile"

# name -> (dataset, modes, rounds, max_depth, eta, sites)
WORKLOADS = {
    "higgs_subset": ("higgs_subset", ["horizontal"], 50, 6, 0.1, 3),
    "synthetic200k": ("synthetic200k", ["horizontal"], 50, 6, 0.1, 3),
    "adult": ("adult", ["horizontal", "vertical"], 50, 6, 0.1, 3),
    "nursery": ("nursery", ["horizontal"], 50, 6, 0.1, 3),
}


def load_job_module():
    spec = importlib.util.spec_from_file_location("xgb_histogram_job", JOB_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def synthetic_table(n: int = 200_000, d: int = 28):
    import pandas as pd
    from sklearn.datasets import make_classification

    from treeflare.data import Feature, Schema, Table

    X, y = make_classification(n, d, n_informative=12, n_redundant=6, flip_y=0.05, class_sep=0.7, random_state=42)
    names = [f"f{i}" for i in range(d)]
    frame = pd.DataFrame(X.astype(np.float32).astype(np.float64), columns=names)
    schema = Schema(tuple(Feature(n_, "numeric") for n_ in names), "y", ("0", "1"))
    return Table(frame, np.array([str(int(v)) for v in y], dtype=object), schema, None, "synthetic200k")


def load(name: str):
    if name == "synthetic200k":
        return synthetic_table()
    from treeflare.data import load_dataset

    return load_dataset(name)


def job_args(job, ws: Path, mode: str, rounds, depth, eta, sites, *, env="sim", messaging="direct",
             timing_dir: Path | None = None):
    argv = ["--workspace", str(ws), "--mode", mode, "--rounds", str(rounds), "--max-depth", str(depth),
            "--eta", str(eta), "--sites", str(sites), "--seed", "0", "--baselines", "", "--env", env,
            "--messaging", messaging, "--log-level", "WARNING"]
    if timing_dir:
        argv += ["--timing-dir", str(timing_dir)]
    return job.build_parser().parse_args(argv)


def flare_run(job, table, ws, mode, cfg, *, env="sim", messaging="direct", extra_env=None):
    rounds, depth, eta, sites = cfg
    timing = ws / "timing"
    args = job_args(job, ws, mode, rounds, depth, eta, sites, env=env, messaging=messaging, timing_dir=timing)
    saved = {k: os.environ.get(k) for k in (extra_env or {})}
    os.environ.update(extra_env or {})
    try:
        t0 = time.perf_counter()
        report = job.run(args, table=table)
        wall = time.perf_counter() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    import xgboost as xgb

    from treeflare.xgb.encoding import global_test
    from treeflare.xgb.metrics import predict_proba

    proba = predict_proba(xgb.Booster(model_file=str(ws / "model.json")), global_test(ws / "federation"))
    return {"metrics": report["global"], "train_s": report["timings_s"].get("flare_train"),
            "wall_s": report["timings_s"]["flare_run"], "job_wall_s": wall, "proba": proba}


# -- profiling ----------------------------------------------------------------------------------
def analyse_profile(prof_dir: Path, train_s: float | None) -> dict:
    rows = []
    for p in prof_dir.glob("*.jsonl"):
        for line in p.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    by = defaultdict(list)
    for r in rows:
        by[r["k"]].append(r)
    out = {"n_events": len(rows)}
    grpc = by["grpc"]
    if not grpc:
        return out
    ranks = sorted({r["rank"] for r in grpc})
    per_rank_ops = {rk: sum(1 for r in grpc if r["rank"] == rk) for rk in ranks}
    out["ops_per_rank"] = per_rank_ops
    out["ops_by_type_rank0"] = dict(sorted(
        {op: sum(1 for r in grpc if r["rank"] == ranks[0] and r["op"] == op) for op in {r["op"] for r in grpc}}.items()))

    def med(xs):
        return float(statistics.median(xs)) if xs else None

    out["grpc_ms_median"] = 1e3 * med([r["dt"] for r in grpc])
    out["flare_ms_median"] = 1e3 * med([r["dt"] for r in by["flare"]])
    out["server_ms_median"] = 1e3 * med([r["dt"] for r in by["server"]])
    # The barrier: per (seq), the server time of the LAST rank to arrive is the pure processing time
    # (gRPC to XGBoost's federated server + reduction); earlier ranks also wait for it.
    seq_groups = defaultdict(list)
    for r in by["server"]:
        seq_groups[r["seq"]].append(r)
    last = [min(g, key=lambda r: r["dt"])["dt"] for g in seq_groups.values() if len(g) == len(ranks)]
    out["server_last_rank_ms_median"] = 1e3 * med(last)
    # messaging = FLARE round trip seen by the client minus the server's handling of that same request
    srv = {(r["rank"], r["seq"]): r["dt"] for r in by["server"]}
    msg = [r["dt"] - srv[(r["rank"], r["seq"])] for r in by["flare"] if (r["rank"], r["seq"]) in srv]
    out["messaging_ms_median"] = 1e3 * med(msg)
    out["messaging_ms_mean"] = 1e3 * float(np.mean(msg)) if msg else None
    # time rank 0 spent inside collectives vs computing between them
    r0 = sorted((r for r in grpc if r["rank"] == ranks[0]), key=lambda r: r["t0"])
    in_comm = sum(r["dt"] for r in r0)
    span = r0[-1]["t0"] + r0[-1]["dt"] - r0[0]["t0"]
    out["rank0_span_s"] = span
    out["rank0_in_collectives_s"] = in_comm
    out["rank0_between_collectives_s"] = span - in_comm
    out["bytes_per_op_median"] = med([r["n"] for r in grpc])
    if train_s:
        out["train_s"] = train_s
        out["train_ms_per_op"] = 1e3 * train_s / max(per_rank_ops.values())
    return out


# -- main ---------------------------------------------------------------------------------------
def run_workload(job, name, spec, args, results, profiles, tmp_root: Path):
    from treeflare.xgb import baselines as bl
    from treeflare.xgb import make_params

    dataset, modes, rounds, depth, eta, sites = spec
    if args.rounds:
        rounds = args.rounds
    table = load(dataset)
    n_classes = len(table.schema.classes)
    params = make_params(n_classes, max_depth=depth, eta=eta, nthread=1, seed=0)
    for mode in modes:
        if args.modes and mode not in args.modes:
            continue
        ws_root = tmp_root / f"{name}_{mode}"
        prep_args = job_args(job, ws_root / "prep", mode, rounds, depth, eta, sites)
        fed_dir, _ = job.prepare(table, prep_args)
        cfg = (rounds, depth, eta, sites)

        def add(method, rep, r, central=None):
            row = {"workload": name, "mode": mode, "method": method, "repeat": rep, "rows": len(table),
                   "rounds": rounds, "sites": sites, "train_s": r.get("train_s"), "wall_s": r.get("wall_s"),
                   **{f"m_{k}": v for k, v in r["metrics"].items()}}
            if central is not None:
                row["max_abs_pred_diff_vs_central"] = float(np.abs(r["proba"] - central["proba"]).max())
            results.append(row)
            print(f"  {name:13s} {mode:10s} {method:18s} rep {rep}: train {row['train_s'] or float('nan'):7.2f}s "
                  f"wall {row['wall_s'] or float('nan'):7.2f}s {r['metrics']}", flush=True)

        repeats = args.repeats_map.get(name, args.repeats)
        reliable = args.reliable and (not args.reliable_workloads or name in args.reliable_workloads)
        for rep in range(repeats):
            c = bl.centralized(fed_dir, params, rounds)
            c["wall_s"] = c["train_s"]
            add("centralized", rep, c, c)
            n = bl.native_distributed(fed_dir, params, rounds)
            add("native", rep, n, c)
            if not args.skip_xgb_federated:
                f = bl.native_distributed(fed_dir, params, rounds, communicator="federated")
                add("xgb_federated", rep, f, c)
            try:
                s = flare_run(job, table, ws_root / f"sim{rep}", mode, cfg)
                add("flare_sim", rep, s, c)
                if reliable:
                    s2 = flare_run(job, table, ws_root / f"simrm{rep}", mode, cfg, messaging="reliable")
                    add("flare_sim_reliable", rep, s2, c)
            except (Exception, SystemExit) as exc:  # keep the other measurements
                print(f"  simulator run failed: {exc!r}", flush=True)
            if args.poc and (not args.poc_workloads or name in args.poc_workloads):
                # runner.py starts a POC in <workspace>/flare/poc (its own HOME and POC workspace, port 8002)
                # and always stops it; this script already runs under `flock /tmp/treeflare-flare.lock`.
                try:
                    p = flare_run(job, table, ws_root / f"poc{rep}", mode, cfg, env="poc",
                                  extra_env={"TREEFLARE_FLARE_LOCK_HELD": "1"})
                    add("flare_poc", rep, p, c)
                except (Exception, SystemExit) as exc:  # keep going with the other workloads
                    print(f"  POC run failed: {exc!r}", flush=True)
        if args.profile and (not args.profile_workloads or name in args.profile_workloads):
            prof = tmp_root / f"profile_{name}_{mode}"
            shutil.rmtree(prof, ignore_errors=True)
            extra = {"TREEFLARE_XGB_PROFILE_DIR": str(prof),
                     "PYTHONPATH": os.pathsep.join([str(PROFILE_DIR), os.environ.get("PYTHONPATH", "")])}
            for messaging in (["direct", "reliable"] if reliable else ["direct"]):
                shutil.rmtree(prof, ignore_errors=True)
                r = flare_run(job, table, ws_root / f"prof_{messaging}", mode, cfg, messaging=messaging,
                              extra_env=extra)
                a = analyse_profile(prof, r["train_s"])
                a.update(workload=name, mode=mode, messaging=messaging, wall_s=r["wall_s"])
                profiles.append(a)
                print(f"  profile {name} {mode} {messaging}: {json.dumps(a)}", flush=True)


def summarise(results: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for r in results:
        groups[(r["workload"], r["mode"], r["method"])].append(r)
    out = []
    for (w, m, meth), rows in groups.items():
        s = {"workload": w, "mode": m, "method": meth, "n": len(rows)}
        for k in rows[0]:
            if k.startswith("m_") or k in ("train_s", "wall_s", "max_abs_pred_diff_vs_central"):
                vals = [r[k] for r in rows if r.get(k) is not None]
                s[k] = float(statistics.median(vals)) if vals else None
        out.append(s)
    # ratios and metric differences vs the references
    idx = {(s["workload"], s["mode"], s["method"]): s for s in out}
    for s in out:
        c = idx.get((s["workload"], s["mode"], "centralized"))
        n = idx.get((s["workload"], s["mode"], "native"))
        main_metric = "m_auc" if "m_auc" in s else "m_mlogloss"
        s["main_metric"] = main_metric[2:]
        s["metric_diff_vs_central"] = (s[main_metric] - c[main_metric]) if c else None
        for ref, key in ((n, "train_ratio_vs_native"), (n, "wall_ratio_vs_native")):
            fld = "train_s" if key.startswith("train") else "wall_s"
            s[key] = (s[fld] / ref[fld]) if ref and s.get(fld) and ref.get(fld) else None
    return out


def fmt(v, nd=4):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{nd}f}"
    return str(v)


def write_outputs(summary, results, profiles, out: Path, meta: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in results for k in r}, key=lambda k: (k not in ("workload", "mode", "method"), k))
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(results)
    lines = [f"# XGBoost histogram job benchmark", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; host: {meta['host']}; repeats: "
             f"{meta['repeats']} (medians); nthread=1 per worker; load average at start {meta['load']}.", "",
             "| workload | mode | method | main metric | value | Δ vs centralized | max\\|Δp\\| vs centralized "
             "| train s | wall s | train ÷ native | wall ÷ native |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append("| " + " | ".join([
            s["workload"], s["mode"], s["method"], s["main_metric"], fmt(s.get("m_" + s["main_metric"])),
            fmt(s["metric_diff_vs_central"], 2), fmt(s.get("max_abs_pred_diff_vs_central"), 2),
            fmt(s.get("train_s"), 3), fmt(s.get("wall_s"), 3), fmt(s.get("train_ratio_vs_native"), 3),
            fmt(s.get("wall_ratio_vs_native"), 3)]) + " |")
    if profiles:
        lines += ["", "## Per-exchange profile (NVFlare simulator)", "",
                  "| workload | messaging | ops / rank | train s | ms / op (train ÷ ops) | XGBoost→site gRPC "
                  "call ms | FLARE round trip ms | server handling ms (all ranks) | server, last rank ms "
                  "| messaging ms (round trip − server) | rank 0 between collectives s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in profiles:
            lines.append("| " + " | ".join([
                p["workload"], p["messaging"], fmt(max(p.get("ops_per_rank", {0: 0}).values())),
                fmt(p.get("train_s"), 3), fmt(p.get("train_ms_per_op"), 3), fmt(p.get("grpc_ms_median"), 3),
                fmt(p.get("flare_ms_median"), 3), fmt(p.get("server_ms_median"), 3),
                fmt(p.get("server_last_rank_ms_median"), 3), fmt(p.get("messaging_ms_median"), 3),
                fmt(p.get("rank0_between_collectives_s"), 3)]) + " |")
        lines += ["", "Raw profile summaries:", "", "```json", json.dumps(profiles, indent=1), "```"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--modes", nargs="*", choices=["horizontal", "vertical"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--repeat", action="append", default=[], metavar="WORKLOAD=N",
                    help="repeats for one workload (e.g. synthetic200k=3); others use --repeats")
    ap.add_argument("--rounds", type=int, help="override every workload's rounds (quick checks)")
    ap.add_argument("--poc", action="store_true", help="also run the job on a local POC system (port 8002)")
    ap.add_argument("--poc-workloads", nargs="*", help="restrict --poc to these workloads")
    ap.add_argument("--reliable", action="store_true",
                    help="also run with NVFlare's default ReliableMessage exchange (--messaging reliable)")
    ap.add_argument("--reliable-workloads", nargs="*", default=["synthetic200k"],
                    help="restrict --reliable to these workloads")
    ap.add_argument("--profile", action="store_true", help="per-exchange timing probes (one extra run)")
    ap.add_argument("--profile-workloads", nargs="*", default=["synthetic200k"])
    ap.add_argument("--skip-xgb-federated", action="store_true")
    ap.add_argument("--out", type=Path, default=REPO / "scripts" / "results" / "xgb_bench")
    ap.add_argument("--keep", action="store_true", help="keep the temporary workspaces")
    args = ap.parse_args(argv)
    args.repeats_map = {k: int(v) for k, v in (item.split("=", 1) for item in args.repeat)}

    job = load_job_module()
    meta = {"command": "python scripts/bench_xgb.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": f"{os.cpu_count()} CPUs",
            "repeats": f"{args.repeats} {args.repeats_map or ''}".strip(), "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    tmp_root = Path(tempfile.mkdtemp(prefix="bench_xgb_"))
    results, profiles = [], []
    try:
        for name in args.workloads:
            print(f"== {name}", flush=True)
            run_workload(job, name, WORKLOADS[name], args, results, profiles, tmp_root)
            write_outputs(summarise(results), results, profiles, args.out, meta)  # partial results survive
    finally:
        if not args.keep:
            shutil.rmtree(tmp_root, ignore_errors=True)
        else:
            print(f"workspaces kept in {tmp_root}")
    summary = summarise(results)
    write_outputs(summary, results, profiles, args.out, meta)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
