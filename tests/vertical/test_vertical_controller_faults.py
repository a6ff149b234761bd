"""The vertical job's server when a site goes quiet, fails or sends nothing readable, driven in process: the
controller's own ``broadcast`` is replaced by sites that answer (or not) at once, so no FLARE system runs.

What is checked is what a person reading the report needs: the job ends ``failed`` (never ``running``), the reason
names the site and the task, it ends within the task timeout plus the grace (or at once when a site fails outright),
and no task of the round is left standing (NVFlare would keep sending it)."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from nvflare.apis.controller_spec import TaskCompletionStatus
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.impl.wf_comm_server import WFCommServer
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from treeflare.flare import workflow
from treeflare.flare.vertical import controller as vc
from treeflare.flare.vertical.protocol import MSG, STEP

SITES = ["site-1", "site-2", "site-3"]


def ok(**fields) -> Shareable:
    reply = make_reply(ReturnCode.OK)
    reply.update(fields)
    return reply


class Sites:
    """Answers each task as ``behaviour[site]`` says: "reply" (a valid one), "silent" (never), "error" (rc
    EXECUTION_EXCEPTION), "dead" (NVFlare deems the site dead), "unreadable" (task done, no result)."""

    def __init__(self, behaviour: dict):
        self.behaviour = behaviour
        self.tasks = []

    def broadcast(self, task, fl_ctx, targets=None, min_responses=1, **_):
        self.tasks.append(task)
        site = targets[0]
        how = self.behaviour.get(site, "reply")
        task.client_tasks = []
        if how == "silent":
            return
        if how == "dead":
            task.completion_status = TaskCompletionStatus.CLIENT_DEAD
            return
        if how == "unreadable":
            result = None
        elif how == "error":
            result = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            result["error"] = "ProtocolError: bad layer"
        elif task.name == STEP:  # the active site: its first step sends every passive site a setup message
            result = ok(done=False, outbox={s: {"type": "setup"} for s in SITES[1:]})
        else:
            result = ok(msg={"type": "setup_ok"})
        task.client_tasks.append(SimpleNamespace(client=SimpleNamespace(name=site), result=result))
        task.completion_status = TaskCompletionStatus.OK


def run_job(tmp_path, behaviour, task_timeout=1):
    ctl = vc.VerticalController(active_site=SITES[0], passive_sites=SITES[1:], task_timeout=task_timeout,
                                params={"n_trees": 1, "max_depth": 2})
    ctl.set_communicator(WFCommServer())  # its cancel_task: what the controller's own deadline calls
    sites = Sites(behaviour)
    ctl.broadcast = sites.broadcast
    panics, errors = [], []
    ctl.system_panic = lambda reason, fl_ctx: panics.append(reason)
    ctl.log_error = lambda fl_ctx, msg, *a, **k: errors.append(msg)
    workspace = SimpleNamespace(get_run_dir=lambda job_id: str(tmp_path))
    engine = SimpleNamespace(get_clients=lambda: [SimpleNamespace(name=s) for s in SITES],
                             get_workspace=lambda: workspace, get_component=lambda _id: None)
    ctx = SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job")
    t = time.monotonic()
    ctl.control_flow(Signal(), ctx)
    took = time.monotonic() - t
    result = json.loads((tmp_path / vc.RESULT_FILE).read_text())
    return result, panics, sites.tasks, took


@pytest.mark.parametrize("behaviour, reason", [
    ({"site-3": "silent"}, f"site-3: no reply to {MSG} (setup) within 1 s"),
    ({"site-1": "silent"}, f"site-1: no reply to {STEP} within 1 s"),
])
def test_a_site_that_never_replies_fails_the_job_naming_it_within_the_timeout(tmp_path, monkeypatch, behaviour,
                                                                                reason):
    monkeypatch.setattr(workflow, "DEADLINE_GRACE_S", 0.3)  # NVFlare's monitor is not running: the controller's deadline
    result, panics, tasks, took = run_job(tmp_path, behaviour)
    assert result["status"] == "failed" and result["error"] == reason
    assert panics == [reason]
    assert 1.0 <= took < 1.0 + 0.3 + 1.0
    assert all(t.completion_status is not None for t in tasks)  # the silent site's task ended, not left standing


@pytest.mark.parametrize("how, reason", [
    ("error", f"site-2: {MSG} (setup) failed with return code EXECUTION_EXCEPTION: ProtocolError: bad layer"),
    ("dead", f"site-2: disconnected (NVFlare deemed it dead) with no reply to {MSG} (setup)"),
    ("unreadable", f"site-2: its reply to {MSG} (setup) did not come through"),
])
def test_a_failing_site_ends_the_round_at_once_and_its_peers_tasks_are_cancelled(tmp_path, how, reason):
    result, panics, tasks, took = run_job(tmp_path, {"site-2": how, "site-3": "silent"}, task_timeout=60)
    assert result["status"] == "failed" and result["error"].startswith(reason)
    assert took < 5  # not the 60 s site-3 still had
    site3 = [t for t in tasks if t.name == MSG][-1]
    assert site3.completion_status == TaskCompletionStatus.TIMEOUT  # cancelled, NVFlare drops it


def test_nvflares_own_timeout_reads_as_no_reply_within_the_timeout():
    """What WFCommServer does at the timeout: the task ends TIMEOUT with no result."""
    ctl = vc.VerticalController(passive_sites=["site-3"], task_timeout=60)
    task = SimpleNamespace(client_tasks=[], completion_status=TaskCompletionStatus.TIMEOUT)
    with pytest.raises(vc.JobFailed, match="^site-3: no reply to vertical_msg \\(layer\\) within 60 s$"):
        ctl._check("vertical_msg (layer)", "site-3", task)
    task.completion_status = TaskCompletionStatus.ABORTED  # the job aborted: not a silence of the site's
    with pytest.raises(vc.JobFailed, match="^site-3: vertical_msg \\(layer\\) ended \\(aborted\\) with no reply$"):
        ctl._check("vertical_msg (layer)", "site-3", task)
