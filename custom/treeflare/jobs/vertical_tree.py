"""Vertical federated decision trees with packed Paillier encryption, on NVFlare.

Sites hold different columns of rows joined on an id column, and not all the same rows: the job starts with a
private set intersection (NVFlare's DH-PSI, ``treeflare.flare.psi``) after which each party keeps, in its own
workspace, the ids every party holds, and trains on those rows only, sorted by id.  site-1 is the active
party (labels + private key), site-2.. are passive (feature columns only).  The server routes
messages: it never sees an id, labels, gradients, feature values or passive thresholds, but it does see
the row-to-node assignments, partitions, prediction bits and test metrics (SECURITY.md lists all).

    treeflare vertical --model gbdt --dataset default_credit_card --passive 2 --overlap 0.8 \\
        --trees 3 --max-depth 3 --workspace /tmp/vtree

``--model gbdt`` picks its loss from the label (``--objective`` to choose): 2 classes -> binary
logistic, 3 to 20 -> softmax (one multi-output tree per round), a numeric label with more than 20
distinct values -> squared error.

On parties that hold their own columns (no --dataset/--csv here), the schema comes from the parties:

    treeflare vertical --schema discover --label default --id uid --passive 2 --env poc \\
        --workspace /tmp/vtree

Writes DIR/report.json (the PSI phase's row counts, seconds and bytes under "psi"; a centralised XGBoost baseline
of the same settings, on the intersection rows, when the submitter has the data) and (simulator) each party's model
file under DIR/models/.

Predictions on new rows are a federated job too (no party holds the whole model): every party loads only its own
part, the parties intersect their new rows' ids first (PSI), the rows every party holds are predicted, and the
active site gets the predictions and the number of its rows that could not be scored:

    treeflare vertical --predict /tmp/vtree --csv new.csv --workspace /tmp/vtree_pred

(--csv: split by columns like training, simulator and POC; on real sites leave it out: each site reads its own new
rows and model part from its binding.)  Writes DIR/predictions.csv (copied from the active site's run folder when
it is on this machine) and DIR/report.json.

(Over 400 lines: the script's arguments, the oracle and baseline inputs, the report and its summary belong to this
script alone; the prediction run lives in ``treeflare.flare.vertical.predict``.)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from treeflare.cli import Parser, make_workspace
from treeflare.cli import add_data_args, add_schema_args, add_vertical_args, check_args, load_table, main_guard, \
    overlap_of, schema_source
from treeflare.data import DataError, prepare_federation, read_site, site_name, write_federation
from treeflare.data.federation import SiteData
from treeflare.data.join import common_ids
from treeflare.data.intersection import DEFAULT_MIN_ROWS, restrict
from treeflare.psi.options import add_psi_args
from treeflare.crypto.workers import is_address
from treeflare.flare.progress import add_progress_args, printer_for
from treeflare.flare.vertical.executor import WORKERS_ENV
from treeflare.vertical.objectives import OBJECTIVES
from treeflare.console import format_table, outputs_text
from treeflare.files import write_json_atomic

JOB_NAME = "vertical_tree"
MAX_CLASSES = 20


def on_off(v: str) -> bool:
    v = v.strip().lower()
    if v not in ("on", "off"):
        raise argparse.ArgumentTypeError("expected on or off")
    return v == "on"


def workers_option(v: str):
    from treeflare.crypto.workers import parse_workers

    try:
        return parse_workers(v, "--workers")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> Parser:
    """The command's options (``treeflare vertical --help``); :func:`parse_args` checks them."""
    from treeflare.flare.runner import add_run_args
    from treeflare.flare.site_config import add_binding_arg

    p = Parser(description=__doc__.split("\n\n")[0])
    add_data_args(p, default_dataset="default_credit_card")
    add_schema_args(p)
    add_vertical_args(p, flag=False, passive=1)
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=["tree", "gbdt"], default="tree",
                   help="tree: classification tree (label one-hot slots); gbdt: gradient boosting")
    g.add_argument("--objective", choices=["auto", *OBJECTIVES], default="auto",
                   help="gbdt loss; auto (default): binary for 2 classes, softmax for 3-20, squared_error for a "
                        f"numeric label with more than {MAX_CLASSES} distinct values")
    g.add_argument("--min-rows-node", type=int, default=10,
                   help="a node with fewer rows is never split, and passive sites refuse to answer for it (default 10)")
    g.add_argument("--criterion", choices=["gini", "entropy"], default="gini", help="tree criterion")
    g.add_argument("--trees", type=int, default=None, help="boosting rounds (gbdt; default 3); tree: 1")
    g.add_argument("--max-depth", type=int, default=3, help="depth of each tree")
    g.add_argument("--bins", type=int, default=32,
                   help="candidate split points per numeric column (quantile bins)")
    g.add_argument("--learning-rate", type=float, default=0.3, help="gbdt: shrinkage of each tree's leaf values")
    g.add_argument("--lambda", dest="reg_lambda", type=float, default=1.0,
                   help="gbdt: L2 regularisation of the leaf values")
    g.add_argument("--min-child-weight", type=float, default=1.0,
                   help="gbdt: min hessian per child; tree: min rows per child")
    g.add_argument("--seed", type=int, default=0, help="seed of the global test hold-out")
    c = p.add_argument_group("encryption")
    c.add_argument("--key-bits", type=int, default=2048,
                   help="Paillier modulus bits: 2048 (default, ~112-bit security), 3072 (~128-bit, about 2.5x slower "
                        "encryption), 4096 (about 5x slower; key generation 1-3 minutes); docs/vertical.md has measured costs")
    c.add_argument("--scheme", choices=["paillier", "ou"], default="paillier",
                   help="paillier (default) or ou: Okamoto-Uchiyama, ciphertexts mod n instead of n^2 (faster, same "
                        "key sizes; SECURITY.md says why they give the same security)")
    c.add_argument("--precision", type=int, default=53, help="gbdt fixed-point bits (default 53)")
    c.add_argument("--packing", type=on_off, default=True, help="on|off: pack a row's values in one plaintext")
    c.add_argument("--compress", type=on_off, default=True, help="on|off: several results per returned ciphertext")
    c.add_argument("--obfuscation", choices=["full", "djn"], default="full",
                   help="full: fresh r^n (default); djn: short-exponent randomness (faster, extra assumption)")
    # validated by its own option type (N, or dask-local:N, a string)
    c.add_argument("--workers", type=workers_option, default=0,
                   help="crypto workers per site: N processes (0 = all cores) or dask-local:N (a local Dask cluster "
                        "of N processes); a site's $TREEFLARE_VERTICAL_WORKERS overrides it. dask://HOST:PORT (a "
                        "Dask scheduler): in the simulator only (the sites run here); real sites name their own "
                        "scheduler in $TREEFLARE_VERTICAL_WORKERS")
    c.add_argument("--allow-insecure-key", action="store_true",
                   help="permit --key-bits < 2048 (tests and comparisons only)")
    c.add_argument("--no-oracle", action="store_true", help="skip the plaintext-oracle comparison")
    c.add_argument("--no-baseline", action="store_true", help="skip the centralised XGBoost baseline")
    c.add_argument("--task-timeout", type=int, default=3600, help="seconds a site has for one message")
    c.add_argument("--psi-min-rows", type=int, default=DEFAULT_MIN_ROWS, metavar="N",
                   help=f"the fewest training rows the private set intersection must hold for training to start "
                        f"(default {DEFAULT_MIN_ROWS}: with fewer shared customers each aggregate the active site "
                        f"decrypts says a lot about each of them); --predict needs one row all parties hold")
    add_psi_args(c)
    c.add_argument("--data-root", default=None,
                   help="the sites' data folder as the sites see it (default: the folder this script prepares)")
    add_binding_arg(c)
    p.add_argument("--predict", metavar="MODEL_DIR", type=Path, default=None,
                   help="predict on new rows with a trained model instead of training: MODEL_DIR is the training "
                        "run's --workspace. New rows: --csv (split by columns like training; simulator/POC; "
                        "--dataset NAME: that embedded dataset's rows), or each site's own file (its binding's "
                        "'predict', default predict.csv in its data folder, beside its model part)")
    p.add_argument("--raw-text", action="store_true",
                   help="with --predict: write the predictions' text cells (ids, classes) as they are, without the "
                        "leading ' that keeps a cell starting with = + - @, a tab or a carriage return from running "
                        "as a formula: such raw cells MAY RUN AS FORMULAS when the file is opened in a spreadsheet")
    add_run_args(p)
    add_progress_args(p)
    return p


