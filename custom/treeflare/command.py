"""The ``treeflare`` command: every job and tool of the package as a subcommand.

    treeflare icdta4fl --dataset nursery --sites 5 --workspace out/icdta4fl
    treeflare predict --model out/icdta4fl --csv new.csv --out predictions.csv
    treeflare poc up 3

Each subcommand is the ``main(argv)`` of one module, imported only when it runs, so ``treeflare --help`` and a
mistyped name answer at once (a job's own imports, NVFlare's among them, take seconds).
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path

PROG = "treeflare"

# name -> (module whose main(argv) runs it, one line of help); the order is the order --help lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "icdta4fl": ("treeflare.jobs.icdta4fl",
                 "ICDTA4FL: local trees, peer scoring, one interpretable global tree (sim, POC, prod, export)"),
    "xgb": ("treeflare.jobs.xgb_histogram", "federated XGBoost, horizontal or vertical (histogram-based)"),
    "vertical": ("treeflare.jobs.vertical_tree",
                 "vertical trees with packed Paillier encryption (SecureBoost-style), and their prediction"),
    "prepare": ("treeflare.tools.prepare_data", "split a dataset or your CSV into the sites' folders"),
    "schema": ("treeflare.tools.schema", "write, discover (from the sites) or check a schema.json"),
    "psi": ("treeflare.tools.psi", "private set intersection of the sites' ids (a job of its own)"),
    "predict": ("treeflare.tools.predict", "predict a CSV with a global tree or an XGBoost model"),
    "export": ("treeflare.tools.export", "export a model to scikit-learn (joblib) or ONNX"),
    "report": ("treeflare.tools.report_html", "write a job's report.html again from its report.json"),
    "site": ("treeflare.tools.site_setup", "a site's operator: bind a kit to its data; provision; allow-package"),
    "poc": ("treeflare.flare.deploy", "a local POC system: up K | down | status | submit JOB_DIR | run JOB ..."),
    "provision": ("treeflare.tools.site_setup", "provision a project: startup kits for the server, sites, admin"),
    "bench": ("", "run a benchmark of this source tree: treeflare bench NAME [args] (scripts/bench_NAME.py)"),
}
ALIASES = {"xgb_histogram": "xgb", "vertical_tree": "vertical", "prepare_data": "prepare", "report_html": "report",
           "site_setup": "site"}
USAGE_ERROR = 2


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [options]   ({PROG} COMMAND --help for a command's options)", "",
             "Federated tree models on NVIDIA FLARE.", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def suggestion(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _refuse(message: str) -> int:
    print(f"{PROG}: error: {message}\n(see `{PROG} --help`)", file=sys.stderr)
    return USAGE_ERROR


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("treeflare")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _run_module(module: str, name: str, argv: list[str]) -> int:
    saved = sys.argv[0]
    # argparse names the program after sys.argv[0]: usage lines read as typed
    sys.argv[0] = f"{PROG} {name}".strip()
    try:
        result = importlib.import_module(module).main(argv)
    finally:
        sys.argv[0] = saved
    return int(result or 0)


def _poc(argv: list[str]) -> int:
    """``treeflare poc up K | down | status | submit JOB_DIR [OUT] | run JOB [args]``, as treeflare poc does."""
    from .flare.poc import default_poc_root

    root = str(default_poc_root())
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} poc up K | down | status | submit JOB_DIR [OUT] | run JOB [job options]\n\n"
              f"A local NVFlare POC system in {root} ($TREEFLARE_POC_ROOT): its own HOME and workspace, so "
              f"~/.nvflare is never touched.\n"
              "  up K                start a server and sites site-1..site-K\n"
              "  down                stop everything the POC started\n"
              "  status              what is running\n"
              "  submit JOB_DIR [OUT] submit an exported job folder, wait, download its result into OUT\n"
              "  run JOB [options]   run a job (icdta4fl, xgb, vertical) on it: --env poc, outputs in --workspace "
              "(default: <POC root>/runs/JOB)")
        return 0 if argv else USAGE_ERROR
    verb, rest = argv[0], argv[1:]
    if verb == "up":
        return _run_module("treeflare.flare.deploy", "poc up", ["poc-up", "--root", root, *rest])
    if verb in ("down", "status"):
        return _run_module("treeflare.flare.deploy", f"poc {verb}", [f"poc-{verb}", "--root", root, *rest])
    if verb == "submit":
        if not rest:
            return _refuse("poc submit needs JOB_DIR (a folder written by a job's --export)")
        out = rest[1] if len(rest) > 1 else str(Path(root) / "results")
        return _run_module("treeflare.flare.deploy", "poc submit",
                           ["submit", rest[0], "--root", root, "--out", out, *rest[2:]])
    if verb == "run":
        jobs = ("icdta4fl", "xgb", "vertical")
        if not rest:
            return _refuse(f"poc run needs a job: {', '.join(jobs)}")
        job = ALIASES.get(rest[0], rest[0])
        if job not in jobs:
            return _refuse(f"no job '{rest[0]}' (jobs: {', '.join(jobs)}){suggestion(rest[0], jobs)}")
        from .flare.poc import LocalPoc

        if not LocalPoc(Path(root)).running():
            return _refuse(f"no POC running in {root}; start one with: {PROG} poc up K")
        options = rest[1:]
        if not any(o == "--workspace" or o.startswith("--workspace=") for o in options):
            options += ["--workspace", str(Path(root) / "runs" / rest[0])]  # as scripts/poc.sh names it
        return _run_module(COMMANDS[job][0], job, [*options, "--env", "poc", "--poc-root", root])
    return _refuse(f"poc: unknown '{verb}' (up, down, status, submit, run){suggestion(verb, ['up', 'down', 'status', 'submit', 'run'])}")


def _bench(argv: list[str]) -> int:
    """Benchmarks are scripts of the source tree (they are not shipped in the package): run one in process."""
    import runpy

    scripts = Path(__file__).resolve().parents[2] / "scripts"
    names = sorted(p.stem[len("bench_"):] for p in scripts.glob("bench_*.py")
                   if p.name != "bench_common.py") if scripts.is_dir() else []  # (bench_common: their shared helpers)
    if not names:
        return _refuse("bench: the benchmarks live in the source tree's scripts/ folder, which this installation "
                       "has not (run them from a clone: python scripts/bench_NAME.py)")
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} bench NAME [options]   (NAME --help for its options)\nbenchmarks: {', '.join(names)}")
        return 0 if argv else USAGE_ERROR
    if argv[0] not in names:
        return _refuse(f"bench: no benchmark '{argv[0]}' (benchmarks: {', '.join(names)}){suggestion(argv[0], names)}")
    script = scripts / f"bench_{argv[0]}.py"
    saved = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(scripts))  # as `python scripts/bench_NAME.py` has it: bench_common beside it
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:
        if isinstance(done.code, str):  # SystemExit("error: ...") prints its message, as Python would
            print(done.code, file=sys.stderr)
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        if len(argv) > 1 and argv[0] == "help":  # `treeflare help icdta4fl` == `treeflare icdta4fl --help`
            return main([argv[1], "--help"])
        print(usage())
        return 0 if argv else USAGE_ERROR
    if argv[0] in ("-V", "--version"):
        print(f"{PROG} {_version()}")
        return 0
    name, rest = ALIASES.get(argv[0], argv[0]), argv[1:]
    if name.startswith("-"):
        return _refuse(f"unknown option '{name}' before the command")
    if name not in COMMANDS:
        return _refuse(f"unknown command '{argv[0]}'{suggestion(argv[0], [*COMMANDS, *ALIASES])}")
    if name == "poc":
        return _poc(rest)
    if name == "bench":
        return _bench(rest)
    if name == "provision":  # `site_setup provision`, whose parser then reads as `treeflare provision`
        return _run_module(COMMANDS[name][0], "", ["provision", *rest])
    return _run_module(COMMANDS[name][0], name, rest)


if __name__ == "__main__":
    sys.exit(main())
