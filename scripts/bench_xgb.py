#!/usr/bin/env python
"""Benchmark the federated XGBoost job's transports against XGBoost's own distributed training.

    .venv/bin/python scripts/bench_xgb.py --repeats 3          # as in docs/xgboost.md (takes the FLARE lock itself)
    .venv/bin/python scripts/bench_xgb.py --workloads adult --modes horizontal --repeats 1 --rounds 5   # quick

Arms, interleaved within every repeat, on the same federation folder and parameters (3 sites, one thread each):
  centralized        xgboost.train on the union of the sites' training rows (1 process; reference for accuracy)
  native             XGBoost's RabitTracker + one worker process per site (no NVFlare): the speed reference
  xgb_federated      XGBoost's own federated gRPC server + one worker per site, plain TCP (no NVFlare)
  xgb_federated_tls  the same with mutual TLS, certificates from a POC's startup kits
  direct             jobs/xgb_histogram --transport direct in the NVFlare simulator (plain TCP)
  direct_tls         --transport direct on a local POC system (mutual TLS with the kits' certificates)
  flare              --transport flare in the simulator (every collective relayed through NVFlare messaging)

``train_s`` is the training phase: first worker's xgb.train start to the last one's end (native, xgb_federated*,
direct*), or last site done loading data to model saved (flare). ``wall_s`` is the whole run (process start-up,
data loading, shutdown). Ratios to native are taken within each repeat, then the median over repeats is quoted.
One POC is started for the TLS arms (its own HOME and workspace, a free port) and always stopped; it idles
during the other arms. Results: scripts/results/xgb_bench.{md,csv,json}, and the docs block ``bench:xgb``.

(Over 400 lines: every arm, the POC for the TLS arms, the per-exchange profile and the docs writer of one
benchmark, kept in one script so one command reproduces the table.)
"""

from __future__ import annotations

import argparse
import csv
import importlib
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
PROFILE_DIR = REPO / "scripts" / "xgb_profile"
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"xgb": "docs/xgboost.md"}
ARMS = ["centralized", "native", "xgb_federated", "xgb_federated_tls", "direct", "direct_tls", "flare"]
TARGETS = {"direct": 1.5, "direct_tls": 2.0}  # train time / native train time
RAW_OF = {"direct": "xgb_federated", "direct_tls": "xgb_federated_tls"}  # the same protocol without NVFlare

# name -> (dataset, modes, rounds, max_depth, eta, sites)
WORKLOADS = {
    "synthetic200k": ("synthetic200k", ["horizontal"], 50, 6, 0.1, 3),
    "adult": ("adult", ["horizontal", "vertical"], 50, 6, 0.1, 3),
    "higgs_subset": ("higgs_subset", ["horizontal"], 50, 6, 0.1, 3),
    "nursery": ("nursery", ["horizontal"], 50, 6, 0.1, 3),
}


def load_job_module():
    """The XGBoost job's command line (``treeflare xgb``), whose build_parser() and run() each arm calls."""
    return importlib.import_module("treeflare.jobs.xgb_histogram")


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


def job_args(job, ws: Path, mode: str, rounds, depth, eta, sites, *, env="sim", transport="direct",
             poc_root: Path | None = None, timing_dir: Path | None = None):
    argv = ["--workspace", str(ws), "--mode", mode, "--rounds", str(rounds), "--max-depth", str(depth),
            "--eta", str(eta), "--sites", str(sites), "--seed", "0", "--baselines", "", "--env", env,
            "--transport", transport, "--xgb-port", "0", "--log-level", "WARNING"]
    if poc_root:
        argv += ["--poc-root", str(poc_root)]
    if timing_dir:
        argv += ["--timing-dir", str(timing_dir)]
    return job.build_parser().parse_args(argv)