def parse_args(argv=None):
    p = build_parser()
    args = check_args(p.parse_args(argv))
    args.site_cluster = None
    if is_address(args.workers):
        if args.env != "sim" or args.export:
            p.error(f"--workers dask://HOST:PORT names the Dask scheduler that receives a site's private key or rows, "
                    f"and only the site names it: set ${WORKERS_ENV}=dask://HOST:PORT in that site's environment "
                    f"(a job may ask for N processes or dask-local:N); only the simulator, whose sites run on this "
                    f"machine, takes it here")
        # the simulator's sites are this machine's processes: they get the address from their environment
        args.site_cluster, args.workers = args.workers, 0
    if args.raw_text and args.predict is None:
        p.error("--raw-text applies to the predictions of --predict")
    if args.psi_min_rows < 1:
        p.error(f"--psi-min-rows must be an integer >= 1, got {args.psi_min_rows}")
    if args.trees is None:
        args.trees = 3 if args.model == "gbdt" else 1
    if args.model == "tree" and args.trees != 1:
        p.error("--model tree builds one tree; --trees applies to gbdt")
    return args


def choose_objective(schema, model: str, requested: str) -> str:
    """The gbdt loss for this label (``requested`` unless 'auto'); checks that the label fits it."""
    classes = list(schema.classes)
    try:
        [float(c) for c in classes]
        numeric = True
    except ValueError:
        numeric = False
    if model == "tree":
        if len(classes) > MAX_CLASSES:
            raise DataError(f"label {schema.label!r} has {len(classes)} distinct values: the tree model "
                            f"classifies (at most {MAX_CLASSES} classes); use --model gbdt for a regression")
        return "binary"
    obj = requested
    if obj == "auto":
        if numeric and len(classes) > MAX_CLASSES:
            obj = "squared_error"
        else:
            obj = "binary" if len(classes) == 2 else "softmax"
    if obj == "squared_error" and not numeric:
        raise DataError(f"--objective squared_error needs a numeric label; {schema.label!r} has values such as "
                        f"{classes[0]!r}")
    if obj == "binary" and len(classes) != 2:
        raise DataError(f"--objective binary needs 2 classes; label {schema.label!r} has {len(classes)}")
    if obj == "softmax" and len(classes) > MAX_CLASSES:
        raise DataError(f"--objective softmax: label {schema.label!r} has {len(classes)} distinct values "
                        f"(at most {MAX_CLASSES} classes)")
    return obj


