#!/usr/bin/env python
"""Write a federation to disk: per-site train/test CSVs, the server's global test set and partition.json.

    treeflare prepare --dataset nursery --sites 5 --partition label --alpha 0.5 --seed 0 --out out/nursery
    treeflare prepare --csv my.csv --label y [--categorical a,b] [--id id] --sites 3 --out out/mine
    treeflare prepare --dataset default_credit_card --vertical --passive 2 --out out/credit_vfl
    treeflare prepare --dataset adult --vertical --passive 2 --overlap 0.7 --out out/adult_vfl

Layout: DIR/site-N/train.csv, DIR/site-N/test.csv (each site's local 80/20 split), DIR/server/test.csv
(a stratified 20% held out before partitioning) and DIR/partition.json, all comma-separated; --csv's separator is
detected (',', ';', tab, '|') unless --sep gives it. --vertical joins the parties on --id, or on a row_id column of
row numbers it adds. --vertical --overlap F gives the parties different customers: F of each party's training rows
are held by every party, the rest by that party alone, each party in its own row order (the row_id column then
holds random tokens, not row numbers; docs/data.md). Bad input: ``error: ...``, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from treeflare.cli import Parser
from treeflare.cli import add_data_args, add_partition_args, add_vertical_args, check_args, load_table, main_guard, \
    prepare_from_args
from treeflare.data import write_federation


def build_parser() -> Parser:
    parser = Parser(
        description=__doc__.split("\n\n")[0])
    add_data_args(parser)
    add_partition_args(parser)
    add_vertical_args(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (must be new or empty)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing federation in --out (only one this script wrote, holding nothing "
                             "else; any other folder is refused)")
    return parser


def summary_lines(summary: dict, out: Path) -> list[str]:
    sites = summary["sites"]
    vertical = summary["partition"]["kind"] == "vertical"
    rows = [("site", "train", "test", "columns" if vertical else "train class counts")]
    for name, s in sites.items():
        if vertical:
            detail = f"{len(s['columns'])} features" + (" + label" if s["class_counts"] else "")
            if s.get("n_private"):
                detail += f"; {s['n_private']} training rows no other party holds"
        else:
            detail = " ".join(f"{c}={n}" for c, n in s["class_counts"].items())
        rows.append((name, str(s["n_train"]), str(s["n_test"]), detail))
    server = summary["server"]
    rows.append(("server", "-", str(server["n_test"]), " ".join(f"{c}={n}" for c, n in server["class_counts"].items())))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]}" for r in rows]
    p = summary["partition"]
    params = ", ".join(f"{k}={v}" for k, v in p.items() if k not in ("test_size", "local_test_size"))
    head = f"{summary['dataset']}: {summary['n_sites']} sites ({params})"
    return [head, *lines, f"partition.json: {out / 'partition.json'}"]


@main_guard
def main(argv=None) -> int:
    args = check_args(build_parser().parse_args(argv))
    table = load_table(args)
    fed = prepare_from_args(table, args)
    out = write_federation(fed, args.out, overwrite=args.overwrite)
    print("\n".join(summary_lines(fed.summary, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
