#!/usr/bin/env python
"""Predict on a new CSV with a trained model: the ICDTA4FL global tree or the federated XGBoost model.

    treeflare predict --model out/car --csv new.csv --out predictions.csv
    treeflare predict --model out/car/global_tree.json --csv new.csv --out p.csv --id id --explain
    treeflare predict --model out/xgb_adult/model.json --csv new.csv --out p.csv

--model is a model file (global_tree.json of the ICDTA4FL job, model.json of the XGBoost job) or a job's
workspace folder. A vertical model has no such file (each party keeps its own part): predict with it by a federated
run, `treeflare vertical --predict WORKSPACE --csv NEW.csv --workspace OUT`. The CSV holds raw values with the
column names of the training data: a missing value or a category never seen in training is read as training reads
it, a missing feature column is an error naming it, other columns (the label too) are ignored. Output: the id column (--id, or the training schema's id column when
the CSV has it), `predicted` (the class), `p_<class>` per class, and with --explain (ICDTA4FL only)
`explanation`, the row's decision path. The output file is written whole or not at all. A text cell (a class,
an id) that starts with = + - @, a tab or a carriage return would run as a formula in a spreadsheet: it is
written with a leading ' (--raw-text writes it as it is); numbers, -1.5 too, are written as they are. Bad input:
``error: ...`` naming the file, column and line, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from treeflare.cli import Parser
from treeflare.cli import main_guard
from treeflare.prediction import predict_csv


def build_parser() -> Parser:
    p = Parser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--model", required=True, type=Path, metavar="DIR_OR_FILE",
                   help="global_tree.json, model.json, or a job's workspace folder holding one")
    p.add_argument("--csv", required=True, type=Path, help="rows to predict, with a header row")
    p.add_argument("--out", required=True, type=Path, help="predictions CSV to write")
    p.add_argument("--id", metavar="COL", default=None, dest="id_column",
                   help="column of the CSV copied to the output to identify rows (default: the training schema's "
                        "id column, when the CSV has it)")
    p.add_argument("--explain", action="store_true",
                   help="add each row's decision path as text (ICDTA4FL global tree only)")
    p.add_argument("--schema", type=Path, default=None,
                   help="the training schema (schema JSON or the federation's partition.json), only for a model "
                        "file that carries none")
    p.add_argument("--raw-text", action="store_true",
                   help="write text cells exactly as predicted, without the leading ' that keeps a cell starting "
                        "with = + - @, a tab or a carriage return from running as a formula: such raw cells MAY RUN "
                        "AS FORMULAS when the file is opened in a spreadsheet")
    return p


@main_guard
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    summary = predict_csv(args.model, args.csv, args.out, id_column=args.id_column, explain=args.explain,
                          schema=args.schema, raw_text=args.raw_text)
    counts = ", ".join(f"{c} {n}" for c, n in summary["predicted"].items())
    print(f"{summary['rows']} predictions written to {summary['out']} with the {summary['model']}\n"
          f"predicted: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
