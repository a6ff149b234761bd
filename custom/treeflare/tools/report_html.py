#!/usr/bin/env python
"""Write report.html of a saved ICDTA4FL run again, from its workspace's report.json and global_tree.json.

    treeflare report --workspace workspace/icdta4fl

The job writes the page itself at the end of every run; this rewrites it, e.g. for a run saved before the job
wrote one, or after report.json was edited. Bad input (no report.json, not an ICDTA4FL report, an invalid model
file): ``error: ...`` naming the file, exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from treeflare.cli import Parser
from treeflare.cli import main_guard
from treeflare.data import DataError
from treeflare.icdta4fl.model import GlobalTree
from treeflare.icdta4fl.report_html import write_report_html


def build_parser() -> Parser:
    p = Parser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--workspace", required=True, type=Path, help="the ICDTA4FL job's --workspace")
    p.add_argument("--out", type=Path, default=None, help="page to write (default: WORKSPACE/report.html)")
    return p


def read_run(workspace: Path) -> tuple[dict, GlobalTree | None]:
    """The run's report dict and final model (None when the workspace holds no global_tree.json)."""
    report_file = workspace / "report.json"
    try:
        report = json.loads(report_file.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{report_file}: not JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(report, dict) or report.get("job") != "icdta4fl":
        raise DataError(f"{report_file}: not an ICDTA4FL report (its 'job' is not 'icdta4fl')")
    model_file = workspace / "global_tree.json"
    if not model_file.is_file():
        return report, None
    try:
        return report, GlobalTree.load_json(model_file)
    except ValueError as exc:
        raise DataError(f"{model_file}: not a valid global tree: {exc}") from None


@main_guard
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    report, model = read_run(args.workspace)
    out = write_report_html(report, model, args.out or args.workspace / "report.html")
    print(f"wrote {out}" + ("" if model else " (no global_tree.json: no tree drawn, no rules)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