def vertical_params(args, objective: str = "binary"):
    from treeflare.vertical import VerticalParams

    try:
        return VerticalParams(
            model=args.model, objective=objective, criterion=args.criterion, n_trees=args.trees,
            max_depth=args.max_depth, bins=args.bins, learning_rate=args.learning_rate, reg_lambda=args.reg_lambda,
            min_child_weight=args.min_child_weight, min_rows_node=args.min_rows_node, key_bits=args.key_bits,
            precision=args.precision, packing=args.packing, compress=args.compress, obfuscation=args.obfuscation,
            workers=args.workers, allow_insecure_key=args.allow_insecure_key, scheme=args.scheme).validate()
    except ValueError as exc:
        raise DataError(str(exc)) from None


def build_job(args, params, data_root: Path | None, sites: list[str], job_info: dict, schema=None):
    """The job's :class:`~treeflare.flare.vertical.recipe.VerticalTreeRecipe`, from the command's options."""
    from treeflare.flare.vertical.recipe import VerticalTreeRecipe

    return VerticalTreeRecipe(
        sites=sites, params=params.to_dict(), data_root=str(data_root) if data_root else "",
        schema=None if schema is None else schema.to_dict(), binding=args.binding, workers=args.workers,
        min_key_bits=args.key_bits if args.allow_insecure_key else 2048, min_node_rows=min(args.min_rows_node, 10),
        psi_min_rows=args.psi_min_rows, task_timeout=args.task_timeout, job_info=job_info, name=JOB_NAME,
        psi={"method": args.psi, "max_ratio": args.psi_max_ratio})


def shared_rows(tabs: list) -> list:
    """Each party's train and test tables restricted to the ids every party holds, sorted by id: what the PSI
    phase leaves at the sites, computed here in plaintext from all the parties' files (an independent check)."""
    kept = {kind: common_ids([getattr(t, kind) for t in tabs]) for kind in ("train", "test")}
    return [SiteData(*(restrict(getattr(t, kind), kept[kind], kind=kind) for kind in ("train", "test"))) for t in tabs]


