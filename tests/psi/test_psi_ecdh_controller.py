"""The server's ECDH-PSI workflow (``flare/psi/ecdh_controller.py``) in process: its aux messages go to real
``PsiSession`` parties (no FLARE system runs), so the whole protocol runs through the controller's own code. Checked:
the intersection and the result it records; a party that stalls mid-PSI ends the phase within the task timeout,
naming the site and the round, the others asked to delete what they kept; a party that fails or breaks the protocol
ends it naming the site; and the check phase's set-size bound, before any encryption."""

from __future__ import annotations

import contextlib
import json
import time
from types import SimpleNamespace

import pytest
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import make_reply
from nvflare.apis.signal import Signal
from test_psi_protocol import JOB, world

from treeflare.flare.psi.controller import PsiCheckController, evaluate_check
from treeflare.flare.psi.ecdh_controller import EcdhPsiController
from treeflare.flare.psi.protocol import RESULT_FILE, TASK_DISCARD
from treeflare.flare.workflow import JobFailed
from treeflare.psi.session import PsiSession

SITES = ["site-1", "site-2", "site-3"]


class Parties:
    """What answers the controller's aux messages: each site's session, or a stall / an error at a given round."""

    def __init__(self, items, behaviour=None):
        self.sessions = {s: PsiSession(s, v, job_id=JOB, sites=SITES) for s, v in items.items()}
        self.behaviour = behaviour or {}
        self.discarded = []

    def send_aux_request(self, targets, topic, request, timeout, fl_ctx, **_):
        (site,) = targets
        req = request["request"]
        how, at = self.behaviour.get(site, (None, None))
        if how and req.get("round") == at:
            if how == "stall":
                time.sleep(timeout)  # as NVFlare's aux: no reply within the timeout
                return {}
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = "RuntimeError"
            return {site: reply}
        reply = make_reply(ReturnCode.OK)
        reply["reply"] = self.sessions[site].handle(req)
        return {site: reply}

    @contextlib.contextmanager
    def new_context(self):
        yield None


def context(tmp_path, parties):
    props = {}
    workspace = SimpleNamespace(get_run_dir=lambda job_id: str(tmp_path))
    engine = SimpleNamespace(get_workspace=lambda: workspace, send_aux_request=parties.send_aux_request,
                             new_context=parties.new_context)
    return SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job",
                           get_prop=lambda k, d=None: props.get(k, d),
                           set_prop=lambda k, v, private=True, sticky=True: props.__setitem__(k, v))


def controller(parties, rows, timeout=30):
    ctl = EcdhPsiController(sites=SITES, kinds=["train"], min_rows=1, task_timeout=timeout, chunk=32)
    panics = []
    ctl.system_panic = lambda reason, fl_ctx: panics.append(reason)
    ctl.log_error = ctl.log_warning = ctl.log_info = lambda *a, **k: None

    def broadcast(task, fl_ctx, targets=None, **kw):  # the discard task: every target deletes at once
        parties.discarded.append((task.name, sorted(targets)))
        task.completion_status = "ok"
    ctl.broadcast = broadcast
    ctl.cancel_task = lambda *a, **k: None
    return ctl, panics


def run(tmp_path, items, behaviour=None, timeout=30):
    parties = Parties(items, behaviour)
    ctx = context(tmp_path, parties)
    state = {"job": "psi", "status": "running", "kinds": ["train"], "min_rows": 1, "intersection_size": None,
             "parties": {s: {"rows_before": {"train": len(items[s])}} for s in SITES}, "timings_s": {}}
    ctx.set_prop("treeflare.psi.phase", state)
    ctl, panics = controller(parties, state, timeout)
    t = time.perf_counter()
    ctl.control_flow(Signal(), ctx)
    return parties, state, panics, time.perf_counter() - t


def test_the_controller_relays_the_protocol_to_the_exact_intersection(tmp_path):
    items, common = world(3, 150, 40, seed=2)
    parties, state, panics, _ = run(tmp_path, items)
    assert panics == [] and state["status"] == "running"  # handed on to the result workflow
    assert state["ecdh"]["rounds"] >= 5 and state["ecdh"]["messages"] > 0 and state["ecdh"]["chunk"] == 32
    assert all(sorted(s.kept_items()) == common for s in parties.sessions.values())


