#!/usr/bin/env python
"""Run the private set intersection alone: which rows every vertical party holds, without any party or the server
learning the others' ids outside it.

    treeflare prepare --dataset car --vertical --passive 2 --overlap 0.7 --out out/fed
    treeflare psi --sites 3 --data-root out/fed --workspace out/psi
    treeflare psi --sites 3 --env poc --data-root out/fed --workspace out/psi
    treeflare psi --sites 3 --env prod --startup-kit ADMIN_KIT --workspace out/psi
    treeflare psi --sites 3 --export out/job --workspace out/psi

The same phase every vertical job starts with (``treeflare.flare.psi``, on NVFlare's DH-PSI): each site reads the
ids of its bound train and test files (``--kinds predict``: its new rows), checks them (no rows, a blank or repeated
id: the job fails naming the site and line, never an id), and keeps the intersection in its own run folder
(``<run folder>/psi/intersection.json``). Prints each party's rows before and after and where each site keeps its
intersection; writes <workspace>/report.json (the server's ``psi_result.json``, under ``"psi"``). Bad input:
``error: ...``, exit 2; a failed job: exit 1, report.json saying why.
"""

from __future__ import annotations

import sys
from pathlib import Path

from treeflare.cli import Parser, make_workspace
from treeflare.cli import main_guard
from treeflare.data import DataError, site_name
from treeflare.data.intersection import DEFAULT_MIN_ROWS, KINDS
from treeflare.psi.options import add_psi_args
from treeflare.console import format_table
from treeflare.files import write_json_atomic


def build_parser() -> Parser:
    from treeflare.flare.runner import add_run_args
    from treeflare.flare.site_config import add_binding_arg

    parser = Parser(description=__doc__.split("\n\n")[0])
    g = parser.add_argument_group("the parties and their ids")
    g.add_argument("--sites", type=int, default=2, metavar="K", help="parties site-1..site-K (default 2)")
    g.add_argument("--kinds", default="train,test", metavar="A,B",
                   help=f"which of each party's files to intersect, of {', '.join(KINDS)} (default train,test; "
                        "each kind only matches the same kind)")
    g.add_argument("--id", metavar="COL", default=None,
                   help="the id column (default: each site's binding names it, else the federation's partition.json)")
    g.add_argument("--psi-min-rows", type=int, default=DEFAULT_MIN_ROWS, metavar="N",
                   help=f"the fewest training rows the intersection must hold (default {DEFAULT_MIN_ROWS}); below it "
                        "the job fails and no site keeps anything")
    g.add_argument("--data-root", default=None,
                   help="the sites' data folder as the sites see it (<DIR>/<site>/train.csv, as prepare_data.py "
                        "--vertical writes it), when they have no binding of their own (simulator, POC)")
    add_binding_arg(g)
    add_psi_args(g)
    g.add_argument("--workers", default=0, metavar="N",
                   help="--psi ecdh: each party's blinding pool: N processes (0 = all cores) or dask-local:N (a "
                        "site's $TREEFLARE_VERTICAL_WORKERS overrides it, and only it may name dask://HOST:PORT)")
    g.add_argument("--task-timeout", type=int, default=600,
                   help="seconds each site has for each task of the phase (a round of --psi ecdh included)")
    g.add_argument("--audit", action="store_true",
                   help="record every task, result and relayed message crossing the server in <server run "
                        "folder>/psi_audit.jsonl, for a review of what the server sees (the file holds the PSI's "
                        "sealed or blinded messages)")
    add_run_args(parser)
    return parser


def check(args) -> list[str]:
    if args.sites < 2:
        raise DataError("--sites must be at least 2: PSI is between parties")
    if args.psi_min_rows < 1:
        raise DataError(f"--psi-min-rows must be an integer >= 1, got {args.psi_min_rows}")
    if args.task_timeout < 1:
        raise DataError("--task-timeout must be at least 1 second")
    from treeflare.crypto.workers import parse_workers

    try:
        args.workers = parse_workers(args.workers, "--workers", allow_address=False)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise DataError(f"--kinds {args.kinds!r}: give distinct kinds of {', '.join(KINDS)}, comma-separated")
    if args.env == "sim" and not args.data_root and not args.export:
        raise DataError("--env sim: give --data-root (a folder from treeflare prepare --vertical)")
    if args.data_root and not Path(args.data_root).is_dir() and args.env != "prod":
        raise DataError(f"--data-root {args.data_root}: not a folder")
    return kinds


def summary(psi: dict, kinds) -> str:
    def rows(counts):
        return " / ".join(f"{int((counts or {}).get(k, 0)):,}" for k in kinds)

    parties = psi.get("parties") or {}
    kept = psi.get("intersection_files") or {}
    table = format_table(
        ["party", f"rows before ({' / '.join(kinds)})", "rows after", "PSI s", "bytes sent", "bytes received",
         "intersection kept in"],
        [[site, rows(p.get("rows_before")), rows(p.get("rows_after")), f"{p.get('seconds', 0):.2f}",
          f"{p.get('bytes_sent', 0):,}", f"{p.get('bytes_received', 0):,}",
          kept.get(site) or "its own run folder, psi/intersection.json (not on this machine)"]
         for site, p in parties.items()])
    return f"private set intersection: {psi.get('intersection_size')} rows every party holds\n{table}"


@main_guard
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    kinds = check(args)
    from treeflare.flare.psi.audit import AUDIT_FILE
    from treeflare.flare.psi.job import run_psi
    from treeflare.flare.runner import one_poc

    sites = [site_name(i) for i in range(args.sites)]
    workspace = Path(args.workspace).resolve()
    make_workspace(workspace)  # removed again, if still empty, when the command fails
    data_root = str(Path(args.data_root).resolve()) if args.data_root and args.env != "prod" else (args.data_root or "")
    schema = {"id_column": args.id} if args.id else None
    with one_poc(args, sites):
        psi, run_dir = run_psi(args, sites, data_root=data_root, schema=schema, kinds=kinds, audit=args.audit)
    if psi is None:  # read_server_result wrote the failed result as report.json and said why
        return 1
    report = {"job": "psi", "status": "completed", "env": args.env, "sites": sites, "kinds": kinds,
              "data_root": data_root or None, "binding": args.binding or None, "psi": psi,
              "audit": str(Path(run_dir) / AUDIT_FILE) if args.audit else None}
    write_json_atomic(workspace / "report.json", report)
    print(summary(psi, kinds))
    print(f"\nreport: {workspace / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
