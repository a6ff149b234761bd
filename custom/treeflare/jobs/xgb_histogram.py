#!/usr/bin/env python
"""Federated XGBoost, histogram-based, horizontal or vertical, driven by NVFlare.

    treeflare xgb --dataset adult --sites 3 --rounds 50 --workspace out/xgb_adult
    treeflare xgb --dataset nursery --mode vertical --overlap 0.8 --sites 3 --workspace out/xgb_nv
    treeflare xgb --schema discover --label y --sites 3 --env poc --workspace out/xgb_sites
    treeflare xgb --engine treeflare --dataset adult --sites 3 --workspace out/xgb_engine

Two engines (--engine): xgboost (the default) drives XGBoost's federated communicator, which needs its federated
plugin (XGBoost 3.4 removed it); treeflare is our own histogram boosting (``treeflare.xgb.engine``): the sites'
histograms pairwise-masked so that the server sees only their sum, the same trees as XGBoost's hist on the same
bins, a native model.json, horizontal only, on the engine's own connections to --xgb-port.

Two transports for XGBoost's collective operations (--transport, --engine xgboost):
  direct (default)  the server starts XGBoost's own federated gRPC server (--xgb-port) and every site's XGBoost
                    connects straight to it: NVFlare launches and supervises, XGBoost carries the histograms.
                    Mutual TLS with the startup kits' certificates in POC and on provisioned sites.
  flare             NVFlare's histogram_based_v2 recipes: every collective operation is relayed through NVFlare
                    messaging, for sites that can reach only the FL port.

Steps: prepare the federation folder under --workspace with the data layer; build the job with our
TreeflareXGBDataLoader (vertical: after a PSI phase, ``treeflare.flare.psi``, whose workflows run before training's,
so every party trains on exactly the ids all parties hold, sorted by id; both transports); ship the treeflare
package as custom code; run it (simulator, POC or a provisioned system); then score the global model on the
server's test set, compute the centralized and XGBoost-native distributed baselines, and write report.json (with
the PSI phase's sizes, seconds and bytes under "psi" in vertical mode), model.json (with the training schema inside,
for treeflare predict) and tb_events/. While FLARE runs, one progress line per boosting round (rank 0's eval metric,
elapsed time, an estimate of what is left) is printed (on a terminal or with --progress: every round; otherwise
one per 10% of the rounds; --quiet: none).

(Over 400 lines: one script for both engines, both transports and both split modes, as the design card asks for one
job script per job; the FLARE components it wires live in ``treeflare.flare``.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from treeflare.cli import Parser, make_workspace
from treeflare.cli import add_data_args, add_overlap_arg, add_partition_args, add_schema_args, load_table, main_guard, \
    prepare_from_args
from treeflare.cli import check_args as shared_check_args
from treeflare.cli import overlap_of, schema_source
from treeflare.data import site_name, write_federation
from treeflare.data.intersection import DEFAULT_MIN_ROWS
from treeflare.psi.options import add_psi_args
from treeflare.flare.progress import PROGRESS_ID, add_progress_args, printer_for
from treeflare.flare.runner import add_run_args, one_poc, run_job
from treeflare.flare.site_config import add_binding_arg
from treeflare.flare.xgb.protocol import job_ranks
from treeflare.flare.xgb.progress import XGBRoundProgress
from treeflare.console import format_table, outputs_text
from treeflare.files import write_json_atomic
from treeflare.xgb import ENCRYPT_MESSAGE, XGBSetupError, check_federated_build, make_params, metric_keys
from treeflare.xgb.encoding import global_test
from treeflare.xgb.eval_log import eval_metric_names, last_round_eval
from treeflare.xgb.metrics import metric_diffs, score_booster
from treeflare.xgb.model import save_document_with_schema, save_with_schema
from treeflare.xgb.fedserver import DEFAULT_XGB_PORT, MAX_PORT, FederatedServerError, check_port
from treeflare.xgb.params import DEFAULT_ETA, DEFAULT_MAX_DEPTH, DEFAULT_ROUNDS

JOB = "xgb_histogram"
BASELINES = ("centralized", "native_distributed")
# whose rows XGBoost's per-round eval covers (each site's test.csv is its eval set; XGBoost evaluates collectively)
VALIDATION_ROWS = {"horizontal": "every site's validation rows (test.csv), evaluated collectively",
                   "vertical": "the validation rows (test.csv) every party holds, as PSI found them, labelled by "
                               "the label owner"}


def build_parser() -> Parser:
    p = Parser(description=__doc__.split("\n\n")[0])
    add_data_args(p)
    add_schema_args(p)
    add_partition_args(p, sites=3)
    g = p.add_argument_group("XGBoost")
    g.add_argument("--engine", choices=["xgboost", "treeflare"], default="xgboost",
                   help="xgboost: XGBoost's federated communicator (needs its federated plugin, which XGBoost 3.4 "
                        "removed); treeflare: our histogram boosting, where the server sees only the sum of the "
                        "sites' histograms (pairwise masks), horizontal only, any XGBoost >= 2.0")
    g.add_argument("--workers", default="0",
                   help="--engine treeflare: where each site's row work runs: N local processes or dask-local:N (a "
                        "local Dask cluster); a site's $TREEFLARE_XGB_WORKERS overrides it and alone may name its "
                        "own scheduler, dask://HOST:PORT. The model is the same whichever")
    g.add_argument("--mode", choices=["horizontal", "vertical"], default="horizontal",
                   help="horizontal: rows split among sites; vertical: columns split, site-1 holds the label")
    add_overlap_arg(g)  # --mode vertical only
    g.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="boosting rounds")
    g.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH, help="depth of each boosted tree")
    g.add_argument("--eta", type=float, default=DEFAULT_ETA, help="learning rate (shrinkage of each tree)")
    g.add_argument("--nthread", type=int, default=1,
                   help="XGBoost threads per site (the simulator runs all sites on this machine)")
    g.add_argument("--early-stopping-rounds", type=int, default=0, help="0 = off")
    g.add_argument("--encrypt", action="store_true",
                   help="not supported here (fails): use `treeflare vertical` for encrypted vertical training")
    g.add_argument("--baselines", default="centralized,native_distributed",
                   help="comma-separated subset of centralized,native_distributed ('' for none)")
    g.add_argument("--transport", choices=["direct", "flare"], default="direct",
                   help="direct: sites' XGBoost connects straight to XGBoost's federated server on the FL server "
                        "host (port --xgb-port); flare: every XGBoost operation relayed through NVFlare messaging "
                        "(only the FL port needed)")
    g.add_argument("--xgb-port", type=int, default=DEFAULT_XGB_PORT,
                   help="direct: port of XGBoost's federated server on the FL server host (binds 0.0.0.0; open it "
                        "to the sites only); 0 = any free port (simulator)")
    g.add_argument("--xgb-server-host", default="",
                   help="direct: host name the sites' XGBoost connects to (default: each site's FL server host "
                        "from its startup kit, or its $TREEFLARE_XGB_SERVER_HOST; localhost in the simulator). "
                        "With TLS it must be a name in the server certificate")
    g.add_argument("--xgb-connect-timeout", type=float, default=30.0,
                   help="direct: seconds a site waits for the XGBoost port before failing")
    g.add_argument("--xgb-train-timeout", type=float, default=3600.0,
                   help="direct: seconds the whole XGBoost training may take")
    g.add_argument("--xgb-heartbeat-timeout", type=float, default=120.0,
                   help="direct: a site silent this long during training (died, froze, cut off) fails the job")
    g.add_argument("--messaging", choices=["direct", "reliable"], default="direct",
                   help="--transport flare only: direct = one FLARE request/reply per XGBoost operation; reliable "
                        "= NVFlare's default ReliableMessage exchange (request, ack, reply, acks)")
    g.add_argument("--data-root", default=None,
                   help="the sites' data folder as the sites see it, <DIR>/<site>/{train,test}.csv (default: the "
                        "folder this script prepares; a site's own binding, local/treeflare_site.json, wins)")
    add_binding_arg(g)
    g.add_argument("--task-timeout", type=int, default=300, help="seconds each site has for schema discovery")
    g.add_argument("--psi-min-rows", type=int, default=DEFAULT_MIN_ROWS,
                   help="vertical: the fewest training rows the parties' intersection (PSI) may hold; fewer fails "
                        "the job before any training")
    add_psi_args(g)
    g.add_argument("--timing-dir", type=Path, help=argparse.SUPPRESS)  # benchmarks: loader timestamps
    # benchmarks: --engine treeflare's requests as FLARE aux messages or tasks instead of on its own connections
    g.add_argument("--engine-messaging", choices=["direct", "aux", "task"], default="direct", help=argparse.SUPPRESS)  # benchmarks: loader timestamps
    add_run_args(p)
    add_progress_args(p)
    return p


def check_args(args) -> None:
    if args.encrypt:
        raise SystemExit(f"error: {ENCRYPT_MESSAGE}")
    shared_check_args(args)  # every numeric argument, as the other jobs check theirs (DataError: exit 2)
    if args.engine == "treeflare":
        check_engine_args(args)
        shared_check_args(args)
        return
    if args.mode == "vertical" and args.sites < 2:
        raise SystemExit("error: --mode vertical needs --sites >= 2 (site-1 holds the label, the others columns)")
    if args.psi_min_rows < 1:
        raise SystemExit(f"error: --psi-min-rows must be >= 1, got {args.psi_min_rows}")
    if args.transport == "direct":
        check_xgb_port(args)
        if min(args.xgb_connect_timeout, args.xgb_train_timeout, args.xgb_heartbeat_timeout) <= 0:
            raise SystemExit("error: --xgb-connect-timeout, --xgb-train-timeout and --xgb-heartbeat-timeout must "
                             "be > 0")
        from treeflare.flare.xgb.protocol import ProtocolError, check_host

        try:
            check_host(args.xgb_server_host)
        except ProtocolError as exc:
            raise SystemExit(f"error: --xgb-server-host: {exc}") from None
    unknown = [b for b in parse_baselines(args.baselines) if b not in BASELINES]
    if unknown:
        raise SystemExit(f"error: --baselines: unknown {unknown}; choose from {list(BASELINES)}")
    try:
        check_federated_build()
    except XGBSetupError as exc:
        raise SystemExit(f"error: --engine xgboost: {exc}; or train with --engine treeflare, which needs no "
                         "plugin") from None


def check_xgb_port(args) -> None:
    """--xgb-port: XGBoost's federated server (--transport direct) or the engine's connections listen there."""
    if not 0 <= args.xgb_port <= MAX_PORT:
        raise SystemExit(f"error: --xgb-port must be a port number in 1..{MAX_PORT} (or 0 for any free port), "
                         f"got {args.xgb_port}")
    if args.xgb_port and args.env in ("sim", "poc") and not args.export:
        try:  # the FL server runs on this machine: fail before anything starts
            check_port(args.xgb_port)
        except FederatedServerError as exc:
            raise SystemExit(f"error: {exc}") from None


def check_engine_args(args) -> None:
    """--engine treeflare: horizontal only, at least 3 sites (a masked sum of two would show each its peer's)."""
    from treeflare.xgb.engine.secure import MIN_SITES

    if args.mode != "horizontal":
        raise SystemExit("error: --engine treeflare trains horizontal federations only; vertical XGBoost needs "
                         "--engine xgboost, or use `treeflare vertical` for encrypted vertical trees")
    from treeflare.crypto.workers import parse_workers

    if str(args.workers).strip().startswith("dask://"):
        raise SystemExit("error: --workers: a Dask scheduler address names where a site's rows go, so only the site "
                         "itself names one (its $TREEFLARE_XGB_WORKERS); a job may ask for N processes or "
                         "dask-local:N")
    try:
        args.workers = parse_workers(args.workers, "--workers")
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.engine_messaging == "direct":
        check_xgb_port(args)
    if args.sites < MIN_SITES:
        raise SystemExit(f"error: --engine treeflare needs --sites >= {MIN_SITES}: the server learns only the sum "
                         f"of the sites' histograms, and from a sum of two each site would read the other's")


def parse_baselines(text: str) -> list[str]:
    return [b.strip() for b in (text or "").split(",") if b.strip()]


def prepare(table, args) -> tuple[Path, object]:
    """Write the federation folder DIR/federation and return (its path, the Federation)."""
    args.vertical, args.passive = args.mode == "vertical", args.sites - 1  # vertical: ids generated if absent
    fed = prepare_from_args(table, args)
    fed_dir = Path(args.workspace).resolve() / "federation"
    write_federation(fed, fed_dir, overwrite=True)
    return fed_dir, fed


def data_loader(folder: str, schema, args, vertical: bool):
    """The sites' loader: ``folder``/<site>/ unless a site's own binding says otherwise, read against ``schema``."""
    from treeflare.flare.xgb.data_loader import TreeflareXGBDataLoader

    timing = str(args.timing_dir.resolve()) if args.timing_dir else None
    # vertical: the rows of the PSI phase's intersection only (the recipe adds that phase first)
    return TreeflareXGBDataLoader(folder=folder, schema=schema.to_dict(), vertical=vertical, timing_dir=timing,
                                  binding=args.binding, psi=vertical)


def psi_args(folder: str, schema, args) -> dict:
    """Vertical mode: the PSI phase's settings. Each party reads its own ids (its binding or ``folder``), keeps the
    intersection in its run folder, and the loader reads it there."""
    return dict(kinds=("train", "test"), data_root=folder, schema=schema, binding=args.binding,
                min_rows=args.psi_min_rows, task_timeout=args.task_timeout, method=args.psi,
                max_ratio=args.psi_max_ratio)


def build_recipe(folder: str, schema, params: dict, args, sites: list[str]):
    """The job's :class:`~treeflare.flare.xgb.recipe.XGBHistogramRecipe` from the command's options, with our data
    loader on every site; ``--transport`` picks XGBoost's own server (direct) or NVFlare's relay (flare)."""
    from treeflare.flare.xgb.recipe import XGBHistogramRecipe

    vertical = args.mode == "vertical"
    engine = None
    if args.engine == "treeflare":
        engine = {"params": engine_params(schema, args).to_dict(), "n_features": len(schema.feature_names),
                  "feature_names": list(schema.feature_names), "task_timeout": args.task_timeout,
                  "workers": args.workers, "messaging": args.engine_messaging, "port": args.xgb_port,
                  "server_host": args.xgb_server_host, "connect_timeout": args.xgb_connect_timeout}
    return XGBHistogramRecipe(
        sites=sites, xgb_params=params, num_rounds=args.rounds, early_stopping_rounds=args.early_stopping_rounds,
        data_loader=lambda: data_loader(folder, schema, args, vertical), vertical=vertical,
        transport=args.transport, psi=psi_args(folder, schema, args) if vertical else None,
        direct={"port": args.xgb_port, "server_host": args.xgb_server_host, "train_timeout": args.xgb_train_timeout,
                "heartbeat_timeout": args.xgb_heartbeat_timeout, "connect_timeout": args.xgb_connect_timeout},
        messaging=args.messaging, name=JOB, engine=engine)


def engine_params(schema, args):
    """--engine treeflare's parameters: XGBoost's defaults but for the command's rounds, depth, eta and early
    stopping (binary:logistic for two classes, multi:softprob otherwise)."""
    from treeflare.xgb.engine.params import BoostParams

    k = len(schema.classes)
    return BoostParams(objective="binary:logistic" if k == 2 else "multi:softprob", num_class=0 if k == 2 else k,
                       rounds=args.rounds, max_depth=args.max_depth, eta=args.eta,
                       early_stopping_rounds=args.early_stopping_rounds)


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
    make_workspace(workspace)  # removed again, if still empty, when the command fails
    vertical = args.mode == "vertical"
    fed_dir, schema_info = None, {"schema": "the submitter's data"}  # no federation folder: the sites hold the data
    t = time.perf_counter()
    if table is not None or schema_source(args) == "data":
        table = load_table(args) if table is None else table
        fed_dir, fed = prepare(table, args)
        sites, schema, dataset = fed.site_names, fed.schema, table.name or "csv"
    else:
        sites, schema, dataset = [site_name(i) for i in range(args.sites)], None, "the sites' own data"
    timings["prepare_data"] = time.perf_counter() - t
    folder = args.data_root or (str(fed_dir) if fed_dir else "")

    if args.timing_dir is None and args.env in ("sim", "poc"):  # sites on this machine: time the training phase
        args.timing_dir = workspace / "flare" / "timing"
    with one_poc(args, sites):  # one POC for both jobs of --schema discover
        if schema is None:
            from treeflare.flare.discovery.job import sites_schema

            t = time.perf_counter()
            # vertical: site-1, the label owner and rank 0, comes first, so the schema's columns are in rank order
            schema, schema_info = sites_schema(args, sites, data_root=args.data_root or "", vertical=vertical)
            timings["schema_discovery"] = time.perf_counter() - t
        n_classes = len(schema.classes)
        params = make_params(n_classes, max_depth=args.max_depth, eta=args.eta, nthread=args.nthread,
                             seed=args.seed)
        recipe = build_recipe(folder, schema, params, args, sites)
        # per-round progress from the server's side (rank 0's eval metric), printed while FLARE runs
        recipe.add_to_server(XGBRoundProgress(site=sites[0], rounds=args.rounds, metric=params["eval_metric"]),
                             id=PROGRESS_ID)
        if args.timing_dir:
            shutil.rmtree(args.timing_dir, ignore_errors=True)
        t = time.perf_counter()
        server_run_dir = run_job(recipe, args, sites, progress=printer_for(args))  # exits here with --export
        timings["flare_run"] = time.perf_counter() - t

    from treeflare.flare.runner import read_server_result

    psi = None
    if vertical:  # the PSI phase ran first: its failure (naming the site) is the report
        from treeflare.flare.psi.protocol import RESULT_FILE as PSI_RESULT_FILE

        psi = read_server_result(server_run_dir, PSI_RESULT_FILE, workspace, JOB)
        if psi is None:
            raise SystemExit(1)
        # the phase's wall time as the server saw it (its workflows' seconds); each party's own PSI seconds are in
        # report["psi"]["parties"]
        phases = [v for v in (psi.get("timings_s") or {}).values() if isinstance(v, (int, float))]
        timings["psi"] = sum(phases) if phases else None
    server = None
    if args.engine == "treeflare":
        from treeflare.flare.xgb.engine_controller import MODEL_FILE as ENGINE_MODEL, RESULT_FILE as ENGINE_RESULT

        server = read_server_result(server_run_dir, ENGINE_RESULT, workspace, JOB)
        if server is None:
            raise SystemExit(1)
        model_src = Path(server_run_dir) / ENGINE_MODEL
    elif args.transport == "direct":
        from treeflare.flare.xgb.controller import RESULT_FILE

        server = read_server_result(server_run_dir, RESULT_FILE, workspace, JOB)
        if server is None:  # the failed result is the report (status, error); the reason went to stderr
            raise SystemExit(1)
    if args.engine != "treeflare":
        model_src = find_site_model(server_run_dir, sites[0])
    if server is not None:
        timings["flare_train"] = server["timings_s"].get("train")
        if args.engine == "treeflare":  # the sites' data loading, in the engine's setup request
            timings["flare_setup"] = server["timings_s"].get("setup")
        else:
            timings["flare_server_start"] = server["timings_s"].get("server_start")
    else:
        timings["flare_train"] = flare_train_seconds(args.timing_dir, model_src)
    model_path = workspace / "model.json"
    # the schema travels in the model (the direct transport's sites already put it there; NVFlare's recipes do not)
    ranks = (server or {}).get("ranks") or ({} if args.engine == "treeflare" else job_ranks(sites))
    if args.engine == "treeflare":  # our document as written: XGBoost 2.0's layout, which every later one reads
        save_document_with_schema(json.loads(Path(model_src).read_text()), model_path, schema, args.mode)
    else:
        save_with_schema(model_src, model_path, schema, args.mode, ranks)
    tb_src = Path(server_run_dir) / "tb_events"
    if tb_src.is_dir():
        shutil.copytree(tb_src, workspace / "tb_events", dirs_exist_ok=True)
    # what the sites' validation rows say at the last round: the only metric when the sites hold the data
    eval_metrics = eval_metric_names(params)
    if args.engine == "treeflare":  # the engine's validation loss is pooled over every site's rows by masked sums
        validation = engine_validation(server)
    else:
        validation = {"rows": VALIDATION_ROWS[args.mode], "metrics": eval_metrics,
                      "sites": last_round_eval(tb_src, sites, eval_metrics, args.rounds) if tb_src.is_dir() else {}}

    global_metrics, proba, test = None, None, None
    if fed_dir is not None:  # the global test set and the baselines need the rows this script partitioned
        booster = xgb.Booster(model_file=str(model_path))
        test = global_test(fed_dir)
        global_metrics, proba = score_booster(booster, test, n_classes)

    baselines: dict[str, dict | None] = {b: None for b in BASELINES}
    comparison: dict[str, dict] = {}
    wanted = parse_baselines(args.baselines) if fed_dir is not None else []
    skipped: dict[str, str] = {}
    if "native_distributed" in wanted and vertical and overlap_of(args) < 1:
        # XGBoost's native column split reads each party's whole train.csv: with parties holding different
        # customers it would pair different customers' rows, a baseline of nothing
        wanted.remove("native_distributed")
        skipped["native_distributed"] = ("the parties hold different rows (--overlap below 1) and XGBoost's "
                                         "native column split has no intersection step")
    from treeflare.xgb import baselines as bl

    if "native_distributed" in wanted and args.engine == "treeflare":
        try:
            check_federated_build()
        except XGBSetupError:
            wanted.remove("native_distributed")
            skipped["native_distributed"] = "this XGBoost has no federated plugin"
    if "centralized" in wanted:
        # the engine's reference: XGBoost's hist on the pooled rows, the same parameters and base score, category
        # codes as numbers (as the engine splits them)
        c = (bl.centralized(fed_dir, engine_params(schema, args).xgb_params(engine_base_score(model_path)),
                            args.rounds, numeric=True)
             if args.engine == "treeflare" else bl.centralized(fed_dir, params, args.rounds))
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
        "dataset": dataset,
        "schema_source": schema_info,
        "mode": args.mode,
        "n_sites": len(sites),
        "params": {"rounds": args.rounds, "max_depth": args.max_depth, "eta": args.eta, "nthread": args.nthread,
                   "early_stopping_rounds": args.early_stopping_rounds, "seed": args.seed,
                   **({"psi_min_rows": args.psi_min_rows} if vertical else {}),
                   **partition_params(args, split_here=fed_dir is not None), "n_classes": n_classes,
                   "classes": list(schema.classes),
                   "xgb_params": params, "env": args.env, "transport": args.transport, "engine": args.engine,
                   **({"xgb_port": args.xgb_port, "xgb_server_host": args.xgb_server_host or None}
                      if args.transport == "direct" else {"messaging": args.messaging})},
        "transport": _transport_report(args, server),
        **({"psi": psi} if psi is not None else {}),
        "global": global_metrics,
        "validation": validation,
        "baselines": baselines,
        **({"baselines_skipped": skipped} if skipped else {}),
        "comparison": comparison,
        "timings_s": timings,
        "files": {"model": str(model_path), "federation": str(fed_dir) if fed_dir else None,
                  "flare_run_dir": str(server_run_dir),
                  "tb_events": str(workspace / "tb_events")},
        "n_test": int(len(test.y)) if test is not None else None,
    }
    write_json_atomic(workspace / "report.json", report)
    print(summary_table(report))
    print(outputs_text({"report": workspace / "report.json", "model": model_path,
                        "per-round metrics (TensorBoard)": workspace / "tb_events", "federation": fed_dir,
                        "schema (discovered)": schema_info.get("schema_file")
                        if schema_info.get("schema") == "discovered" else None,
                        "FLARE run folder": server_run_dir}))
    return report


