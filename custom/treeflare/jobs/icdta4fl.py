"""ICDTA4FL on NVFlare: local ID3/CART trees, peer evaluation, filtering, rule aggregation into one
interpretable global tree (the paper's single round), then refinement rounds on class counts summed over
every site, pairwise-masked so that the server reads only the sum: by default a tree grown from the root, a level
a round, on a grid of thresholds found from the sums (--refine-from root, 8 rounds), kept only if the sites'
validation rows score it at least as well as the one-round tree (--refine-rounds 0 = the paper's method alone).

    treeflare icdta4fl --algorithm cart --dataset nursery --sites 5 --workspace /tmp/icdta4fl

On sites that hold their own data (no --dataset/--csv here), the schema comes from the sites:

    treeflare icdta4fl --schema discover --label outcome --sites 3 --env poc --workspace /tmp/icdta4fl

Writes report.json, report.html (the same on one page, with the tree drawn), global_tree.json, rules.txt and
global_tree.png (and global_tree_one_round.json) into
--workspace (and schema.json with --schema discover).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

from treeflare.cli import Parser, make_workspace
from treeflare.cli import (add_data_args, add_partition_args, add_schema_args, check_args, load_table, main_guard,
                           prepare_from_args, schema_source)
from treeflare.data import Schema, read_site, read_site_csv, site_name, write_federation
from treeflare.flare.progress import add_progress_args, printer_for
from treeflare.icdta4fl import grow, pipeline, refine
from treeflare.icdta4fl.encoding import encode, feature_space
from treeflare.icdta4fl.report_html import write_report_html
from treeflare.icdta4fl.server import DEFAULT_MAX_ROWS_RATIO
from treeflare.trees.learners import LEARNERS
from treeflare.console import format_table, outputs_text
from treeflare.files import write_json_atomic
from treeflare.trees.tree import Tree

JOB_NAME = "icdta4fl"
ARTIFACTS = ("global_tree.json", "rules.txt", "global_tree.png", "global_tree_one_round.json")
SITE_HELD = "site-held"  # the partition kind of the sites' own data
VALIDATION_ROWS = "each site's validation rows (its test.csv)"


def build_parser() -> Parser:
    """The command's options (``treeflare icdta4fl --help``); :func:`parse_args` checks them."""
    from treeflare.flare.runner import add_run_args
    from treeflare.flare.site_config import add_binding_arg

    p = Parser(description=__doc__.split("\n\n")[0])
    add_data_args(p)
    add_schema_args(p)
    add_partition_args(p)
    g = p.add_argument_group("ICDTA4FL")
    g.add_argument("--algorithm", choices=list(LEARNERS), default="cart",
                   help="the local trees' learner: cart (binary splits, one-hot categories) or id3 (one branch per "
                        "category value)")
    g.add_argument("--max-depth", type=int, default=5, help="local tree depth (default 5)")
    g.add_argument("--criterion", default=None, help="gini|entropy (default: gini for CART, entropy for ID3)")
    g.add_argument("--statistic", choices=["percentile", "mean", "median"], default="percentile",
                   help="how the peer-score thresholds are set (default percentile)")
    g.add_argument("--percentile", type=float, default=75.0, help="q for --statistic percentile (default 75)")
    g.add_argument("--peer-score", choices=["clipped_mean", "mean"], default="clipped_mean",
                   help="a tree's score for the filter: the mean of the sites' scores of it, each clipped to the range "
                        "of the other sites' (default: one site's word moves it no further than the nearest honest "
                        "score would), or the paper's plain mean")
    g.add_argument("--max-rows-ratio", type=float, default=DEFAULT_MAX_ROWS_RATIO, metavar="R",
                   help=f"a site may declare at most R x the median of every site's training rows, else it is "
                        f"dropped at training (default {DEFAULT_MAX_ROWS_RATIO:g}; raise it for a "
                        f"federation of very unequal sites)")
    g.add_argument("--max-leaves", type=int, default=None,
                   help=f"global tree leaf budget, for both learners (default {pipeline.DEFAULT_MAX_LEAVES}: a tree a "
                        f"person reads, docs/icdta4fl.md#the-size-budget; the paper's method: --refine-rounds 0 with "
                        f"a large --max-leaves)")
    g.add_argument("--global-max-depth", type=int, default=None,
                   help="global tree depth budget (default: the refinement rounds when it grows from the root, a "
                        "level a round; else the selected local trees' depth + 2)")
    r = p.add_argument_group("refinement (protected counts)")
    r.add_argument("--refine-from", choices=list(grow.GROW_FROM), default=grow.DEFAULT_GROW_FROM,
                   help="root (default): grow a tree from the root on the summed counts, a level a round, on "
                        "thresholds found from the sums (the tree a centralized CART would grow, then pruned to the "
                        "budget); one_round: refine the paper's one-round tree (or the best local tree)")
    r.add_argument("--refine-rounds", type=int, default=None, metavar="R",
                   help=f"rounds on class counts summed over all sites (default "
                        f"{grow.DEFAULT_ROUNDS['root']} from the root, {grow.DEFAULT_ROUNDS['one_round']} for "
                        f"one_round; 0 = the paper's one-round method only)")
    r.add_argument("--refine-epsilon", type=float, default=None, metavar="E",
                   help="differential privacy: each site adds discrete Laplace noise to its counts, epsilon E per "
                        "round (default: no noise); with --refine-from one_round (growth from the root takes none)")
    r.add_argument("--refine-objective", choices=list(refine.OBJECTIVES), default=refine.DEFAULT_OBJECTIVE,
                   help="what the rounds minimise: misclassified training rows (accuracy, default: auto's macro-F1 "
                        "gain on imbalanced data costs accuracy, scripts/bench_icdta4fl_imbalanced.py), the same "
                        "with classes weighted inversely to their pooled totals (balanced: the minority is predicted "
                        "more), or auto: both trees grown from the same sums each round, the one that validates best "
                        "on the sites' rows (accuracy + macro-F1) is adopted")
    r.add_argument("--refine-adopt", choices=["robust", "pooled"], default="robust",
                   help="when a refined tree replaces the previous one: robust (default): its change of validation "
                        "score pooled over the sites, each site's clipped to the range of the others' (no one site's "
                        "word adopts a tree); pooled: every site's word as it says it (the rule before issue 33: "
                        "about half a point more accuracy at small leaf budgets, for sites that trust one another)")
    g.add_argument("--min-clients", type=int, default=None, metavar="K",
                   help="go on with at least K valid sites even when some sites' data is missing or unreadable "
                        "(default: every site must load its data: a site whose data folder or train.csv/test.csv is "
                        "missing stops the job, naming it; a site sending an invalid reply is dropped while 2 valid "
                        "sites remain)")
    g.add_argument("--task-timeout", type=int, default=300, help="seconds each site has per task")
    g.add_argument("--data-root", default=None,
                   help="the sites' data folder as the sites see it (default: the folder this script prepares)")
    add_binding_arg(g)
    add_run_args(p)
    add_progress_args(p)
    return p