def vertical_data(data_root: Path, sites: list[str], params):
    """The parties' data as the oracle sees it, on the intersection rows sorted by id (only possible where all
    sites' files are at hand)."""
    from treeflare.flare.vertical.executor import labels_for
    from treeflare.vertical import VerticalData

    tabs = shared_rows([read_site(data_root, s) for s in sites])
    act = tabs[0]
    Xa, na, _ = act.train.codes()
    Xat, _, _ = act.test.codes()
    passive = [t.train.codes() for t in tabs[1:]]
    y, y_test, n_classes = labels_for(params, act.train, act.test)
    return VerticalData(
        X_active=Xa, y=y, X_passive=[p[0] for p in passive], X_active_test=Xat,
        y_test=y_test, X_passive_test=[t.test.codes()[0] for t in tabs[1:]], names_active=na,
        names_passive=[p[1] for p in passive], n_classes=n_classes,
        ids_train=list(map(str, act.train.ids)), ids_test=list(map(str, act.test.ids)),
        class_names=list(act.train.schema.classes) if n_classes else [])


def compare_with_oracle(models: dict, pred: dict, data, params, sites) -> dict:
    from treeflare.vertical import joint_model, run_oracle

    a, ps = run_oracle(data, params)
    oracle_trees = joint_model(a.model(), {p: q.model() for p, q in ps.items()})
    fed_trees = joint_model(models[sites[0]], {s: models[s] for s in sites[1:]})
    same_tree = json.dumps(oracle_trees, sort_keys=True) == json.dumps(fed_trees, sort_keys=True)
    same_pred = (np.array_equal(np.asarray(pred["pred"], dtype=float), np.asarray(a.test_pred, dtype=float))
                 and np.array_equal(np.asarray(pred["score"], dtype=float), np.asarray(a.test_score, dtype=float)))
    return {"identical": bool(same_tree and same_pred), "same_tree": bool(same_tree),
            "same_predictions": bool(same_pred), "oracle_seconds": float(a.timings.get("total", 0.0))}


def oracle_unchecked_reason(skipped: bool, data_here: bool, files: dict, sites: list[str]) -> str | None:
    """Why the plaintext-oracle comparison cannot run here (None: it can). It replays the protocol on every
    party's data and compares every party's model part, so it needs all of them on this machine: a run whose data
    this script split (simulation, or a POC on this machine), never a run on real sites."""
    if skipped:
        return "skipped (--no-oracle)"
    if not data_here:
        return ("not checked: the comparison needs every party's data and model files, so it runs only where this "
                "script split the data (simulation, or a POC with --csv/--dataset); the sites hold their own")
    missing = [s for s in sites if s not in files] + ([] if "_pred" in files else [f"{sites[0]}'s test predictions"])
    if missing:
        return ("not checked: the comparison needs every party's model files, and these are not on this machine: "
                + ", ".join(missing))
    return None


def oracle_line(report: dict) -> str:
    """The summary's line on the oracle comparison: its result, or why there is none."""
    if report["identical_to_oracle"] is not None:
        return f"identical to the plaintext oracle: {report['identical_to_oracle']}"
    return f"plaintext oracle: {report['oracle']['reason']}"


def psi_table(psi: dict, kinds=("train", "test")) -> str:
    """The summary's lines on the PSI phase: the intersection, and per party its rows before and after, its PSI
    seconds and bytes."""
    def rows(counts):
        return " / ".join(f"{int((counts or {}).get(k, 0)):,}" for k in kinds)

    parties = psi.get("parties") or {}
    table = format_table(
        ["PSI, per party", f"rows before ({' / '.join(kinds)})", "rows after", "PSI s", "bytes sent", "bytes received"],
        [[site, rows(p.get("rows_before")), rows(p.get("rows_after")), f"{float(p.get('seconds') or 0):.2f}",
          f"{int(p.get('bytes_sent') or 0):,}", f"{int(p.get('bytes_received') or 0):,}"]
         for site, p in parties.items()])
    return (f"\nprivate set intersection: {psi.get('intersection_size')} rows ({' + '.join(kinds)}) every party "
            f"holds; each keeps them in its own run folder (psi/intersection.json)\n{table}")