def flare_run(job, table, ws, mode, cfg, *, env="sim", transport="direct", poc_root=None, extra_env=None):
    rounds, depth, eta, sites = cfg
    args = job_args(job, ws, mode, rounds, depth, eta, sites, env=env, transport=transport, poc_root=poc_root,
                    timing_dir=ws / "timing")
    saved = {k: os.environ.get(k) for k in (extra_env or {})}
    os.environ.update(extra_env or {})
    try:
        report = job.run(args, table=table)
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
            "wall_s": report["timings_s"]["flare_run"], "proba": proba,
            "tls": (report["transport"].get("federated_server") or {}).get("tls")}


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
def run_workload(job, name, spec, args, results, profiles, tmp_root: Path, poc) -> None:
    from treeflare.xgb import baselines as bl
    from treeflare.xgb import make_params

    dataset, modes, rounds, depth, eta, sites = spec
    rounds = args.rounds or rounds
    table = load(dataset)
    params = make_params(len(table.schema.classes), max_depth=depth, eta=eta, nthread=1, seed=0)
    for mode in modes:
        if args.modes and mode not in args.modes:
            continue
        ws_root = tmp_root / f"{name}_{mode}"
        fed_dir, _ = job.prepare(table, job_args(job, ws_root / "prep", mode, rounds, depth, eta, sites))
        cfg = (rounds, depth, eta, sites)
        tls_kits = None
        if poc is not None:
            tls_kits = {"server": poc.server_dir, **poc.site_dirs()}

        def add(method, rep, r, refs):
            row = {"workload": name, "mode": mode, "method": method, "repeat": rep, "rows": len(table),
                   "rounds": rounds, "sites": sites, "train_s": r.get("train_s"), "wall_s": r.get("wall_s"),
                   "tls": r.get("tls"), **{f"m_{k}": v for k, v in r["metrics"].items()}}
            if "centralized" in refs:
                row["max_abs_pred_diff_vs_central"] = float(np.abs(r["proba"] - refs["centralized"]["proba"]).max())
            if "native" in refs:
                n = refs["native"]
                row["max_abs_pred_diff_vs_native"] = float(np.abs(r["proba"] - n["proba"]).max())
                if "auc" in r["metrics"]:
                    row["auc_diff_vs_native"] = r["metrics"]["auc"] - n["metrics"]["auc"]
                if r.get("train_s") and n.get("train_s"):
                    row["train_ratio_vs_native"] = r["train_s"] / n["train_s"]
                if r.get("wall_s") and n.get("wall_s"):
                    row["wall_ratio_vs_native"] = r["wall_s"] / n["wall_s"]
            results.append(row)
            print(f"  {name:13s} {mode:10s} {method:18s} rep {rep}: train {row['train_s'] or float('nan'):7.2f}s "
                  f"wall {row['wall_s'] or float('nan'):7.2f}s ratio {row.get('train_ratio_vs_native', float('nan')):5.2f}"
                  f" {r['metrics']}", flush=True)

        for rep in range(args.repeats):
            refs = {}
            c = bl.centralized(fed_dir, params, rounds)
            c["wall_s"] = c["train_s"]
            refs["centralized"] = c
            add("centralized", rep, c, {"centralized": c})
            refs["native"] = n = bl.native_distributed(fed_dir, params, rounds)
            add("native", rep, n, refs)
            for arm in args.arms:
                try:
                    if arm == "xgb_federated":
                        r = bl.native_distributed(fed_dir, params, rounds, communicator="federated")
                        r["tls"] = False
                    elif arm == "xgb_federated_tls" and tls_kits:
                        r = bl.native_distributed(fed_dir, params, rounds, communicator="federated",
                                                  tls_kits=tls_kits)
                        r["tls"] = True
                    elif arm == "direct":
                        r = flare_run(job, table, ws_root / f"direct{rep}", mode, cfg)
                    elif arm == "direct_tls" and poc is not None:
                        r = flare_run(job, table, ws_root / f"direct_tls{rep}", mode, cfg, env="poc",
                                      poc_root=poc.root, extra_env={"TREEFLARE_FLARE_LOCK_HELD": "1"})
                    elif arm == "flare":
                        r = flare_run(job, table, ws_root / f"flare{rep}", mode, cfg, transport="flare")
                    else:
                        continue
                    add(arm, rep, r, refs)
                except (Exception, SystemExit) as exc:  # keep the other measurements, say what failed
                    print(f"  {arm} failed: {exc!r}", flush=True)
        if args.profile and "flare" in args.arms:
            prof = tmp_root / f"profile_{name}_{mode}"
            shutil.rmtree(prof, ignore_errors=True)
            extra = {"TREEFLARE_XGB_PROFILE_DIR": str(prof),
                     "PYTHONPATH": os.pathsep.join([str(PROFILE_DIR), os.environ.get("PYTHONPATH", "")])}
            r = flare_run(job, table, ws_root / "prof_flare", mode, cfg, transport="flare", extra_env=extra)
            a = analyse_profile(prof, r["train_s"])
            a.update(workload=name, mode=mode, messaging="direct", wall_s=r["wall_s"])
            profiles.append(a)
            print(f"  profile {name} {mode}: {json.dumps(a)}", flush=True)