def parse_args(argv=None):
    return check_args(build_parser().parse_args(argv))


def build_job(args, fed_summary: dict, data_root: Path | None, sites: list[str]):
    """The job's :class:`~treeflare.flare.icdta4fl.recipe.ICDTA4FLRecipe`, from the command's options."""
    from treeflare.flare.icdta4fl.recipe import ICDTA4FLRecipe

    local = {"max_depth": args.max_depth}
    if args.criterion:
        local["criterion"] = args.criterion
    aggregation = {}
    if args.max_leaves is not None:
        aggregation["max_leaves"] = args.max_leaves
    if args.global_max_depth is not None:
        aggregation["max_depth"] = args.global_max_depth
    server_test = data_root / "server" / "test.csv" if data_root else None  # the sites' own data: none
    return ICDTA4FLRecipe(
        schema=fed_summary["schema"], sites=sites, algorithm=args.algorithm, local_params=local,
        selection={"statistic": args.statistic, "q": args.percentile, "score": args.peer_score},
        aggregation=aggregation, max_rows_ratio=args.max_rows_ratio,
        min_clients=args.min_clients, task_timeout=args.task_timeout,
        server_test=str(server_test) if server_test and server_test.is_file() else "",
        job_info={"dataset": fed_summary["dataset"], "partition": fed_summary["partition"]},
        refine_params={"rounds": args.refine_rounds, "epsilon": args.refine_epsilon, "grow_from": args.refine_from,
                       "objective": args.refine_objective, "adopt": args.refine_adopt},
        data_root=str(data_root) if data_root else "", binding=args.binding, name=JOB_NAME)


def centralized_baseline(args, data_root: Path, schema: Schema, sites: list[str]) -> dict:
    """The same learner and depth trained on the union of the sites' training data."""
    tables = [read_site(data_root, s, schema).train for s in sites]
    names, kinds, n_categories = feature_space(schema, args.algorithm)
    X = np.vstack([encode(t, args.algorithm) for t in tables])
    y = np.concatenate([t.y_codes() for t in tables])
    params = {"max_depth": args.max_depth, **({"criterion": args.criterion} if args.criterion else {})}
    tree = pipeline.train_local_tree(X, y, algorithm=args.algorithm, n_classes=len(schema.classes),
                                     feature_kinds=kinds, n_categories=n_categories, params=params)
    test = read_site_csv(data_root / "server" / "test.csv", schema, site="server")
    s = pipeline.score_trees([tree], encode(test, args.algorithm), test.y_codes())
    tree = Tree.from_dict(tree)
    return {"accuracy": s["accuracy"][0], "macro_f1": s["macro_f1"][0], "n_leaves": tree.n_leaves,
            "depth": tree.depth}