def collect_site_files(run_dir: Path, sites: list[str], out: Path) -> dict:
    """Copy each party's model (and the active site's test predictions) out of the site run folders."""
    from treeflare.flare.runner import find_site_file
    from treeflare.flare.vertical.executor import ACTIVE_PRED
    from treeflare.vertical.model_parts import ACTIVE_MODEL, PASSIVE_MODEL

    found = {}
    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(sites):
        role = "active" if i == 0 else "passive"
        src = find_site_file(run_dir, s, ACTIVE_MODEL if i == 0 else PASSIVE_MODEL)
        if src is not None:
            shutil.copyfile(src, out / f"{s}_{role}_model.json")
            found[s] = json.loads(src.read_text())
        pred = find_site_file(run_dir, s, ACTIVE_PRED) if i == 0 else None
        if pred is not None:
            shutil.copyfile(pred, out / f"{s}_test_predictions.json")
            found["_pred"] = json.loads(pred.read_text())
    return found


@contextmanager
def sites_cluster(address):
    """The simulator's sites run in this machine's processes: ``address`` (``--workers dask://...``) reaches them
    through their environment (``$TREEFLARE_VERTICAL_WORKERS``), as a real site's own setting would, never through
    the job; restored after the run."""
    if address is None:
        yield
        return
    saved = os.environ.get(WORKERS_ENV)
    os.environ[WORKERS_ENV] = address
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(WORKERS_ENV, None)
        else:
            os.environ[WORKERS_ENV] = saved


@main_guard
def main(argv=None) -> int:
    args = parse_args(argv)
    with sites_cluster(args.site_cluster):
        return run(args)


