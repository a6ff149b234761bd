#!/usr/bin/env python
"""Write a schema.json for a person to review and edit, then pass to a job with --schema FILE.

    treeflare schema from-csv --csv sample.csv --label outcome [--categorical a,b] [--id pid] --out schema.json
    treeflare schema discover --sites 3 --label outcome --env poc --workspace out/discovery --out schema.json
    treeflare schema discover --sites 3 --vertical --label outcome --id pid --env prod \\
        --startup-kit ADMIN_KIT --workspace out/discovery --out schema.json
    treeflare schema check schema.json

from-csv infers the schema from a CSV you hold (every value in it is listed). discover asks the sites: each
describes its bound training file (names, kinds, category values seen in at least k of its rows, class labels,
row count; k is --min-category-rows or the site's own floor, default 5, whichever is higher) and the server
merges the descriptions, or names the sites and columns that disagree (its FLARE folders in
<workspace>/flare/, the schema in --out, default <workspace>/schema.json). A site refuses --categorical or
--ordinal on a column it reads as numbers unless its binding lists it in "categorical_allowed". Discovery
cannot know the order of an ordinal column's levels: declare it with --ordinal COL=low<mid<high, or edit
schema.json (set "kind": "ordinal" and list "categories" lowest first, every level the sites hold). check
reads an edited file and prints what a job would use. Bad input: ``error: ...``, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from treeflare.cli import Parser
from treeflare.cli import add_data_args, check_args, load_table, main_guard
from treeflare.data import DataError, Schema, site_name
from treeflare.data.discovery import DEFAULT_MIN_CATEGORY_ROWS
from treeflare.console import format_table
from treeflare.files import write_json_atomic


def build_parser() -> Parser:
    from treeflare.flare.runner import add_run_args
    from treeflare.flare.site_config import add_binding_arg

    parser = Parser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    csv = sub.add_parser("from-csv", help="infer a schema from data you hold (--csv or --dataset)")
    add_data_args(csv)
    _add_out(csv)

    disc = sub.add_parser("discover", help="run schema discovery on the sites (a small FLARE job)")
    g = disc.add_argument_group("what the sites are asked")
    g.add_argument("--sites", type=int, default=3, metavar="K", help="sites site-1..site-K (default 3)")
    g.add_argument("--vertical", action="store_true",
                   help="the sites hold different columns of the same rows: site-1 the label, every site the id")
    g.add_argument("--label", metavar="COL", help="the label column (default: each site's binding names it)")
    g.add_argument("--id", metavar="COL", help="the id column (default: each site's binding names it, if any)")
    g.add_argument("--categorical", metavar="A,B,...", help="columns to treat as categorical (not inferred)")
    g.add_argument("--ordinal", metavar="COL=a<b<c", action="append",
                   help="an ordered column with its levels lowest first (repeatable)")
    g.add_argument("--min-category-rows", type=int, default=DEFAULT_MIN_CATEGORY_ROWS, metavar="K",
                   help="a site reports a category value only if K of its rows or more hold it "
                        f"(default {DEFAULT_MIN_CATEGORY_ROWS}); a site whose own floor (its binding's "
                        "min_category_rows, default 5) is higher uses that")
    g.add_argument("--data-root", default=None,
                   help="the sites' data folder as the sites see it (<DIR>/<site>/train.csv), when they have no "
                        "binding of their own (simulator, POC)")
    add_binding_arg(g)
    g.add_argument("--task-timeout", type=int, default=300, help="seconds each site has to answer")
    _add_out(disc, default="<workspace>/schema.json")
    add_run_args(disc)

    chk = sub.add_parser("check", help="read a schema.json (e.g. after editing it) and print what a job would use")
    chk.add_argument("file", type=Path)
    return parser


def _add_out(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--out", required=default is None, type=Path, metavar="FILE",
                   help="the schema.json to write" + (f" (default: {default})" if default else ""))
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def _check_out(args) -> Path:
    out = Path(args.out) if args.out is not None else Path(args.workspace) / "schema.json"
    if out.exists() and not args.overwrite:
        raise DataError(f"--out {out}: already exists; choose another file or pass --overwrite")
    if out.exists() and not out.is_file():
        raise DataError(f"--out {out}: exists and is not a file")
    return out


def describe(schema: Schema, parties: dict | None = None) -> str:
    """The schema as a table; ``parties`` (vertical): the party holding each column, in a column of its own."""
    rows = []
    for f in schema.features:
        levels = " < ".join(f.categories) if f.kind == "ordinal" else ", ".join(f.categories)
        rows.append([f.name, *([parties[f.name]] if parties else []), f.kind,
                     len(f.categories) if f.categories else "", _short(levels)])
    head = (f"label {schema.label!r}: {len(schema.classes)} classes ({_short(', '.join(schema.classes))})"
            + (f"; id column {schema.id_column!r}" if schema.id_column else ""))
    return head + "\n" + format_table(["column", *(["party"] if parties else []), "kind", "values",
                                        "categories / levels"], rows)


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


@main_guard
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        from treeflare.flare.discovery.job import read_schema_file, schema_file_parties

        schema = read_schema_file(args.file)
        print(describe(schema, schema_file_parties(args.file, schema)))
        print(f"\n{args.file}: a valid schema; use it with --schema {args.file}")
        return 0
    out = _check_out(args)
    if args.command == "from-csv":
        from treeflare.flare.discovery.controller import schema_file

        table = load_table(args)
        write_json_atomic(out, schema_file(table.schema))
        print(describe(table.schema))
        print(f"\nwritten to {out}: review it (every value in the data is listed), then pass --schema {out}")
        return 0
    check_args(args)
    if args.sites < (2 if args.vertical else 1):
        raise DataError(f"--sites must be at least {2 if args.vertical else 1}")
    from treeflare.flare.runner import one_poc
    from treeflare.flare.discovery.job import discover

    sites = [site_name(i) for i in range(args.sites)]
    Path(args.workspace).mkdir(parents=True, exist_ok=True)
    with one_poc(args, sites):
        # this workspace is discovery's own: its FLARE folders in <workspace>/flare/, as every job's
        schema, summary = discover(args, sites, data_root=args.data_root or "", vertical=args.vertical, out=out,
                                   own_workspace=True)
    print(describe(schema, summary["parties"]))
    print(f"\nreview {out}; an ordinal column's levels are not discovered: set \"kind\": \"ordinal\" and list its "
          f"\"categories\" lowest first (or pass --ordinal); then run a job with --schema {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
