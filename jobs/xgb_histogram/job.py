#!/usr/bin/env python
"""Federated XGBoost, histogram-based (NVFlare histogram_based_v2), horizontal or vertical.

    python jobs/xgb_histogram/job.py --dataset adult --sites 3 --rounds 50 --workspace out/xgb_adult
    python jobs/xgb_histogram/job.py --dataset nursery --mode vertical --sites 3 --workspace out/xgb_nv

Steps: prepare the federation folder under --workspace with the data layer; build NVFlare's XGB recipe
(XGBHorizontalRecipe / XGBVerticalRecipe: XGBFedController + FedXGBHistogramExecutor, XGBoost's own federated
communicator relayed by FLARE) fed by our TreeflareXGBDataLoader; ship the treeflare package as custom code;
run it (simulator, POC or a provisioned system); then score the global model on the server's test set, compute
the centralized and XGBoost-native distributed baselines, and write report.json, model.json and tb_events/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from treeflare.cli import add_data_args, add_partition_args, load_table, main_guard, prepare_from_args
from treeflare.cli import check_args as shared_check_args
from treeflare.data import write_federation
from treeflare.flare.runner import add_run_args, recipe_job, run_job, ship_package
from treeflare.reporting import format_table, write_json_atomic
from treeflare.xgb import ENCRYPT_MESSAGE, XGBSetupError, check_federated_build, make_params, metric_keys
from treeflare.xgb.encoding import global_test
from treeflare.xgb.metrics import metric_diffs, score_booster
from treeflare.xgb.params import DEFAULT_ETA, DEFAULT_MAX_DEPTH, DEFAULT_ROUNDS

JOB = "xgb_histogram"
BASELINES = ("centralized", "native_distributed")
# One FLARE aux message per XGBoost collective operation (per_msg_timeout == tx_timeout makes ReliableMessage
# send a plain request/reply instead of request + ack + separate reply + query). See README: "Where the time goes".
PER_MSG_TIMEOUT = 600.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_data_args(p)
    add_partition_args(p, sites=3)
    g = p.add_argument_group("XGBoost")
    g.add_argument("--mode", choices=["horizontal", "vertical"], default="horizontal",
                   help="horizontal: rows split among sites; vertical: columns split, site-1 holds the label")
    g.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="boosting rounds")
    g.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH)
    g.add_argument("--eta", type=float, default=DEFAULT_ETA)
    g.add_argument("--nthread", type=int, default=1,
                   help="XGBoost threads per site (the simulator runs all sites on this machine)")
    g.add_argument("--early-stopping-rounds", type=int, default=0, help="0 = off")
    g.add_argument("--encrypt", action="store_true",
                   help="not supported here (fails): use jobs/vertical_tree for encrypted vertical training")
    g.add_argument("--baselines", default="centralized,native_distributed",
                   help="comma-separated subset of centralized,native_distributed ('' for none)")
    g.add_argument("--messaging", choices=["direct", "reliable"], default="direct",
                   help="direct: one FLARE request/reply per XGBoost operation; reliable: NVFlare's default "
                        "ReliableMessage exchange (request, ack, reply, acks)")
    g.add_argument("--timing-dir", type=Path, help=argparse.SUPPRESS)  # benchmarks: loader timestamps
    add_run_args(p)
    return p


def check_args(args) -> None:
    if args.encrypt:
        raise SystemExit(f"error: {ENCRYPT_MESSAGE}")
    shared_check_args(args)  # every numeric argument, as the other jobs check theirs (DataError: exit 2)
    if args.mode == "vertical" and args.sites < 2:
        raise SystemExit("error: --mode vertical needs --sites >= 2 (site-1 holds the label, the others columns)")
    unknown = [b for b in parse_baselines(args.baselines) if b not in BASELINES]
    if unknown:
        raise SystemExit(f"error: --baselines: unknown {unknown}; choose from {list(BASELINES)}")
    try:
        check_federated_build()
    except XGBSetupError as exc:
        raise SystemExit(f"error: {exc}") from None


def parse_baselines(text: str) -> list[str]:
    return [b.strip() for b in (text or "").split(",") if b.strip()]


def prepare(table, args) -> tuple[Path, object]:
    """Write the federation folder DIR/federation and return (its path, the Federation)."""
    args.vertical, args.passive = args.mode == "vertical", args.sites - 1  # vertical: ids generated if absent
    fed = prepare_from_args(table, args)
    fed_dir = Path(args.workspace).resolve() / "federation"
    write_federation(fed, fed_dir, overwrite=True)
    return fed_dir, fed


def build_recipe(fed_dir: Path, fed, params: dict, args, sites: list[str]):
    """NVFlare's XGB recipe with our data loader on every site."""
    from nvflare.app_opt.xgboost.histogram_based_v2.fed_executor import FedXGBHistogramExecutor
    from nvflare.app_opt.xgboost.recipes import XGBHorizontalRecipe, XGBVerticalRecipe
    from nvflare.recipe import set_per_site_config

    from treeflare.flare.xgb_data_loader import TreeflareXGBDataLoader

    per_msg, tx = (PER_MSG_TIMEOUT, PER_MSG_TIMEOUT) if args.messaging == "direct" else (60.0, 600.0)
    vertical = args.mode == "vertical"

    def add_client_components(recipe, job, site_name, site_config):
        # The recipes' own method, with the executor's message timeouts exposed (see PER_MSG_TIMEOUT).
        from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
        from nvflare.app_opt.tracking.tb.tb_writer import TBWriter

        executor = FedXGBHistogramExecutor(data_loader_id=recipe.data_loader_id,
                                           metrics_writer_id=recipe.metrics_writer_id,
                                           per_msg_timeout=per_msg, tx_timeout=tx, in_process=True,
                                           model_file_name="model.json")
        job.to(executor, site_name, id="xgb_executor", tasks=["config", "start"])
        job.to(TBWriter(event_type="analytix_log_stats"), site_name, id=recipe.metrics_writer_id)
        job.to(ConvertToFedEvent(events_to_convert=["analytix_log_stats"], fed_event_prefix="fed."), site_name,
               id="event_to_fed")
        job.to(site_config["data_loader"], site_name, id=recipe.data_loader_id)

    base = XGBVerticalRecipe if vertical else XGBHorizontalRecipe
    recipe_cls = type(f"Treeflare{base.__name__}", (base,), {"_add_client_components": add_client_components})
    common = dict(name=JOB, min_clients=len(sites), num_rounds=args.rounds,
                  early_stopping_rounds=args.early_stopping_rounds, xgb_params=params)
    if vertical:
        # rank order == site order == the schema's column order, so the model's features are in schema order
        recipe = recipe_cls(label_owner=sites[0], client_ranks={s: i for i, s in enumerate(sites)},
                            model_file_name="model.json", **common)
    else:
        recipe = recipe_cls(**common)
    timing = str(args.timing_dir.resolve()) if args.timing_dir else None
    loader_cfg = {s: {"data_loader": TreeflareXGBDataLoader(folder=str(fed_dir), schema=fed.schema.to_dict(),
                                                            vertical=vertical, timing_dir=timing)}
                  for s in sites}
    set_per_site_config(recipe, loader_cfg)
    return recipe