def build_report(args, server: dict, fed_summary: dict, centralized: dict | None, timings: dict) -> dict:
    part = fed_summary["partition"]
    report = {
        "job": JOB_NAME,
        "algorithm": args.algorithm,
        "dataset": fed_summary["dataset"],
        # the sites' own data: no split here, so no alpha or seed
        "partition": ({"kind": part["kind"]} if part["kind"] == SITE_HELD else
                      {"kind": part["kind"], "alpha": part.get("alpha"), "seed": part["seed"]}),
        "n_sites": server["n_sites"],
        "selected_sites": server["selected_sites"],
        "thresholds": server["thresholds"],
        # the peer scores of each tree (their means over the scorers; report.html draws a full scorer x tree matrix
        # as a table when the server's result holds one)
        "scorers": server.get("scorers"),
        "peer_scores": server.get("peer_scores"),
        "global": server["global"],
        "one_round": server.get("one_round"),
        "validation": site_validation(server),
        "refinement": server.get("refinement"),
        "sites": {s: {k: v for k, v in info.items() if k in ("n_train", "n_test", "local", "global", "tree")}
                  for s, info in server["sites"].items()},
        "baselines": {"centralized": centralized, **{k: v for k, v in server.get("baselines", {}).items()
                                                      if k in ("mean_local", "best_local")}},
        "dropped_sites": server["dropped_sites"],
        "schema_source": fed_summary.get("schema_source", {"schema": "the submitter's data"}),
        "aggregation": server["aggregation"],
        "params": {"max_depth": args.max_depth, "criterion": args.criterion, "statistic": args.statistic,
                   "percentile": args.percentile, "max_leaves": args.max_leaves,
                   "global_max_depth": args.global_max_depth, "refine_from": args.refine_from,
                   "refine_rounds": (server.get("refinement") or {}).get("rounds_requested", args.refine_rounds),
                   "refine_epsilon": args.refine_epsilon, "refine_objective": args.refine_objective, "env": args.env},
        "timings_s": {**server["timings_s"], **timings},
    }
    return report


def site_validation(server: dict) -> dict | None:
    """Each site's score of the final tree on its own validation rows (its test.csv; the controller checked every
    reply), their mean over the sites, and the one-round tree's mean from refinement's check; None if no site
    scored."""
    sites = {s: {"accuracy": g["accuracy"], "macro_f1": g["macro_f1"], "n_test": info.get("n_test")}
             for s, info in server["sites"].items() if (g := info.get("global"))}
    if not sites:
        return None
    one = ((server.get("refinement") or {}).get("validation") or {}).get("one_round")
    return {"rows": VALIDATION_ROWS,
            "final_tree": {"sites": sites, "mean": {m: float(np.mean([v[m] for v in sites.values()]))
                                                    for m in ("accuracy", "macro_f1")}},
            # -1: no site scored the one-round tree (the controller's placeholder)
            "one_round_tree": {"mean": one} if one and min(one.values()) >= 0 else None}


def summary_rows(report: dict) -> tuple[str, list[list]]:
    """The summary table's heading and rows: on the global test set when there is one, else on each site's
    validation rows."""
    refined = report.get("refinement")
    done = (refined or {}).get("rounds_done", 0)
    name = f"global (ICDTA4FL, refined {done} round{'s' * (done != 1)})" if refined else "global (ICDTA4FL)"
    if refined and refined.get("grow_from") == "root":  # one tree built over the rounds, adopted or not
        name = (f"global (ICDTA4FL, grown from the root in {done} rounds)" if done else
                "global (ICDTA4FL, the start tree: the grown tree was not adopted)")
    g, one = report["global"], report.get("one_round")
    validation = report.get("validation")
    if g.get("accuracy") is None and validation:  # no global test set here: what the sites' own rows say
        final = validation["final_tree"]
        rows = [[f"{name}, mean of the sites", final["mean"]["accuracy"], final["mean"]["macro_f1"], g["n_leaves"],
                 g["depth"]]]
        rows += [[f"  {s} ({v['n_test']} rows)", v["accuracy"], v["macro_f1"], "", ""]
                 for s, v in final["sites"].items()]
        one_mean = (validation.get("one_round_tree") or {}).get("mean")
        if refined and one and one_mean:
            rows.append(["one-round tree (the paper's), mean of the sites", one_mean["accuracy"],
                         one_mean["macro_f1"], one["n_leaves"], one["depth"]])
        return "model (each site's validation rows)", rows
    rows = [[name, g.get("accuracy"), g.get("macro_f1"), g["n_leaves"], g["depth"]]]
    if refined and one:
        rows.append(["one-round tree (the paper's)", one.get("accuracy"), one.get("macro_f1"), one["n_leaves"],
                     one["depth"]])
    for key in ("centralized", "mean_local", "best_local"):
        b = report["baselines"].get(key)
        if b:
            rows.append([key.replace("_", " "), b["accuracy"], b["macro_f1"], b.get("n_leaves", ""), b.get("depth", "")])
    return "model (global test set)", rows


