"""The PSI phase's server when a site goes quiet or fails during DH-PSI, driven in process: the controller's own
``broadcast_and_wait`` and ``send`` are replaced by sites that answer (or not) at once, so no FLARE system runs.

Checked: the job ends ``failed`` with the result file saying why (naming the site and the DH-PSI step), it ends
within the timeout plus the grace (NVFlare's DH-PSI tasks have no timeout of their own), the other sites' tasks are
cancelled, and only the sites still there are asked to delete their intersection."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from nvflare.apis.controller_spec import TaskCompletionStatus
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal
from nvflare.app_common.app_constant import PSIConst

from treeflare.flare import workflow
from treeflare.flare.psi import controller as pc
from treeflare.flare.psi.protocol import RESULT_FILE, TASK_DISCARD

SITES = ["site-1", "site-2", "site-3"]


def context(tmp_path):
    workspace = SimpleNamespace(get_run_dir=lambda job_id: str(tmp_path))
    engine = SimpleNamespace(get_clients=lambda: [SimpleNamespace(name=s) for s in SITES],
                             get_workspace=lambda: workspace)
    return SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job", get_prop=lambda *a: None,
                           get_identity_name=lambda: "server", get_peer_context=lambda: None,
                           set_prop=lambda *a, **k: None)


def answer(task, site, how, fl_ctx):
    """``site``'s answer to ``task`` as NVFlare delivers it: the result callback, then the task's end."""
    if how == "silent":
        return
    if how == "error":
        result = make_reply(ReturnCode.EXECUTION_EXCEPTION)
    else:
        result = DXO(DataKind.PSI, data={PSIConst.ITEMS_SIZE: 10}).to_shareable()
        result.set_return_code(ReturnCode.OK)
    task.result_received_cb(client_task=SimpleNamespace(client=SimpleNamespace(name=site), result=result,
                                                        task=task), fl_ctx=fl_ctx)


class FakeServer:
    def __init__(self, behaviour: dict):
        self.behaviour, self.sent, self.broadcasts, self.cancelled = behaviour, {}, [], []
        self.task_timeout, self.abort_job_in_error = 60, {}

    def broadcast_and_wait(self, task, fl_ctx, targets=None, min_responses=1, wait_time_after_min_received=0,
                           abort_signal=None):
        targets = targets or SITES
        self.broadcasts.append((task.name, list(targets), task.timeout))
        if task.result_received_cb is not None:
            for site in targets:
                answer(task, site, self.behaviour.get(site, "reply"), fl_ctx)
        # NVFlare's monitor at the timeout, when a target is silent
        silent = any(self.behaviour.get(s) == "silent" for s in targets)
        task.completion_status = TaskCompletionStatus.TIMEOUT if silent else TaskCompletionStatus.OK

    def broadcast(self, task, fl_ctx, targets=None, min_responses=1, **kwargs):
        """What the workflows call (they wait for the replies themselves): the same answers, at once."""
        self.broadcast_and_wait(task, fl_ctx, targets, min_responses)

    def send(self, task, fl_ctx, targets):
        site = targets[0]
        self.sent[site] = task
        how = self.behaviour.get(site, "reply")
        answer(task, site, how, fl_ctx)
        if how != "silent":
            task.completion_status = TaskCompletionStatus.OK

    def cancel_task(self, task, completion_status, fl_ctx):
        self.cancelled.append(task)
        task.completion_status = completion_status


def test_a_silent_site_at_dh_psi_fails_the_job_naming_it_and_the_step(tmp_path):
    ctl = pc.MeteredDhPSIController(sites=SITES, task_timeout=60)
    server = FakeServer({"site-3": "silent"})
    ctl.broadcast_and_wait, ctl.broadcast = server.broadcast_and_wait, server.broadcast
    panics = []
    ctl.system_panic = lambda reason, fl_ctx: panics.append(reason)
    ctl.log_error = ctl.log_warning = lambda *a, **k: None
    ctl.control_flow(Signal(), context(tmp_path))
    result = json.loads((tmp_path / RESULT_FILE).read_text())
    reason = "site-3: no reply to PSI (DH-PSI prepare) within 60 s"
    assert result["status"] == "failed" and result["error"] == reason and panics == [reason]
    assert server.broadcasts[0][2] == 60  # NVFlare's own task had no timeout: it waited for good
    assert server.broadcasts[-1][:2] == (TASK_DISCARD, ["site-1", "site-2"])  # not the site that is gone


@pytest.mark.parametrize("behaviour, reason", [
    ({"site-2": "error", "site-3": "silent"}, "site-2: PSI (DH-PSI setup) failed with return code "
                                             "EXECUTION_EXCEPTION"),
    ({"site-3": "silent"}, "site-3: no reply to PSI (DH-PSI setup) within 1 s"),
])
def test_a_multicast_round_ends_at_the_first_failure_or_its_deadline(monkeypatch, behaviour, reason):
    monkeypatch.setattr(workflow, "DEADLINE_GRACE_S", 0.1)  # NVFlare's monitor is not running: the round's own deadline
    server = FakeServer(behaviour)
    server.task_timeout = 1
    bop = pc.PromptBroadcastAndWait(None, server)
    inputs = {s: Shareable({PSIConst.TASK_KEY: PSIConst.TASK_SETUP}) for s in SITES}
    with pytest.raises(pc.PsiSiteFailed) as exc:
        bop.multicasts_and_wait(PSIConst.TASK, inputs, None, Signal())
    assert str(exc.value) == reason
    assert all(t.timeout == 1 for t in server.sent.values())
    assert server.sent["site-3"] in server.cancelled  # no task of the round left standing