def find_site_model(server_run_dir: Path, site: str = "site-1", name: str = "model.json") -> Path:
    """Where the site's model.json landed (models stay at the sites in XGB histogram training)."""
    from treeflare.flare.runner import find_site_file

    path = find_site_file(server_run_dir, site, name)
    if path is None:
        raise FileNotFoundError(f"no {name} from {site} near {server_run_dir}; the site keeps its model in its own "
                                f"workspace (<site>/<job id>/{name})")
    return path


def flare_train_seconds(timing_dir: Path | None, model_path: Path) -> float | None:
    """Training phase: last site done loading data -> model saved (needs the loader's timestamps)."""
    if not timing_dir or not Path(timing_dir).is_dir():
        return None
    stamps = [json.loads(p.read_text()) for p in Path(timing_dir).glob("site-*.json")]
    if not stamps:
        return None
    return model_path.stat().st_mtime - max(s["load_end"] for s in stamps)


def run(args, table=None) -> dict:
    """The whole job; returns the report (also written to DIR/report.json)."""
    import xgboost as xgb

    check_args(args)
    t_all = time.perf_counter()
    timings: dict[str, float | None] = {}
    workspace = Path(args.workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    if table is None:
        table = load_table(args)
    t = time.perf_counter()
    fed_dir, fed = prepare(table, args)
    timings["prepare_data"] = time.perf_counter() - t
    sites = fed.site_names
    n_classes = len(fed.schema.classes)
    params = make_params(n_classes, max_depth=args.max_depth, eta=args.eta, nthread=args.nthread, seed=args.seed)

    if args.timing_dir is None and args.env in ("sim", "poc"):  # sites on this machine: time the training phase
        args.timing_dir = workspace / "flare" / "timing"
    recipe = build_recipe(fed_dir, fed, params, args, sites)
    job = recipe_job(recipe)
    ship_package(job, sites)
    if args.timing_dir:
        shutil.rmtree(args.timing_dir, ignore_errors=True)
    t = time.perf_counter()
    server_run_dir = run_job(job, args, sites)  # exits here with --export
    timings["flare_run"] = time.perf_counter() - t

    model_src = find_site_model(server_run_dir, sites[0])
    timings["flare_train"] = flare_train_seconds(args.timing_dir, model_src)
    model_path = workspace / "model.json"
    shutil.copyfile(model_src, model_path)
    tb_src = Path(server_run_dir) / "tb_events"
    if tb_src.is_dir():
        shutil.copytree(tb_src, workspace / "tb_events", dirs_exist_ok=True)

    booster = xgb.Booster(model_file=str(model_path))
    test = global_test(fed_dir)
    global_metrics, proba = score_booster(booster, test, n_classes)

    baselines: dict[str, dict | None] = {b: None for b in BASELINES}
    comparison: dict[str, dict] = {}
    wanted = parse_baselines(args.baselines)
    from treeflare.xgb import baselines as bl

    if "centralized" in wanted:
        c = bl.centralized(fed_dir, params, args.rounds)
        baselines["centralized"] = c["metrics"]
        timings["centralized_train"] = c["train_s"]
        comparison["centralized"] = {"metric_diff": metric_diffs(global_metrics, c["metrics"]),
                                     "max_abs_pred_diff": float(abs(proba - c["proba"]).max())}
    if "native_distributed" in wanted:
        n = bl.native_distributed(fed_dir, params, args.rounds)
        baselines["native_distributed"] = n["metrics"]
        timings["native_train"] = n["train_s"]
        timings["native_wall"] = n["wall_s"]
        comparison["native_distributed"] = {"metric_diff": metric_diffs(global_metrics, n["metrics"]),
                                            "max_abs_pred_diff": float(abs(proba - n["proba"]).max())}
    timings["total"] = time.perf_counter() - t_all

    report = {
        "job": JOB,
        "dataset": table.name or "csv",
        "mode": args.mode,
        "n_sites": len(sites),
        "params": {"rounds": args.rounds, "max_depth": args.max_depth, "eta": args.eta, "nthread": args.nthread,
                   "early_stopping_rounds": args.early_stopping_rounds, "seed": args.seed,
                   "partition": args.partition if args.mode == "horizontal" else "vertical",
                   "alpha": args.alpha, "n_classes": n_classes, "classes": list(fed.schema.classes),
                   "xgb_params": params, "env": args.env, "messaging": args.messaging},
        "global": global_metrics,
        "baselines": baselines,
        "comparison": comparison,
        "timings_s": timings,
        "files": {"model": str(model_path), "federation": str(fed_dir), "flare_run_dir": str(server_run_dir),
                  "tb_events": str(workspace / "tb_events")},
        "n_test": int(len(test.y)),
    }
    write_json_atomic(workspace / "report.json", report)
    print(summary_table(report))
    return report


def summary_table(report: dict) -> str:
    keys = metric_keys(report["params"]["n_classes"])
    rows = [["NVFlare " + report["mode"], *[report["global"][k] for k in keys]]]
    for name, m in report["baselines"].items():
        if m:
            rows.append([name, *[m[k] for k in keys]])
    t = report["timings_s"]
    times = ", ".join(f"{k} {v:.1f}s" for k, v in t.items() if isinstance(v, (int, float)))
    return (f"{report['job']} on {report['dataset']} ({report['mode']}, {report['n_sites']} sites, "
            f"{report['params']['rounds']} rounds)\n" + format_table(["model", *keys], rows) + f"\ntimings: {times}")


@main_guard
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.encrypt:  # before any work, and whatever else was asked
        print(f"error: {ENCRYPT_MESSAGE}", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
