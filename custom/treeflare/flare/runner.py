"""Run a FedJob in the simulator, on a POC system or a provisioned system, or export it.

Every job script calls :func:`run_job`; the whole ``treeflare`` package is shipped as the job's custom
code (NVFlare's automatic copy is shallow: it would take only the component's own file).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from nvflare.apis.job_def import ALL_SITES

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


def ship_package(job, client_targets=(ALL_SITES,)) -> None:
    """Put the whole package into the server and client apps' custom/ folders."""
    job.set_app_packages(["treeflare"])  # no shallow auto-copy of single modules
    job.to(str(CUSTOM_DIR), "server")
    for target in client_targets:
        job.to(str(CUSTOM_DIR), target)
    job.to({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}}, "server")


def export_job(job, export_dir: Path) -> Path:
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    job.export_job(str(export_dir))
    out = export_dir / job.name
    for cache in out.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return out


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
        env = SimEnv(clients=sites, num_threads=len(sites), workspace_root=str(root), log_config=args.log_level)
        env.deploy(job)
        return root / job.name / "server" / "simulate_job"
    if args.env == "poc":
        from nvflare.recipe.poc_env import PocEnv

        env = PocEnv(clients=sites)
    else:
        from nvflare.recipe.prod_env import ProdEnv

        if not args.startup_kit:
            raise SystemExit("error: --env prod needs --startup-kit (the admin's startup kit folder)")
        env = ProdEnv(startup_kit_location=str(args.startup_kit))
    from nvflare.recipe.run import Run

    job_id = env.deploy(job)
    result = Run(env, job_id).get_result(timeout=args.timeout)
    if not result:
        raise SystemExit(f"error: job {job_id} did not finish within {args.timeout:.0f} s or has no result")
    return _find_run_dir(Path(result))


def _find_run_dir(result: Path) -> Path:
    """The downloaded server workspace: the folder that holds our report files."""
    for candidate in [result / "workspace", result]:
        if candidate.is_dir():
            return candidate
    return result


def python_path_note() -> str:
    return f"{sys.executable} ({os.environ.get('VIRTUAL_ENV', 'no venv')})"