def test_a_party_stalling_mid_psi_ends_the_phase_within_the_timeout_naming_it(tmp_path):
    items, _ = world(3, 150, 40, seed=2)
    parties, state, panics, seconds = run(tmp_path, items, {"site-2": ("stall", 3)}, timeout=2)
    result = json.loads((tmp_path / RESULT_FILE).read_text())
    reason = "PSI (ECDH): site-2: no reply to ECDH-PSI round 3 within 2 s (a stalled or gone party)"
    assert result["status"] == "failed" and result["error"] == reason and panics == [reason]
    assert seconds < 2 + 3  # the round's timeout, not more
    assert parties.discarded == [(TASK_DISCARD, ["site-1", "site-3"])]  # the others delete; the stalled one may not answer
    assert not any(s.done for s in parties.sessions.values())


def test_a_party_failing_or_breaking_the_protocol_ends_the_phase_naming_it(tmp_path):
    items, _ = world(3, 60, 20)
    parties, _, panics, _ = run(tmp_path / "a", items, {"site-3": ("error", 2)})
    assert panics == ["PSI (ECDH): site-3: ECDH-PSI round 2 failed: RuntimeError"]
    assert parties.discarded == [(TASK_DISCARD, SITES)]  # a site that answers is asked to delete too
    parties = Parties(items)
    real = parties.sessions["site-1"].handle
    parties.sessions["site-1"].handle = lambda req: {**real(req), "extra": 1} if req.get("round") == 2 else real(req)
    ctx = context(tmp_path, parties)
    ctx.set_prop("treeflare.psi.phase", {"parties": {s: {"rows_before": {"train": 60}} for s in SITES},
                                         "timings_s": {}, "status": "running"})
    ctl, panics = controller(parties, None)
    ctl.control_flow(Signal(), ctx)
    assert panics == ["PSI (ECDH): site-1: its round reply must be {outbox: a list of messages, done: a bool}"]


def test_the_check_stops_a_party_far_larger_than_the_others_before_any_encryption():
    parties = {s: {} for s in SITES}
    replies = {"site-1": {"rows": {"train": 100, "test": 20}}, "site-2": {"rows": {"train": 7000, "test": 800}},
               "site-3": {"rows": {"train": 90, "test": 10}}}
    with pytest.raises(JobFailed) as exc:
        evaluate_check(SITES, replies, {}, ["train", "test"], 1, parties, max_ratio=10.0)
    assert str(exc.value).startswith("PSI check (before any encryption): site-2: holds 7800 ids, more than 10 times "
                                     "the largest other party's 120")
    assert parties["site-2"]["rows_before"] == {"train": 7000, "test": 800}  # the sizes stay in the report
    evaluate_check(SITES, replies, {}, ["train", "test"], 1, {s: {} for s in SITES}, max_ratio=100.0)
    assert PsiCheckController(sites=SITES, max_ratio=3.5).max_ratio == 3.5


# ---- the sites' executors behind the controller: when an intersection is written ---------------------------------

class Sites:
    """Each site's ``EcdhPsiExecutor`` (with its ``SiteIds``), answering the controller's aux messages and the
    phase's tasks as FLARE would deliver them; ``lose``: the site whose reply to the round that made it done is lost
    after the site handled it (its link went down on the way back)."""

    def __init__(self, tmp_path, lose=None):
        from test_psi_inprocess import three_parties

        from treeflare.flare.psi.ecdh_executor import EcdhPsiExecutor
        from treeflare.flare.psi.executor import LOCAL_PSI_ID, SiteIds

        self.held = three_parties(tmp_path / "data")
        self.lose, self.root, self.discarded = lose, tmp_path, []
        self.execs, self.ctx = {}, {}
        for site in SITES:
            comp = SiteIds(kinds=["train", "test"], data_root=str(tmp_path / "data"), schema={"id_column": "pid"})
            ex = EcdhPsiExecutor(sites=SITES)
            for obj in (comp, ex):
                for level in ("log_info", "log_warning", "log_error", "log_debug"):
                    setattr(obj, level, lambda *a, **k: None)
            run_dir = tmp_path / "runs" / site
            run_dir.mkdir(parents=True)
            workspace = SimpleNamespace(get_run_dir=lambda job_id, d=run_dir: str(d),
                                        get_startup_kit_dir=lambda d=run_dir: str(d / "no_kit"))
            engine = SimpleNamespace(get_component={LOCAL_PSI_ID: comp}.get, get_workspace=lambda w=workspace: w)
            self.ctx[site] = SimpleNamespace(get_identity_name=lambda s=site: s, get_engine=lambda e=engine: e,
                                             get_job_id=lambda: "job", get_peer_context=lambda: None,
                                             get_prop=lambda k, d=None: True if k == "__simulate_mode__" else d)
            self.execs[site] = ex

    def task(self, name, site):
        from nvflare.apis.shareable import Shareable

        return self.execs[site].execute(name, Shareable({"request": {"kinds": ["train", "test"]}}), self.ctx[site],
                                        Signal())

    def send_aux_request(self, targets, topic, request, timeout, fl_ctx, **_):
        (site,) = targets
        reply = self.execs[site]._on_aux(topic, request, self.ctx[site])
        if self.lose == site and self.execs[site].session.done:
            return {}
        return {site: reply}

    @contextlib.contextmanager
    def new_context(self):
        yield None

    def kept(self, site):
        path = self.root / "runs" / site / "psi" / "intersection.json"
        return json.loads(path.read_text())["ids"] if path.is_file() else None


