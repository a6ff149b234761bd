"""Run a FedJob in the simulator, on a POC system or a provisioned system, or export it.

Every job script calls :func:`run_job`; the whole ``treeflare`` package is shipped as the job's custom
code (NVFlare's automatic copy is shallow: it would take only the component's own file).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from nvflare.apis.job_def import ALL_SITES

from ..reporting import write_json_atomic

CUSTOM_DIR = Path(__file__).resolve().parents[2]  # <repo>/custom, which holds treeflare/
# Clients poll for tasks every 2 s by default; our workflows exchange a handful of short tasks.
TASK_REQUEST_INTERVAL = 0.2


def add_run_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("where to run")
    g.add_argument("--workspace", required=True, type=Path,
                   help="output folder: report.json, models and pictures land here")
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


def staged_package() -> Path:
    """A clean copy of the package (no caches, no build metadata) in a folder of its own.

    ``job.to(folder)`` copies the folder's *contents* into the app's custom/, so the folder holds
    ``treeflare/`` and lands as ``custom/treeflare/``.
    """
    stage = Path(tempfile.mkdtemp(prefix="treeflare-custom-"))
    shutil.copytree(CUSTOM_DIR / "treeflare", stage / "treeflare",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    atexit.register(shutil.rmtree, stage, True)
    return stage


def ship_package(job, client_targets=(ALL_SITES,)) -> None:
    """Put the whole package into the server and client apps' custom/ folders."""
    job.set_app_packages(["treeflare"])  # no shallow auto-copy of single modules
    stage = str(staged_package())
    job.to(stage, "server")
    for target in client_targets:
        job.to(stage, target)
    job.to({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}}, "server")


def recipe_job(recipe):
    """The FedJob behind an NVFlare Recipe (e.g. the XGB recipes), completed as ``recipe.run()`` would do it,
    so that :func:`ship_package` and :func:`run_job` can treat it like any other job."""
    recipe._validate_before_use()
    recipe._ensure_client_apps_prepared()
    recipe.finalize()
    return recipe._job


def export_job(job, export_dir: Path) -> Path:
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    job.export_job(str(export_dir))
    out = export_dir / job.name
    for cache in out.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return out


def _shell_unsafe(path) -> bool:
    # NVFlare's simulator joins its command lines as text and splits them with shlex.
    return any(c.isspace() or c in "'\"\\$`;&|<>()*?[]#~!" for c in str(path))


@contextlib.contextmanager
def shell_safe_paths(root: Path):
    """``root`` as the simulator may see it: itself, or (when it, this Python or the temporary folder holds a
    space or another character a shell would split on) a symlink to it from a fresh folder whose path holds none.
    This Python is reached the same way (a link to its environment), and NVFlare's temporary job folder is made
    there too. Everything is written into ``root``; the links are removed afterwards."""
    python, tmp = Path(sys.executable), Path(tempfile.gettempdir())
    if not any(_shell_unsafe(p) for p in (root, python, tmp)):
        yield root
        return
    base = next((Path(d) for d in (tmp, "/tmp", "/var/tmp") if Path(d).is_dir() and not _shell_unsafe(d)), None)
    if base is None:
        raise SystemExit(f"error: no temporary folder without spaces for the simulator (TMPDIR={tmp})")
    alias = Path(tempfile.mkdtemp(prefix="treeflare-sim-", dir=base))
    saved = sys.executable, tempfile.tempdir
    try:
        (alias / "flare").symlink_to(root, target_is_directory=True)
        if _shell_unsafe(python):
            prefix = Path(sys.prefix)
            (alias / "env").symlink_to(prefix, target_is_directory=True)
            sys.executable = str(alias / "env" / python.relative_to(prefix)) if python.is_relative_to(prefix) \
                else sys.executable
        (alias / "tmp").mkdir()
        tempfile.tempdir = str(alias / "tmp")
        yield alias / "flare"
    finally:
        sys.executable, tempfile.tempdir = saved
        shutil.rmtree(alias, ignore_errors=True)  # the links only: rmtree does not follow them


