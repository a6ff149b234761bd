#!/usr/bin/env python
"""Benchmark ``--engine treeflare`` (our histogram boosting on masked sums) against XGBoost.

    .venv/bin/python scripts/bench_xgb_engine.py                      # as in docs/xgboost.md
    .venv/bin/python scripts/bench_xgb_engine.py --quick              # one dataset, one cell, one speed repeat

Accuracy (in process: the engine's sites, masks and server as the FLARE job runs them, routed by
``treeflare.xgb.engine.driver``): adult, higgs_subset and default_credit_card, 3 and 5 sites, IID and label skew
(Dirichlet alpha 0.5), seed 0, 50 rounds, depth 6, eta 0.3. Two references on the pooled training rows:
  same_bins    xgboost.train(tree_method="hist") on every value replaced by its bin of the agreed cuts (XGBoost's
               bins are then the engine's): the target, equal to the 4th decimal
  xgboost      xgboost.train(tree_method="hist") on the raw values (XGBoost's own sketch): what the lattice costs
Speed (the NVFlare simulator, 3 sites, adult, 50 rounds): ``--engine treeflare`` (its own connections, the default;
every request a FLARE aux message; every request a FLARE task) against ``--engine xgboost --transport direct``, interleaved, median over ``--repeats``. Train seconds
from each run's own result: XGBoost's training (its start to its end, after the sites loaded their rows) and the
engine's requests after its setup (in which the sites load their rows: shown apart).
Results: scripts/results/xgb_engine_bench.{md,json}, and the docs block ``bench:xgb_engine``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "custom"))
sys.path.insert(0, str(REPO / "scripts"))

DATASETS = ("adult", "higgs_subset", "default_credit_card")
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"xgb_engine": "docs/xgboost.md"}


def arrays(name: str, sites: int, partition: str, seed: int = 0):
    from treeflare.data import load_dataset, prepare_federation
    from treeflare.xgb.encoding import table_arrays

    fed = prepare_federation(load_dataset(name), sites, kind=partition, alpha=0.5 if partition != "iid" else None,
                             seed=seed)
    parts = [table_arrays(fed.sites[s].train) for s in fed.site_names]
    return [(a.X, a.y) for a in parts], table_arrays(fed.server_test)


def accuracy_cell(name, sites, partition, rounds, depth) -> dict:
    import xgboost as xgb
    from sklearn.metrics import log_loss, roc_auc_score

    from treeflare.xgb.engine import bins
    from treeflare.xgb.engine.driver import train
    from treeflare.xgb.engine.params import BoostParams

    parts, test = arrays(name, sites, partition)
    params = BoostParams(rounds=rounds, max_depth=depth)
    t = time.perf_counter()
    doc, server = train(parts, params)
    engine_s = time.perf_counter() - t
    ours = xgb.Booster(model_file=bytearray(json.dumps(doc).encode())).predict(xgb.DMatrix(test.X, missing=np.nan))
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    xp = {**params.xgb_params(server.base_score), "nthread": 1}
    binned = lambda M: bins.bin_matrix(M, server.cuts).astype(np.float32)  # noqa: E731
    with np.errstate(invalid="ignore"):
        same = xgb.train(xp, xgb.DMatrix(np.where(binned(X) < 0, np.nan, binned(X)), label=y, missing=np.nan),
                         rounds).predict(xgb.DMatrix(np.where(binned(test.X) < 0, np.nan, binned(test.X)),
                                                     missing=np.nan))
    raw = xgb.train(xp, xgb.DMatrix(X, label=y, missing=np.nan), rounds).predict(xgb.DMatrix(test.X, missing=np.nan))
    score = lambda p: (roc_auc_score(test.y, p), log_loss(test.y, np.clip(p, 1e-15, 1 - 1e-15)))  # noqa: E731
    (a0, l0), (a1, l1), (a2, l2) = score(ours), score(same), score(raw)
    return {"dataset": name, "sites": sites, "partition": partition, "n_train": int(len(y)),
            "engine_auc": a0, "same_bins_auc": a1, "xgboost_auc": a2, "engine_logloss": l0, "same_bins_logloss": l1,
            "xgboost_logloss": l2, "auc_diff_same_bins": a0 - a1, "max_abs_pred_diff_same_bins":
            float(np.abs(ours - same).max()), "auc_diff_xgboost": a0 - a2, "engine_inprocess_s": engine_s,
            "requests": server.stats["requests"], "mb_per_site": server.stats["values_summed"] * 8 / sites / 1e6}


ARMS = {"xgboost": ["--engine", "xgboost", "--transport", "direct"],
        "treeflare": ["--engine", "treeflare"],
        "treeflare_aux": ["--engine", "treeflare", "--engine-messaging", "aux"],
        "treeflare_tasks": ["--engine", "treeflare", "--engine-messaging", "task"]}
ARM_NAMES = {"xgboost": "--engine xgboost --transport direct",
             "treeflare": "--engine treeflare (its own connections, the default)",
             "treeflare_aux": "--engine treeflare, every request a FLARE aux message",
             "treeflare_tasks": "--engine treeflare, every request a FLARE task"}


def flare_run(arm: str, ws: Path, rounds: int, depth: int) -> dict:
    cmd = [sys.executable, str(REPO / "jobs/xgb_histogram/job.py"), "--dataset", "adult", "--sites", "3",
           "--rounds", str(rounds), "--max-depth", str(depth), *ARMS[arm], "--baselines", "",
           "--workspace", str(ws), "--log-level", "WARNING", "--xgb-port", "0"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    report = json.loads((ws / "report.json").read_text()) if (ws / "report.json").is_file() else None
    if proc.returncode != 0 or report is None:
        raise SystemExit(f"{arm} run failed:\n{proc.stderr[-3000:]}")
    out = {"arm": arm, "train_s": report["timings_s"].get("flare_train"), "wall_s": wall,
           "auc": report["global"]["auc"], "setup_s": report["timings_s"].get("flare_setup")}
    if arm != "xgboost":
        res = json.loads(next(Path(report["files"]["flare_run_dir"]).glob("engine_result.json")).read_text())
        out["requests_by_type"] = res.get("requests_by_type")
        out["waiting_for_sites_s"] = res["timings_s"].get("waiting_for_sites")
        level = res["requests_by_type"].get("level") or {}
        out["level_ms"] = 1000 * level["seconds"] / level["requests"] if level.get("requests") else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "scripts" / "results" / "xgb_engine_bench")
    args = ap.parse_args(argv)
    import bench_common

    datasets = DATASETS[:1] if args.quick else DATASETS
    cells = [(d, s, p) for d in datasets for s in ((3,) if args.quick else (3, 5))
             for p in (("iid",) if args.quick else ("iid", "label"))]
    acc = []
    for d, s, p in cells:
        row = accuracy_cell(d, s, p, args.rounds, args.depth)
        acc.append(row)
        print(f"{d} {s} sites {p}: auc engine {row['engine_auc']:.5f} same bins {row['same_bins_auc']:.5f} "
              f"xgboost {row['xgboost_auc']:.5f}", flush=True)
    speed = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-xgb-engine-"))
    try:
        for r in range(1 if args.quick else args.repeats):
            for arm in ARMS:
                row = flare_run(arm, tmp / f"{arm}{r}", args.rounds, args.depth)
                speed.append(row)
                print(f"speed {arm}: train {row['train_s']:.1f} s, wall {row['wall_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {a: statistics.median(x["train_s"] for x in speed if x["arm"] == a) for a in ARMS}
    median_of = lambda a, k: statistics.median(x[k] for x in speed if x["arm"] == a and x.get(k) is not None)  # noqa
    meta = bench_common.bench_settings(machine=platform.processor() or platform.machine(), rounds=args.rounds,
                                       depth=args.depth, eta=0.3, seed=0, alpha_label_skew=0.5,
                                       repeats=1 if args.quick else args.repeats, quick=args.quick)
    lines = ["| dataset | sites | partition | AUC engine | AUC same bins | AUC diff | max pred diff | AUC XGBoost "
             "(own sketch) | MB sent a site |", "|---|---|---|---|---|---|---|---|---|"]
    for r in acc:
        lines.append(f"| {r['dataset']} | {r['sites']} | {r['partition']} | {r['engine_auc']:.5f} | "
                     f"{r['same_bins_auc']:.5f} | {r['auc_diff_same_bins']:+.1e} | "
                     f"{r['max_abs_pred_diff_same_bins']:.1e} | {r['xgboost_auc']:.5f} | {r['mb_per_site']:.1f} |")
    lines += ["", "| arm (NVFlare simulator, adult, 3 sites) | train s (median) | ÷ xgboost direct | a level request, "
              "ms (median) | sites' setup s |", "|---|---|---|---|---|"]
    for a in ARMS:
        level = f"{median_of(a, 'level_ms'):.0f}" if a != "xgboost" else "-"
        setup = f"{median_of(a, 'setup_s'):.1f}" if a != "xgboost" else "-"
        lines.append(f"| {ARM_NAMES[a]} | {med[a]:.1f} | {med[a] / med['xgboost']:.2f} | {level} | {setup} |")
    settings = (f"settings: {meta['rounds']} rounds, depth {meta['depth']}, eta 0.3, seed 0, label skew = Dirichlet "
                f"alpha 0.5, {meta['cores']} cores, load {meta['loadavg'][0]} at the end, {meta['time']}, commit "
                f"{meta['commit']}, speed repeats {meta['repeats']}")
    table = "\n".join(lines) + "\n\n" + settings + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    (args.out.with_suffix(".json")).write_text(json.dumps({"meta": meta, "accuracy": acc, "speed": speed,
                                                           "median_train_s": med}, indent=1))
    (args.out.with_suffix(".md")).write_text(table)
    if not args.quick:
        bench_common.write_bench_block(REPO / BENCH_BLOCKS["xgb_engine"], "xgb_engine", table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