def summarise(results: list[dict]) -> list[dict]:
    """Medians over repeats per (workload, mode, method); ratios are medians of the per-repeat ratios."""
    groups = defaultdict(list)
    for r in results:
        groups[(r["workload"], r["mode"], r["method"])].append(r)
    out = []
    for (w, m, meth), rows in groups.items():
        s = {"workload": w, "mode": m, "method": meth, "n": len(rows), "tls": rows[0].get("tls")}
        keys = {k for r in rows for k in r}
        for k in sorted(keys):
            if k.startswith("m_") or k in ("train_s", "wall_s", "max_abs_pred_diff_vs_central",
                                           "max_abs_pred_diff_vs_native", "auc_diff_vs_native",
                                           "train_ratio_vs_native", "wall_ratio_vs_native"):
                vals = [r[k] for r in rows if r.get(k) is not None]
                s[k] = float(statistics.median(vals)) if vals else None
                if k.endswith("_diff_vs_native") or k.endswith("diff_vs_central"):
                    s[k + "_max"] = float(max(abs(v) for v in vals)) if vals else None
        s["main_metric"] = "auc" if "m_auc" in s else "mlogloss"
        raw = RAW_OF.get(meth)
        if raw:  # what NVFlare adds: the job's arm over XGBoost's own federated run, same repeat, same TLS
            by_rep = {r["repeat"]: r for r in groups.get((w, m, raw), [])}
            ratios = [r["train_s"] / by_rep[r["repeat"]]["train_s"] for r in rows
                      if r.get("train_s") and by_rep.get(r["repeat"], {}).get("train_s")]
            s["train_ratio_vs_raw"] = float(statistics.median(ratios)) if ratios else None
        out.append(s)
    order = {a: i for i, a in enumerate(ARMS)}
    return sorted(out, key=lambda s: (s["workload"], s["mode"], order.get(s["method"], 99)))


def fmt(v, nd=3):
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:.2g}" if abs(v) < 1e-2 else f"{v:.{nd}f}"
    return str(v)


def targets(summary: list[dict]) -> list[str]:
    """One line per speed and accuracy target (XGBoost at its own federated server's speed), met or missed, with the measured value."""
    lines = []
    idx = {(s["workload"], s["mode"], s["method"]): s for s in summary}
    for s in summary:
        limit = TARGETS.get(s["method"])
        if limit and s.get("train_ratio_vs_native") is not None:
            r = s["train_ratio_vs_native"]
            raw = s.get("train_ratio_vs_raw")
            raw_arm = idx.get((s["workload"], s["mode"], RAW_OF[s["method"]]), {})
            context = (f"; XGBoost's own federated server without NVFlare (`{RAW_OF[s['method']]}`, same repeats): "
                       f"{raw_arm.get('train_ratio_vs_native', float('nan')):.2f}x native; the job over it: "
                       f"{raw:.2f}x") if raw else ""
            lines.append(f"{s['workload']} {s['mode']}: `{s['method']}` train time {r:.2f}x native (target <= "
                         f"{limit}x): **{'met' if r <= limit else 'missed'}**{context}")
        if s["mode"] == "horizontal" and s["method"].startswith("direct") and s.get("auc_diff_vs_native_max") is not None:
            d = s["auc_diff_vs_native_max"]
            lines.append(f"{s['workload']} horizontal: `{s['method']}` AUC within {d:.1e} of native (target <= 1e-4): "
                         f"**{'met' if d <= 1e-4 else 'missed'}**")
        if s["mode"] == "vertical" and s["method"].startswith("direct") and \
                s.get("max_abs_pred_diff_vs_central_max") is not None:
            d = s["max_abs_pred_diff_vs_central_max"]
            lines.append(f"{s['workload']} vertical: `{s['method']}` predictions vs centralized max|Δp| = {d:.1e} "
                         f"(target: identical): **{'met' if d < 1e-6 else 'missed'}**")
    return lines