def run_job(job, args, sites: list[str]) -> Path:
    """Run ``job`` where ``args.env`` says and return the server's run folder (its artifacts)."""
    if getattr(args, "export", None):
        out = export_job(job, args.export)
        print(f"job exported to {out}\nsubmit it with: nvflare job submit -j {out}")
        raise SystemExit(0)
    workspace = Path(args.workspace).resolve()
    if args.env == "sim":
        from nvflare.recipe.sim_env import SimEnv

        root = workspace / "flare"
        root.mkdir(parents=True, exist_ok=True)
        with shell_safe_paths(root) as sim_root:
            env = SimEnv(clients=sites, num_threads=len(sites), workspace_root=str(sim_root),
                         log_config=args.log_level)
            try:
                env.deploy(job)
            except RuntimeError as exc:
                # A controller that fails cleanly ends the run with a system panic, which SimEnv turns into
                # an exception; the job's result file in the run folder says why.
                print(f"warning: {exc}", file=sys.stderr)
        return root / job.name / "server" / "simulate_job"
    if args.env == "poc":
        return _run_poc(job, args, sites, workspace)
    if not args.startup_kit:
        raise SystemExit("error: --env prod needs --startup-kit (the admin's startup kit folder)")
    return _run_prod(job, args, workspace)


def _submit(job, args, workspace: Path, admin_kit: Path, site_dirs: dict) -> Path:
    """Export, submit, wait, download the server's result and gather the sites' run folders found on this
    machine: ``<workspace>/flare/<env>_result/{<job_id>/workspace, <site>/<job_id>/}``."""
    from .deploy import submit_and_collect

    out = workspace / "flare" / f"{args.env}_result"
    job_dir = export_job(job, workspace / "flare" / "job")
    outcome = submit_and_collect(admin_kit, job_dir, out, timeout=args.timeout, site_dirs=site_dirs)
    print(f"job {outcome.job_id}: {outcome.status}; server result in {outcome.server_dir}", flush=True)
    if not outcome.ok:
        print(f"warning: job {outcome.job_id} ended {outcome.status}: {STATUS_HELP.get(outcome.status, '')} "
              f"Server log: <server kit>/log.txt; site logs: {out}/<site>/{outcome.job_id}/log.txt "
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


def _run_poc(job, args, sites: list[str], workspace: Path) -> Path:
    from .deploy import DeployError, LocalPoc, flare_lock

    root = args.poc_root or os.environ.get("TREEFLARE_POC_ROOT") or workspace / "flare" / "poc"
    poc = LocalPoc(Path(root))
    try:
        if poc.running():  # e.g. started by `scripts/poc.sh up K`: use it, leave it running
            if poc.sites != sorted(sites):
                raise DeployError(f"the POC in {poc.root} has sites {poc.sites}, this job needs {sorted(sites)}: "
                                  f"run `scripts/poc.sh up {len(sites)}` (or pass matching --sites)")
            return _submit(job, args, workspace, poc.admin_kit, poc.site_dirs())
        import signal

        # SIGTERM (e.g. from a CI timeout) unwinds like Ctrl-C, so the POC below is always stopped
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with flare_lock():
            try:
                print(f"starting a POC with {len(sites)} sites in {poc.root}", flush=True)
                poc.prepare(sites)
                poc.start()
                return _submit(job, args, workspace, poc.admin_kit, poc.site_dirs())
            finally:
                poc.stop()  # always, even on failure or Ctrl-C
    except DeployError as exc:
        raise SystemExit(f"error: {exc}")


def _run_prod(job, args, workspace: Path) -> Path:
    from .deploy import DeployError, local_site_dirs

    kit = Path(args.startup_kit).resolve()
    try:
        return _submit(job, args, workspace, kit, local_site_dirs(kit))
    except DeployError as exc:
        raise SystemExit(f"error: {exc}")


def _find_run_dir(result: Path) -> Path:
    """The downloaded server workspace: the folder that holds our report files."""
    for candidate in [result / "workspace", result]:
        if candidate.is_dir():
            return candidate
    return result


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
        print(f"error: {job} failed: {server.get('error')}", file=sys.stderr)
        write_json_atomic(Path(workspace) / "report.json", {**server, "job": job})
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


def python_path_note() -> str:
    return f"{sys.executable} ({os.environ.get('VIRTUAL_ENV', 'no venv')})"