def print_summary(report: dict, workspace: Path) -> None:
    refined = report.get("refinement")
    heading, rows = summary_rows(report)
    print(f"\nICDTA4FL-{report['algorithm'].upper()} on {report['dataset']}, {report['n_sites']} sites "
          f"({report['partition']['kind']}), selected {len(report['selected_sites'])}: "
          f"{', '.join(report['selected_sites'])}")
    print(format_table([heading, "accuracy", "macro_f1", "leaves", "depth"], rows))
    if refined:
        noise = "" if refined.get("epsilon") is None else f", epsilon {refined['epsilon']} per round"
        print(f"refinement: started from the {refined.get('start')}; {refined.get('status')}{noise}")
    if report["dropped_sites"]:
        print(f"dropped sites: {report['dropped_sites']}")
    source = report.get("schema_source") or {}
    print(outputs_text({"report": workspace / "report.json", "report page": workspace / "report.html",
                        "global tree": workspace / "global_tree.json",
                        "rules": workspace / "rules.txt", "picture": workspace / "global_tree.png",
                        "one-round tree": workspace / "global_tree_one_round.json" if refined else None,
                        "schema (discovered)": source.get("schema_file") if source.get("schema") == "discovered"
                        else None}))


def write_html_report(report: dict, workspace: Path) -> None:
    """report.html beside report.json, drawing workspace/global_tree.json. The run's results are saved by now, so a
    page that cannot be written costs a warning, not the run (scripts/report_html.py writes it again)."""
    from treeflare.icdta4fl.model import GlobalTree

    try:
        model_file = workspace / "global_tree.json"
        model = GlobalTree.load_json(model_file) if model_file.is_file() else None
        write_report_html(report, model, workspace / "report.html")
    except Exception as exc:  # noqa: BLE001 -- see the docstring
        (workspace / "report.html").unlink(missing_ok=True)  # never a previous run's page beside this report
        print(f"warning: report.html not written ({type(exc).__name__}: {exc}); "
              f"treeflare report --workspace {workspace} writes it", file=sys.stderr)


@main_guard
def main(argv=None) -> int:
    args = parse_args(argv)
    from treeflare.flare.icdta4fl.controller import RESULT_FILE
    from treeflare.flare.runner import one_poc, read_server_result, run_job

    workspace = Path(args.workspace).resolve()
    make_workspace(workspace)  # removed again, if still empty, when the command fails
    timings = {}
    t = time.perf_counter()
    data_dir = None  # the federation this script writes from the submitter's data (none when the sites hold it)
    if schema_source(args) == "data":
        fed = prepare_from_args(load_table(args), args)
        sites, schema, summary = fed.site_names, fed.schema, fed.summary
        data_dir = write_federation(fed, workspace / "data", overwrite=True)
    else:
        sites, schema, summary = [site_name(i) for i in range(args.sites)], None, None
    timings["prepare_data"] = time.perf_counter() - t
    data_root = Path(args.data_root) if args.data_root else data_dir

    with one_poc(args, sites):  # one POC for both jobs of --schema discover
        if schema is None:
            t = time.perf_counter()
            from treeflare.flare.discovery.job import sites_schema

            schema, source = sites_schema(args, sites, data_root=args.data_root or "")
            timings["schema_discovery"] = time.perf_counter() - t
            summary = {"schema": schema.to_dict(), "dataset": "the sites' own data",
                       "partition": {"kind": SITE_HELD},
                       "schema_source": source}
        job = build_job(args, summary, data_root, sites)
        t = time.perf_counter()
        run_dir = run_job(job, args, sites, progress=printer_for(args))
        timings["flare_run"] = time.perf_counter() - t

    server = read_server_result(run_dir, RESULT_FILE, workspace, JOB_NAME)
    if server is None:
        return 1
    for name in ARTIFACTS:
        if (run_dir / name).is_file():
            shutil.copyfile(run_dir / name, workspace / name)
    centralized = None  # needs every site's rows: only when this script wrote them
    if data_dir is not None:
        t = time.perf_counter()
        centralized = centralized_baseline(args, data_dir, schema, sites)
        timings["centralized_baseline"] = time.perf_counter() - t
    report = build_report(args, server, summary, centralized, timings)
    write_json_atomic(workspace / "report.json", report)
    write_html_report(report, workspace)
    print_summary(report, workspace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