def partition_params(args, split_here: bool) -> dict:
    """How this script split the submitter's data among the sites (``split_here``); nothing when the sites hold
    their own. ``alpha`` only for the Dirichlet partitions, ``overlap`` only for a partial vertical one."""
    if not split_here:
        return {}
    if args.mode == "vertical":  # overlap (below 1 only): each party's share of its training rows all parties hold
        return {"partition": "vertical", **({"overlap": overlap_of(args)} if overlap_of(args) < 1 else {})}
    return {"partition": args.partition, **({"alpha": args.alpha} if args.partition != "iid" else {})}


def engine_validation(server: dict) -> dict:
    """--engine treeflare's validation record: its metric after each round, on every site's validation rows pooled
    (masked sums), as the server computed it for early stopping."""
    history = [float(v) for v in server.get("validation_history") or []]
    return {"rows": "every site's validation rows (test.csv), pooled by masked sums", "metrics":
            [server.get("eval_metric")], "pooled": {"history": history,
                                                    "best_iteration": server.get("best_iteration")}}


def engine_base_score(model_path) -> float:
    """The base score the engine agreed (from the pooled labels), read back from its model."""
    doc = json.loads(Path(model_path).read_text())
    return float(str(doc["learner"]["learner_model_param"]["base_score"]).strip("[]"))


