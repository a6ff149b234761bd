"""A server component that ends, at server start, the jobs a server restart interrupted.

NVFlare 2.9 runs each job in a server job process of its own. When the server stops (or dies) while a job runs, that
process dies with it; the sites' job processes end once they can no longer reach it. But the job store still says
``RUNNING``: 2.9's ``JobRunner`` has methods for this case (``update_abnormal_finished_jobs``), yet nothing calls
them, so after a restart ``list_jobs`` shows the job running for ever, ``download_job`` refuses it and the job's
treeflare result file was never written.

:class:`InterruptedJobRecovery`, listed in the server kit's ``local/resources.json`` components (see
:func:`add_to_server_kit`; ``python -m treeflare.flare.deploy server-recovery KIT``), does at server bootstrap, before
the job runner schedules anything, for every job the job store lists as RUNNING or DISPATCHED that this server does
not run (a fresh server runs none; a server job process of the job left on the host is also looked for):

1. writes the job's treeflare result file (``xgb_result.json``, ``icdta4fl_result.json``, ... -- the one its last
   treeflare workflow writes) into the job's run folder, ``status: failed`` with the reason, unless that workflow
   had already written a final result;
2. archives the run folder into the job store (``JobDefManagerSpec.save_workspace``, as NVFlare does at a job's
   end), so ``nvflare job download`` / ``download_job`` fetch it with everything the job wrote before;
3. sets the job's status to ``FINISHED:ABNORMAL`` (``JobDefManagerSpec.set_status``, NVFlare's own status for "the
   previous run ended abnormally") and records the reason in the job's meta (``treeflare_end_reason``).

Everything goes through NVFlare's public job manager API; no job store file is edited by hand.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import SystemComponents
from nvflare.apis.job_def import RunStatus

from ..files import write_json_atomic

REASON = "the server restarted during the job (its server job process ended with the server)"
META_REASON_KEY = "treeflare_end_reason"
COMPONENT_ID = "treeflare_interrupted_job_recovery"
COMPONENT_PATH = "treeflare.flare.server_recovery.InterruptedJobRecovery"
PACKAGE_PREFIX = "treeflare."
FINAL_STATES = ("completed", "failed")


def result_file_of(run_dir: Path) -> tuple[str, str] | None:
    """(job name, result file name) of the job deployed in ``run_dir``: those of the last treeflare workflow in its
    server app's config (a PSI phase comes before the job's own workflow); None for a job with no treeflare
    workflow. Only classes under ``treeflare.`` are imported (the config came with a submitted job)."""
    for config in sorted(Path(run_dir).glob("*/config/config_fed_server.json")):
        try:
            workflows = json.loads(config.read_text()).get("workflows") or []
        except (OSError, ValueError):
            continue
        for wf in reversed(workflows):
            path = str(wf.get("path") or wf.get("name") or "") if isinstance(wf, dict) else ""
            if not path.startswith(PACKAGE_PREFIX) or "." not in path:
                continue
            module, _, name = path.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
            result_file = getattr(cls, "RESULT_FILE", "")
            if isinstance(result_file, str) and result_file and os.path.basename(result_file) == result_file:
                return str(getattr(cls, "JOB", "") or ""), result_file
    return None


def write_failed_result(run_dir: Path, reason: str = REASON) -> Path | None:
    """Write the job's result file in ``run_dir`` as ``failed`` with ``reason``; a final result already there (the
    workflow finished before the server went) is kept. Returns the file, or None when the job has none."""
    found = result_file_of(run_dir)
    if not found:
        return None
    job, name = found
    path = Path(run_dir) / name
    try:
        old = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        old = {}
    if isinstance(old, dict) and old.get("status") in FINAL_STATES:
        return path
    result = {**(old if isinstance(old, dict) else {}), "job": job or old.get("job", ""), "status": "failed",
              "error": reason, "ended": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(path, result)
    return path


SERVER_JOB_MODULE = b"nvflare.private.fed.app.server.runner_process"  # what a server job process runs (2.9)


def _job_process_alive(job_id: str) -> bool:
    """Whether a server job process of ``job_id`` still runs on this host (its command line runs NVFlare's server
    job module and names the job; a site's job process, on the same host in a test, does not count)."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        if pid == me:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if SERVER_JOB_MODULE in cmdline and job_id.encode() in cmdline:
            return True
    return False


def end_interrupted_jobs(job_manager, workspace, fl_ctx, running=(), alive=_job_process_alive,
                         reason: str = REASON) -> list[str]:
    """End the jobs ``job_manager`` lists as RUNNING or DISPATCHED that are not in ``running`` and have no live
    process (``alive``): failed result written, run folder archived, status FINISHED:ABNORMAL. The ids ended."""
    ended = []
    for job in job_manager.get_jobs_by_status([RunStatus.RUNNING, RunStatus.DISPATCHED], fl_ctx):
        job_id = job.job_id
        if job_id in running or alive(job_id):
            continue
        run_dir = Path(workspace.get_run_dir(job_id))
        if run_dir.is_dir():
            write_failed_result(run_dir, reason)
        sources = []
        for d in (workspace.get_run_dir(job_id), workspace.get_result_root(job_id), workspace.get_log_root(job_id),
                  workspace.get_audit_root(job_id)):
            if d not in sources and os.path.isdir(d):
                sources.append(d)
        if sources:  # a list of folders: NVFlare's store zips them without touching them
            job_manager.save_workspace(job_id, sources, fl_ctx)
        job_manager.update_meta(job_id, {META_REASON_KEY: reason}, fl_ctx)
        job_manager.set_status(job_id, RunStatus.FINISHED_ABNORMAL, fl_ctx)
        ended.append(job_id)
    return ended


class InterruptedJobRecovery(FLComponent):
    """Server component (``local/resources.json``): at bootstrap, ends the jobs a server restart interrupted (see
    the module docstring)."""

    def __init__(self):
        super().__init__()
        self._done = False

    def handle_event(self, event_type: str, fl_ctx) -> None:
        if self._done or event_type not in (EventType.SYSTEM_BOOTSTRAP, EventType.SYSTEM_START):
            return
        self._done = True
        try:
            engine = fl_ctx.get_engine()
            job_manager = engine.get_component(SystemComponents.JOB_MANAGER)
            if job_manager is None:
                self.log_warning(fl_ctx, "no job manager: interrupted jobs not looked for")
                return
            runner = getattr(engine, "job_runner", None)
            running = set(getattr(runner, "running_jobs", {}) or {}) | set(getattr(engine, "run_processes", {}) or {})
            ended = end_interrupted_jobs(job_manager, engine.get_workspace(), fl_ctx, running=running)
            for job_id in ended:
                self.log_warning(fl_ctx, f"job {job_id}: {RunStatus.FINISHED_ABNORMAL.value}: {REASON}")
            if not ended:
                self.log_info(fl_ctx, "no job interrupted by a server restart")
        except Exception as exc:  # noqa: BLE001 - the server must start even if this fails; say why
            self.log_error(fl_ctx, f"interrupted jobs not ended: {type(exc).__name__}: {exc}")


def add_to_server_kit(kit: Path) -> Path:
    """Add :class:`InterruptedJobRecovery` to the server kit's ``local/resources.json`` (made from
    ``resources.json.default`` when missing); idempotent. Returns the file written."""
    local = Path(kit) / "local"
    current = local / "resources.json"
    source = current if current.is_file() else local / "resources.json.default"
    if not source.is_file():
        raise FileNotFoundError(f"{kit}: no local/resources.json(.default): not a server kit")
    resources = json.loads(source.read_text())
    if not isinstance(resources.get("servers"), list):
        raise ValueError(f"{source}: no 'servers' section: not a server kit")
    components = resources.setdefault("components", [])
    if not any(isinstance(c, dict) and c.get("id") == COMPONENT_ID for c in components):
        components.append({"id": COMPONENT_ID, "path": COMPONENT_PATH, "args": {}})
    write_json_atomic(current, resources)         # the server reads this file at start: never half of it
    return current