def run(args) -> int:
    """Train (or, with --predict, predict) as ``args`` say; the exit status."""
    if args.predict is not None:
        from treeflare.flare.vertical.predict import predict_main

        return predict_main(args, JOB_NAME)
    vertical_params(args)                       # argument errors before any data is read
    from treeflare.flare.psi.job import psi_report
    from treeflare.flare.psi.protocol import RESULT_FILE as PSI_RESULT
    from treeflare.flare.runner import one_poc, read_server_result, run_job
    from treeflare.flare.vertical.controller import RESULT_FILE

    workspace = Path(args.workspace).resolve()
    make_workspace(workspace)  # removed again, if still empty, when the command fails
    timings = {}
    t = time.perf_counter()
    data_dir, schema_info = None, {"schema": "the submitter's data"}  # none: the parties hold their own columns
    if schema_source(args) == "data":
        table = load_table(args)  # the data layer gives it row ids if it has none
        objective = choose_objective(table.schema, args.model, args.objective)
        fed = prepare_federation(table, n_sites=args.passive + 1, seed=args.seed, vertical=True,
                                 n_passive=args.passive, stratify=objective != "squared_error" or args.model == "tree",
                                 overlap=overlap_of(args), keep_ids=bool(args.csv))  # your CSV's ids stay yours
        data_dir = write_federation(fed, workspace / "data", overwrite=True)
        sites, schema, dataset = fed.site_names, fed.schema, fed.summary["dataset"]
    else:
        sites, schema, dataset = [site_name(i) for i in range(args.passive + 1)], None, "the parties' own data"
    timings["prepare_data"] = time.perf_counter() - t
    data_root = Path(args.data_root) if args.data_root else data_dir

    with one_poc(args, sites):  # one POC for both jobs of --schema discover
        if schema is None:
            from treeflare.flare.discovery.job import sites_schema

            t = time.perf_counter()
            schema, schema_info = sites_schema(args, sites, data_root=args.data_root or "", vertical=True)
            timings["schema_discovery"] = time.perf_counter() - t
            objective = choose_objective(schema, args.model, args.objective)
        params = vertical_params(args, objective)
        job_info = {"dataset": dataset, "model": args.model, "objective": objective if args.model == "gbdt" else None}
        job = build_job(args, params, data_root, sites, job_info, schema)
        t = time.perf_counter()
        run_dir = run_job(job, args, sites, progress=printer_for(args))
        timings["flare_run"] = time.perf_counter() - t
    psi = read_server_result(run_dir, PSI_RESULT, workspace, JOB_NAME)   # a failed PSI phase ends the job
    if psi is None:
        return 1
    server = read_server_result(run_dir, RESULT_FILE, workspace, JOB_NAME)
    if server is None:
        return 1

    files = collect_site_files(run_dir, sites, workspace / "models")
    oracle = baseline = None
    data = None
    unchecked = oracle_unchecked_reason(args.no_oracle, data_dir is not None, files, sites)
    if unchecked is None:
        t = time.perf_counter()
        data = vertical_data(data_dir, sites, params)
        oracle = compare_with_oracle(files, files["_pred"], data, params, sites)
        timings["oracle"] = time.perf_counter() - t
    if not args.no_baseline and args.model == "gbdt" and data_dir is not None:
        from treeflare.vertical.baseline import xgboost_baseline

        t = time.perf_counter()
        baseline = xgboost_baseline(data or vertical_data(data_dir, sites, params), params, seed=args.seed)
        timings["baseline"] = time.perf_counter() - t
    crypto = dict(server["crypto"])
    report = {
        "job": JOB_NAME, "model": args.model, "objective": server.get("objective"),
        "dataset": dataset, "n_sites": len(sites), "schema_source": schema_info,
        "id_column": schema.id_column,   # the parties' join column: a prediction run's PSI reads the same one
        "sites": {"active": sites[0], "passive": sites[1:]},
        # a site's Dask scheduler address (the simulator's, from --workers dask://) is recorded as "site"
        "params": {**params.to_record(), "workers": "site" if args.site_cluster else params.workers,
                   "env": args.env, "seed": args.seed, "psi_min_rows": args.psi_min_rows,
                   "overlap": overlap_of(args) if data_dir is not None else None},
        "global": server["global"],
        "psi": psi_report(psi, run_dir, sites),
        "baseline_xgboost": baseline,
        "identical_to_oracle": None if oracle is None else oracle["identical"],
        "oracle": oracle if oracle is not None else {"checked": False, "reason": unchecked},
        "crypto": crypto, "layout": server.get("layout"),
        "n_train": server.get("n_train"), "n_test": server.get("n_test"), "n_trees": server.get("n_trees"),
        "n_splits": server.get("n_splits"),
        "timings_s": {**{f"active_{k}": v for k, v in server.get("timings_s", {}).items()},
                      **{f"passive_{k}": sum(float(st.get(k, 0.0)) for st in server.get("passive_timings_s", {}).values())
                         for k in sorted({k for st in server.get("passive_timings_s", {}).values() for k in st})},
                      "server_protocol": server.get("server_protocol_s"),
                      "psi": sum(float(v) for v in (psi.get("timings_s") or {}).values()), **timings},
        "models": sorted(str(p.relative_to(workspace)) for p in (workspace / "models").glob("*.json")),
    }
    write_json_atomic(workspace / "report.json", report)
    g = report["global"]
    what = args.model if args.model == "tree" else f"gbdt ({objective})"
    he = "Okamoto-Uchiyama" if crypto["scheme"] == "ou" else "Paillier"
    print(f"\nvertical {what} on {report['dataset']}: 1 active + {args.passive} passive sites, "
          f"{crypto['key_bits']}-bit {he}, packing {'on' if params.packing else 'off'}, "
          f"compression {'on' if params.compress else 'off'}")
    cols = (["rmse", "mae", "r2"] if objective == "squared_error" and args.model == "gbdt" else
            ["accuracy", "macro_f1", "auc" if "auc" in g else "mlogloss"])
    rows = [["federated", *[g.get(c) for c in cols]]]
    if baseline:
        rows.append(["XGBoost, centralised", *[baseline["global"].get(c) for c in cols]])
    print(format_table(["global test set", *cols], rows))
    print(f"encryptions {crypto['encryptions']}, decryptions {crypto['decryptions']}, "
          f"ciphertexts to passive {crypto['ciphertexts_to_passive']}, to active {crypto['ciphertexts_to_active']}, "
          f"values per ciphertext {crypto['values_per_ciphertext']}")
    print(oracle_line(report))
    print(psi_table(report["psi"]))
    kept = report["psi"].get("intersection_files") or {}   # where a party's run folder is on this machine
    print(outputs_text({"report": workspace / "report.json", "models": workspace / "models", "sites' data": data_dir,
                        **{f"{s}'s intersection": f for s, f in kept.items()}, "FLARE run folder": run_dir}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