def _transport_report(args, server: dict | None) -> dict:
    """How XGBoost's operations travelled, and what listened where (from the server's result for direct)."""
    if args.engine == "treeflare":
        return {"name": "flare tasks", "engine": "treeflare", "requests": server.get("requests"),
                "values_summed": server.get("values_summed"), "rounds": server.get("rounds"),
                "best_iteration": server.get("best_iteration"), "grad_bits": server.get("grad_bits"),
                "validation_history": server.get("validation_history")}
    if server is None:
        return {"name": "flare", "messaging": args.messaging,
                "listeners": "the sites need only NVFlare's FL port; the FL server also runs XGBoost's federated "
                             "server for its own relay, without TLS, on 0.0.0.0:<ephemeral port> during training"}
    return {"name": "direct", "ranks": server.get("ranks"), "federated_server": server.get("federated_server"),
            "federated_server_stopped": server.get("federated_server_stopped"),
            "models_identical": server.get("models_identical"), "sites": server.get("sites"),
            "heartbeats": server.get("heartbeats")}


def summary_table(report: dict) -> str:
    keys = metric_keys(report["params"]["n_classes"])
    g = report["global"] or {}  # none without a global test set (the sites hold the data)
    how = "engine treeflare" if report["params"].get("engine") == "treeflare" else report["params"]["transport"]
    rows = [[f"NVFlare {report['mode']} ({how})", *[g.get(k) for k in keys]]]
    for name, m in report["baselines"].items():
        if m:
            rows.append([name, *[m[k] for k in keys]])
    heading, note = "model", ""
    validation = report.get("validation") or {}
    pooled = validation.get("pooled")
    if not report["global"] and pooled is not None:  # --engine treeflare: its pooled validation metric
        metric = (validation.get("metrics") or ["eval"])[0]
        history = pooled.get("history") or []
        keys = [metric]
        rows = [[f"NVFlare {report['mode']} ({how}), every site's validation rows pooled, round {len(history)}",
                 history[-1] if history else None]]
        heading = "model (the sites' validation rows)"
        note = "\nno global test set here: the sites hold the data; the metric is the engine's, on every site's " \
               "validation rows pooled by masked sums (each round: report.json validation.pooled.history)"
    elif not report["global"]:  # no global test set: each site's eval at the last round, on the validation rows
        sites = validation.get("sites") or {}
        # the columns the sites' eval holds (XGBoost's eval metric, not accuracy): no column left blank
        keys = list(dict.fromkeys(k for m in sites.values() for k in m if k != "round")) or keys
        rows = [[f"NVFlare {report['mode']} ({report['params']['transport']}), {site}'s eval, round {m['round']}",
                 *[m.get(k) for k in keys]] for site, m in sites.items()]
        heading = "model (each site's validation rows)"
        whose = validation.get("rows") or "the sites' validation rows"
        note = (f"\nno global test set here: the sites hold the data; eval = XGBoost's per-round metric on "
                f"{whose} (every round: tb_events/)" if rows else
                "\nno global test set here, and no site's eval metrics arrived (tb_events/ is empty)")
    t = report["timings_s"]
    times = ", ".join(f"{k} {v:.1f}s" for k, v in t.items() if isinstance(v, (int, float)))
    return (f"{report['job']} on {report['dataset']} ({report['mode']}, {report['n_sites']} sites, "
            f"{report['params']['rounds']} rounds)\n" + format_table([heading, *keys], rows) + f"\ntimings: {times}"
            + note)


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
