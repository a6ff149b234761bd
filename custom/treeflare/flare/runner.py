"""Run a job's recipe (:mod:`.recipe`) in the simulator, on a POC system or a provisioned system, or export it.

Every job calls :func:`run_job`; it adds what a recipe's ``execute`` has not: POC systems started and stopped for
the run, results downloaded and gathered, progress lines while the job runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from ..cli import interrupted_by, interruptible
from ..processes import child_processes, end_tree
from ..files import write_json_atomic
from .progress import PROGRESS_FILE

SIM_TMP_PREFIX = "tf-sim-"


WORKSPACE_WHY = ("--workspace is needed with --export too: the data this script prepares (--dataset, --csv) is "
                 "written under it, and the exported job points the sites at that folder unless --data-root says "
                 "where theirs is")


def _recipe_module_without_our_argv() -> None:
    """NVFlare's ``nvflare.recipe.spec``, when first imported (the XGBoost job imports it through
    ``nvflare.app_opt.xgboost``), takes ``--export``/``--export-dir`` out of ``sys.argv`` as its own recipe
    options and warns (a UserWarning) that they are reserved. Our ``--export DIR`` is ours, parsed by our parser,
    and we export with ``recipe.export(dir)``, never through ``recipe.execute``: import the module once with no arguments in view, before our parser
    runs, so NVFlare neither takes ours (whatever the import order) nor warns. No other warning is touched."""
    if "nvflare.recipe.spec" in sys.modules:
        return
    saved = sys.argv[1:]
    sys.argv[1:] = []
    try:
        import nvflare.recipe.spec  # noqa: F401
    finally:
        sys.argv[1:] = saved


def add_run_args(parser: argparse.ArgumentParser) -> None:
    _recipe_module_without_our_argv()
    g = parser.add_argument_group("where to run")
    g.add_argument("--workspace", required=True, type=Path,
                   help="output folder: report.json, models and pictures land here; also needed with --export, "
                        "which points the sites at the data prepared under it (unless --data-root)")
    error = parser.error

    def error_saying_why(message):  # argparse's own message names the option, not why it is needed
        error(f"{message} ({WORKSPACE_WHY})" if "--workspace" in message and "required" in message else message)

    parser.error = error_saying_why
    g.add_argument("--env", choices=["sim", "poc", "prod"], default="sim",
                   help="sim: FLARE simulator (default); poc: a local POC system; prod: provisioned sites")
    g.add_argument("--startup-kit", type=Path, help="admin startup kit folder (with --env prod)")
    g.add_argument("--export", type=Path, metavar="DIR",
                   help="write the job folder for `nvflare job submit -j DIR/<job>` and stop")
    g.add_argument("--log-level", default="WARNING", help="FLARE log level (default WARNING)")
    g.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for a POC/prod job")
    g.add_argument("--poc-root", type=Path, default=None,
                   help="POC folder (its HOME and workspace); a POC already running there is reused, otherwise "
                        "one is started for this job and stopped afterwards (default: $TREEFLARE_POC_ROOT, "
                        "else <workspace>/flare/poc)")


def export_job(recipe, export_dir: Path) -> Path:
    """``recipe`` exported as a job folder ``export_dir/<job name>`` for ``nvflare job submit``."""
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    recipe.export(str(export_dir))
    out = export_dir / recipe.name
    for cache in out.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return out


def export_hint(job_dir: Path, admin_kit=None) -> str:
    """The commands that submit an exported job and fetch its result, as they run (NVFlare 2.9's ``nvflare job``
    needs ``--startup-kit`` on each, or answers STARTUP_KIT_MISSING)."""
    kit = shlex.quote(str(Path(admin_kit).resolve())) if admin_kit else "ADMIN_KIT"
    lines = [f"job exported to {job_dir}", "submit it and fetch its result with"
             + ("" if admin_kit else " (ADMIN_KIT: the admin's startup kit folder)") + ":",
             f"  nvflare job submit -j {shlex.quote(str(job_dir))} --startup-kit {kit}",
             f"  nvflare job wait <job_id> --timeout 3600 --startup-kit {kit}",
             f"  nvflare job download <job_id> -o results --startup-kit {kit}   # results/<job_id>/workspace/"]
    return "\n".join(lines)


def _shell_unsafe(path) -> bool:
    # NVFlare's simulator joins its command lines as text and splits them with shlex.
    return any(c.isspace() or c in "'\"\\$`;&|<>()*?[]#~!" for c in str(path))


@contextlib.contextmanager
def shell_safe_paths(root: Path):
    """A private folder for one simulator run (``/tmp/tf-sim-*``), and ``root`` as the simulator may see it.

    NVFlare's simulator joins its command lines as text and splits them with shlex, so ``root`` (and this
    Python) are handed over as links from this folder, whose path holds no space, when theirs do. The
    folder is also the temporary folder (``TMPDIR``) of this process and of every process the simulator
    starts, so whatever they leave there (job folders, multiprocessing's ``pymp-*``), even when killed, is
    removed with it afterwards. Everything the run writes lands in ``root``."""
    python, tmp = Path(sys.executable), Path(tempfile.gettempdir())
    # Short first: multiprocessing's sockets live in TMPDIR, and a socket path may hold at most 107 bytes.
    base = next((Path(d) for d in ("/tmp", tmp, "/var/tmp")
                 if Path(d).is_dir() and os.access(d, os.W_OK) and not _shell_unsafe(d)), None)
    if base is None:
        raise SystemExit(f"error: no writable temporary folder without spaces for the simulator (TMPDIR={tmp})")
    private = Path(tempfile.mkdtemp(prefix=SIM_TMP_PREFIX, dir=base))
    saved = sys.executable, tempfile.tempdir, os.environ.get("TMPDIR")
    try:
        seen = root
        if _shell_unsafe(root):
            seen = private / "flare"
            seen.symlink_to(root, target_is_directory=True)
        if _shell_unsafe(python) and python.is_relative_to(sys.prefix):
            (private / "env").symlink_to(Path(sys.prefix), target_is_directory=True)
            sys.executable = str(private / "env" / python.relative_to(sys.prefix))
        (private / "t").mkdir()
        tempfile.tempdir = os.environ["TMPDIR"] = str(private / "t")
        yield seen
    finally:
        sys.executable, tempfile.tempdir = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[2]
        shutil.rmtree(private, ignore_errors=True)  # links are removed, not followed


def run_job(recipe, args, sites: list[str], progress=None) -> Path:
    """Run ``recipe`` (a :class:`~treeflare.flare.recipe.TreeflareRecipe`) where ``args.env`` says and return the server's run folder (its artifacts).

    ``progress``: a :class:`~treeflare.flare.progress.ProgressPrinter` that prints the server's progress lines
    while the job runs (the job needs a ``ProgressReporter`` on the server), or None."""
    if getattr(args, "export", None):
        out = export_job(recipe, args.export)
        print(export_hint(out, getattr(args, "startup_kit", None)))
        raise SystemExit(0)
    workspace = Path(args.workspace).resolve()
    if args.env == "sim":
        from nvflare.recipe.sim_env import SimEnv

        root = workspace / "flare"
        root.mkdir(parents=True, exist_ok=True)
        before = {p.pid for p in child_processes()}
        try:
            with shell_safe_paths(root) as sim_root:
                env = SimEnv(clients=sites, num_threads=len(sites), workspace_root=str(sim_root),
                             log_config=args.log_level)
                server_file = root / recipe.name / "server" / "simulate_job" / PROGRESS_FILE
                watch = progress.follow_file(server_file) if progress else contextlib.nullcontext()
                try:
                    with watch:
                        recipe.run(env)
                    if progress:
                        progress.show_file(server_file, fresh_only=True)  # the lines since the last poll
                        progress.finish()
                except RuntimeError as exc:
                    if interrupted_by():  # NVFlare caught our KeyboardInterrupt and reported a failed run
                        raise KeyboardInterrupt from None
                    # A controller that fails cleanly ends the run with a system panic, which SimEnv turns into
                    # an exception; the job's result file in the run folder says why.
                    print(f"warning: {exc}", file=sys.stderr)
        finally:
            # the simulator and the sites it started, each in a session of its own (a process-group signal
            # would miss them); the children that were there before are not ours to end
            end_tree(child_processes(exclude=before))
        return root / recipe.name / "server" / "simulate_job"
    if args.env == "poc":
        return _run_poc(recipe, args, sites, workspace, progress)
    if not args.startup_kit:
        raise SystemExit("error: --env prod needs --startup-kit (the admin's startup kit folder)")
    return _run_prod(recipe, args, workspace, progress)


def _submit(recipe, args, workspace: Path, admin_kit: Path, site_dirs: dict, progress=None,
            server_log: Path | None = None) -> Path:
    """Export, submit, wait, download the server's result and gather the sites' run folders found on this
    machine: ``<workspace>/flare/<env>_result/{<job_id>/workspace, <site>/<job_id>/}``."""
    from .admin import submit_and_collect

    out = workspace / "flare" / f"{args.env}_result"
    job_dir = export_job(recipe, workspace / "flare" / "job")
    watch = (lambda job_id: progress.follow_admin(admin_kit, job_id)) if progress else None
    outcome = submit_and_collect(admin_kit, job_dir, out, timeout=args.timeout, site_dirs=site_dirs, watch=watch)
    if progress and outcome.server_dir is not None:
        progress.show_file(Path(outcome.server_dir) / PROGRESS_FILE)  # the lines after the last poll
    if progress:
        progress.finish()
    print(f"job {outcome.job_id}: {outcome.status}; server result in {outcome.server_dir}", flush=True)
    if not outcome.ok:
        print(f"warning: job {outcome.job_id} ended {outcome.status}: {STATUS_HELP.get(outcome.status, '')} "
              f"Server log: {server_log or 'log.txt in the server kit folder, on the server host'}; site logs: {out}/<site>/{outcome.job_id}/log.txt "
              "(for sites on this machine).", file=sys.stderr, flush=True)
    if outcome.server_dir is None:
        raise SystemExit(f"error: job {outcome.job_id} ended {outcome.status} and has no result to download")
    return outcome.server_dir


STATUS_HELP = {
    "FINISHED:ABORTED": "it was aborted (from the admin side, or it did not finish within --timeout).",
    "FINISHED:ABNORMAL": "NVFlare stopped it because a site's job process died or failed to start (NVFlare then "
                         "fails the whole job, whatever --min-clients says).",
    "FINISHED:EXECUTION_EXCEPTION": "the workflow failed; its result file says why.",
}


def _run_poc(recipe, args, sites: list[str], workspace: Path, progress=None) -> Path:
    from .admin import DeployError

    with one_poc(args, sites) as poc:
        try:
            return _submit(recipe, args, workspace, poc.admin_kit, poc.site_dirs(), progress,
                           server_log=poc.server_dir / "log.txt")
        except DeployError as exc:
            raise SystemExit(f"error: {exc}")


@contextlib.contextmanager
def one_poc(args, sites: list[str]):
    """With ``--env poc``: the POC that every job run inside this block is submitted to (a command that runs two
    jobs, schema discovery then training, starts one POC, not two). A POC already running in the POC folder is
    used and left running; otherwise one is started here and stopped at the end, also on failure or Ctrl-C.
    Yields the :class:`~treeflare.flare.poc.LocalPoc`, or None for another ``--env`` or ``--export``."""
    if args.env != "poc" or getattr(args, "export", None):
        yield None
        return
    from .admin import DeployError
    from .poc import LocalPoc, flare_lock

    root = args.poc_root or os.environ.get("TREEFLARE_POC_ROOT") or Path(args.workspace).resolve() / "flare" / "poc"
    args.poc_root = Path(root)  # jobs run inside the block find the same POC
    poc = LocalPoc(Path(root))
    try:
        if poc.running():  # e.g. started by `treeflare poc up K`, or by an enclosing block: use it, leave it running
            if poc.sites != sorted(sites):
                raise DeployError(f"the POC in {poc.root} has sites {poc.sites}, this job needs {sorted(sites)}: "
                                  f"run `treeflare poc up {len(sites)}` (or pass matching --sites)")
            yield poc
            return
        # SIGTERM (e.g. from a CI timeout) unwinds like Ctrl-C, so the POC below is always stopped; the handlers
        # are the job scripts' own (main_guard) and are restored on the way out
        with interruptible(), flare_lock():
            try:
                print(f"starting a POC with {len(sites)} sites in {poc.root}", flush=True)
                poc.prepare(sites)
                poc.start()
                yield poc
            finally:
                poc.stop()  # always, even on failure or Ctrl-C
    except DeployError as exc:
        raise SystemExit(f"error: {exc}")


def _run_prod(recipe, args, workspace: Path, progress=None) -> Path:
    from .admin import DeployError, local_site_dirs

    kit = Path(args.startup_kit).resolve()
    try:
        return _submit(recipe, args, workspace, kit, local_site_dirs(kit), progress)
    except DeployError as exc:
        raise SystemExit(f"error: {exc}")


def read_server_result(run_dir: Path, name: str, workspace: Path, job: str) -> dict | None:
    """The controller's result file from the server's run folder.

    None when the run failed: the reason goes to stderr and the failed result becomes the report,
    so the user sees why in the same place as a good run's numbers.
    """
    result_file = Path(run_dir) / name
    if not result_file.is_file():
        print(f"error: the server wrote no result ({result_file} missing); see the logs under "
              f"{Path(workspace) / 'flare'}", file=sys.stderr)
        return None
    server = json.loads(result_file.read_text())
    if server.get("status") != "completed":
        # a result left "running" means the server stopped mid-workflow: the report must say failed
        error = server.get("error") or (f"the server's workflow ended with status {server.get('status')!r}; "
                                        f"see the server log under {Path(workspace) / 'flare'}")
        print(f"error: {job} failed: {error}", file=sys.stderr)
        write_json_atomic(Path(workspace) / "report.json", {**server, "job": job, "status": "failed", "error": error})
        return None
    return server


def find_site_file(server_run_dir, site: str, name: str) -> Path | None:
    """A file a site wrote into its own run folder, found from the server's run folder.

    Simulator: ``<job>/<site>/simulate_job/<name>`` beside ``<job>/server/simulate_job``. POC and
    prod: ``<result>/<site>/<job_id>/<name>``, where :func:`run_job` gathered the site folders that
    are on this machine.
    """
    run = Path(server_run_dir)
    candidates = [run.parents[1] / site / "simulate_job" / name] if len(run.parents) > 1 else []
    job_id = run.parent.name if run.name == "workspace" else run.name
    candidates += [ancestor / site / job_id / name for ancestor in run.parents]
    return next((p for p in candidates if p.is_file()), None)