def markdown_table(summary: list[dict]) -> str:
    lines = ["| workload | mode | arm | TLS | AUC / mlogloss | Δ AUC vs native | max\\|Δp\\| vs centralized "
             "| train s | train ÷ native | train ÷ XGBoost federated | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        tls = "" if s["method"] in ("centralized", "native") else fmt(s.get("tls"))
        lines.append("| " + " | ".join([
            s["workload"], s["mode"], s["method"], tls, fmt(s.get("m_" + s["main_metric"]), 4),
            fmt(s.get("auc_diff_vs_native")), fmt(s.get("max_abs_pred_diff_vs_central")),
            fmt(s.get("train_s"), 2), fmt(s.get("train_ratio_vs_native"), 2), fmt(s.get("train_ratio_vs_raw"), 2),
            fmt(s.get("wall_s"), 1)]) + " |")
    return "\n".join(lines)


def write_outputs(summary, results, profiles, out: Path, meta: dict, docs: bool) -> None:
    from bench_common import write_bench_block
    from treeflare.files import write_json_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in results for k in r}, key=lambda k: (k not in ("workload", "mode", "method"), k))
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(results)
    write_json_atomic(out.with_suffix(".json"), {"settings": meta, "summary": summary, "runs": results,
                                                 "profiles": profiles})
    settings = (f"`{meta['command']}` at commit {meta['commit']}, {meta['time']}; {meta['cores']} shared cores, "
                f"load average {' '.join(map(str, meta['loadavg']))} at the start and "
                f"{' '.join(map(str, meta.get('loadavg_end', [])))} at the end; {meta['repeats']} repeats, arms "
                f"interleaved, medians; 3 sites, one XGBoost thread each; seed 0 (data split and XGBoost).")
    if meta.get("summarised_by"):
        settings += f" Tables re-summarised from that run's recorded runs by `{meta['summarised_by']}`."
    body = markdown_table(summary) + "\n\n" + "\n".join(f"- {t}" for t in targets(summary)) + "\n\n" + settings
    text = ["# XGBoost histogram job benchmark", "", body]
    if profiles:
        text += ["", "## Per-exchange profile (`--transport flare`, simulator)", "", "```json",
                 json.dumps(profiles, indent=1), "```"]
    out.with_suffix(".md").write_text("\n".join(text) + "\n")
    if docs:
        write_bench_block(REPO / BENCH_BLOCKS["xgb"], "xgb", body)


def start_poc(root: Path, sites: int):
    from treeflare.flare.poc import LocalPoc
    from treeflare.xgb.fedserver import free_port

    poc = LocalPoc(root)
    poc.prepare([f"site-{i + 1}" for i in range(sites)], port=free_port())
    poc.start()
    return poc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="*", default=["synthetic200k", "adult"], choices=list(WORKLOADS))
    ap.add_argument("--modes", nargs="*", choices=["horizontal", "vertical"])
    ap.add_argument("--arms", nargs="*", default=ARMS[2:], choices=ARMS[2:],
                    help="arms besides centralized and native (always run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, help="override every workload's rounds (quick checks)")
    ap.add_argument("--profile", action="store_true", help="one extra --transport flare run with per-exchange probes")
    ap.add_argument("--out", type=Path, default=REPO / "scripts" / "results" / "xgb_bench")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the docs block")
    ap.add_argument("--keep", action="store_true", help="keep the temporary workspaces")
    ap.add_argument("--from-json", type=Path, metavar="RESULTS_JSON",
                    help="run nothing: summarise the runs recorded in a previous results .json again (same settings)")
    args = ap.parse_args(argv)
    if args.from_json:
        recorded = json.loads(args.from_json.read_text())
        meta, runs = recorded["settings"], recorded["runs"]
        meta["summarised_by"] = "python scripts/bench_xgb.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_outputs(summarise(runs), runs, recorded.get("profiles", []), args.out, meta, docs=not args.no_docs)
        print(args.out.with_suffix(".md").read_text())
        return 0
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    from treeflare.flare.poc import flare_lock
    from bench_common import bench_settings

    job = load_job_module()
    command = "python scripts/bench_xgb.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = bench_settings(command=command.strip(), repeats=args.repeats, seed=0,
                          randomness="data split and XGBoost seeded (0); timings vary with machine load")
    print(f"load average at start: {meta['loadavg']} on {meta['cores']} cores", flush=True)
    tmp_root = Path(tempfile.mkdtemp(prefix="bench_xgb_"))
    results, profiles = [], []
    poc = None
    try:
        with flare_lock():
            os.environ["TREEFLARE_FLARE_LOCK_HELD"] = "1"  # the job runs in this process, under this lock
            if {"xgb_federated_tls", "direct_tls"} & set(args.arms):
                t = time.perf_counter()
                poc = start_poc(tmp_root / "poc", 3)
                print(f"POC up in {time.perf_counter() - t:.1f} s", flush=True)
            for name in args.workloads:
                print(f"== {name}", flush=True)
                run_workload(job, name, WORKLOADS[name], args, results, profiles, tmp_root, poc)
                meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
                write_outputs(summarise(results), results, profiles, args.out, meta, docs=False)  # partial
    finally:
        if poc is not None:
            poc.stop()
        if not args.keep:
            shutil.rmtree(tmp_root, ignore_errors=True)
        else:
            print(f"workspaces kept in {tmp_root}")
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = summarise(results)
    write_outputs(summary, results, profiles, args.out, meta, docs=not args.no_docs and args.rounds is None)
    print(args.out.with_suffix(".md").read_text())
    print(f"load average at end: {meta['loadavg_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