def run_sites(tmp_path, lose=None):
    from treeflare.flare.psi.protocol import TASK_CHECK

    sites = Sites(tmp_path, lose)
    rows = {}
    for site in SITES:
        reply = sites.task(TASK_CHECK, site)
        assert reply.get_return_code() == ReturnCode.OK, reply.get("error")
        rows[site] = reply["reply"]["rows"]
    ctx = context(tmp_path / "server", sites)
    (tmp_path / "server").mkdir()
    ctx.set_prop("treeflare.psi.phase", {"parties": {s: {"rows_before": rows[s]} for s in SITES}, "timings_s": {},
                                         "status": "running"})
    ctl = EcdhPsiController(sites=SITES, kinds=["train", "test"], min_rows=1, task_timeout=5, chunk=16)
    panics = []
    ctl.system_panic = lambda reason, fl_ctx: panics.append(reason)
    ctl.log_error = ctl.log_warning = ctl.log_info = lambda *a, **k: None

    def broadcast(task, fl_ctx, targets=None, **kw):
        for site in targets:
            sites.discarded.append(site)
            sites.task(task.name, site)
        task.completion_status = "ok"
    ctl.broadcast, ctl.cancel_task = broadcast, lambda *a, **k: None
    ctl.control_flow(Signal(), ctx)
    return sites, panics


def test_a_site_writes_its_intersection_only_at_the_result_task(tmp_path):
    from treeflare.flare.psi.protocol import TASK_RESULT

    sites, panics = run_sites(tmp_path)
    assert panics == [] and all(sites.execs[s].session.done for s in SITES)
    assert [sites.kept(s) for s in SITES] == [None] * 3  # every party is done, nothing written yet
    truth = {k: sorted(set.intersection(*(set(sites.held[s][k]) for s in SITES))) for k in ("train", "test")}
    for site in SITES:
        reply = sites.task(TASK_RESULT, site)
        assert reply.get_return_code() == ReturnCode.OK and reply["reply"]["rows_after"] == {
            k: len(v) for k, v in truth.items()}
        assert sites.kept(site) == truth and reply["reply"]["seconds"] > 0 and reply["reply"]["bytes_sent"] > 0


def test_a_site_whose_last_reply_is_lost_keeps_nothing_nor_does_any_other(tmp_path):
    """site-1 (the leader) is done after the last round, but its reply never reaches the server: the phase fails,
    naming it; no site was sent the result task, so none wrote an intersection."""
    sites, panics = run_sites(tmp_path / "lost", lose="site-1")
    assert len(panics) == 1 and panics[0].startswith("PSI (ECDH): site-1: no reply to ECDH-PSI round ")
    assert sites.execs["site-1"].session.done
    assert [sites.kept(s) for s in SITES] == [None] * 3 and sites.discarded == ["site-2", "site-3"]


def test_a_sites_bad_worker_setting_fails_its_start_by_name_and_close_never_raises(tmp_path, monkeypatch):
    from treeflare.flare.psi.ecdh_executor import WORKERS_ENV, EcdhPsiExecutor
    from treeflare.psi.party import PsiError

    monkeypatch.setenv(WORKERS_ENV, "dask://")
    ex = EcdhPsiExecutor(sites=SITES)
    ex._start_pool(False)
    assert isinstance(ex._pool_error, Exception) and "$TREEFLARE_VERTICAL_WORKERS must be" in str(ex._pool_error)
    assert isinstance(ex._pool_error, ex.PUBLIC_ERRORS) and not isinstance(ex._pool_error, PsiError)
    ex.close()  # the error stays with the start that needed the pool
    assert ex._pool_error is None and ex.pool is None
