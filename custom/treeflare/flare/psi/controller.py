"""Server side of the PSI phase: three workflows, run in this order (they are added to the job in it).

1. :class:`PsiCheckController` -- every site reads and checks its ids (no rows, a blank or repeated id: the job
   ends ``failed`` naming the site and the redacted reason, before any PSI message) and reports its rows per kind;
   a party with fewer training rows than ``min_rows`` ends it too (the intersection could not hold more).
2. :class:`MeteredDhPSIController` -- NVFlare's ``DhPSIController`` (the DH-PSI workflow itself), polling its tasks
   more often, timed, and ending the job with a clear reason (and the result file) if it fails.
3. :class:`PsiResultController` -- every site reports the rows it kept per kind and what PSI cost it; all parties
   must have kept the same numbers, and at least ``min_rows`` training rows. On a failure the sites delete their
   intersection. Writes ``psi_result.json`` (``protocol.RESULT_FILE``) in the server's run folder.

The result file is written whatever happens: by the phase that failed, or by the result phase. The server handles
row counts, seconds and byte counts only: the ids stay at the sites, and DH-PSI's messages carry only values
encrypted under keys the server never holds.
"""

from __future__ import annotations

import time
import traceback

from nvflare.apis.controller_spec import Task
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable
from nvflare.apis.dxo import from_shareable
from nvflare.app_common.psi.dh_psi.dh_psi_controller import DhPSIController
from nvflare.app_common.workflows.broadcast_operator import BroadcastAndWait

from ...data.intersection import DEFAULT_MIN_ROWS
from ...reporting import write_json_atomic
from ..workflow import JobFailed, ResultWorkflow, poll_often
from .protocol import (JOB_NAME, RESULT_FILE, TASK_CHECK, TASK_DISCARD, TASK_RESULT, PsiProtocolError, check_kinds,
                       check_reply, check_result_reply, request, run_dir_of)

PHASE_PROP = "treeflare.psi.phase"  # what the three workflows hand on to each other (a sticky, private prop)
TASK_CHECK_PERIOD = 0.02  # the phase is a chain of short tasks: look for finished ones often


def check_min_rows(min_rows) -> int:
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
        raise ValueError("min_rows must be an integer >= 1")
    return int(min_rows)


def counted_kind(kinds) -> str | None:
    """The kind ``min_rows`` bounds: the training rows when the phase has them; else (a prediction run) none."""
    return "train" if "train" in kinds else None


def initial_result(sites, kinds, min_rows) -> dict:
    return {"job": JOB_NAME, "status": "running", "kinds": list(kinds), "min_rows": min_rows,
            "intersection_size": None, "parties": {s: {} for s in sites}, "timings_s": {}}


def phase_state(fl_ctx, sites, kinds, min_rows) -> dict:
    """The phase's result so far, shared by its three workflows (made by the first)."""
    state = fl_ctx.get_prop(PHASE_PROP)
    if not isinstance(state, dict):
        state = initial_result(sites, kinds, min_rows)
        fl_ctx.set_prop(PHASE_PROP, state, private=True, sticky=True)
    return state


def replies_of(task: Task, sites) -> tuple[dict, dict]:
    """(site -> reply dict under ``"reply"``, site -> problem) for the sites asked."""
    replies, problems = {}, {}
    for ct in task.client_tasks:
        site, reply = ct.client.name, ct.result
        if site not in sites:
            continue
        if reply is None:
            problems[site] = "no reply (timed out)"
        elif reply.get_return_code() != ReturnCode.OK:
            problems[site] = f"{reply.get('error') or reply.get_return_code()}"[:2000]
        else:
            replies[site] = reply.get("reply")
    for site in sites:
        if site not in replies and site not in problems:
            problems[site] = "no reply"
    return replies, problems


def evaluate_check(sites, replies: dict, problems: dict, kinds, min_rows: int, parties: dict) -> None:
    """The check phase's verdict: every site's ids checked, and enough training rows at each. Fills
    ``parties[site]["rows_before"]``; raises JobFailed naming the sites."""
    problems = dict(problems)
    for site, reply in replies.items():
        try:
            parties[site]["rows_before"] = check_reply(reply, kinds)
        except PsiProtocolError as exc:
            problems[site] = f"invalid check reply: {exc}"
    if problems:
        raise JobFailed("PSI check (before any encryption): "
                        + "; ".join(f"{s}: {problems[s]}" for s in sites if s in problems))
    kind = counted_kind(kinds)
    short = [s for s in sites if kind and parties[s]["rows_before"][kind] < min_rows]
    if short:
        raise JobFailed("PSI check (before any encryption): " + "; ".join(
            f"{s}: {parties[s]['rows_before'][kind]} {kind} rows, fewer than the {min_rows} the intersection must "
            f"hold (min_rows, --psi-min-rows)" for s in short))


def evaluate_result(sites, replies: dict, problems: dict, kinds, min_rows: int, parties: dict) -> int:
    """The result phase's verdict: every party kept the same rows per kind, at least ``min_rows`` training rows.
    Fills ``parties[site]`` (rows_after, seconds, bytes); returns the intersection size (rows kept, all kinds)."""
    problems = dict(problems)
    for site, reply in replies.items():
        try:
            parties[site].update(check_result_reply(reply, kinds))
        except PsiProtocolError as exc:
            problems[site] = f"invalid result reply: {exc}"
    if problems:
        raise JobFailed("PSI result: " + "; ".join(f"{s}: {problems[s]}" for s in sites if s in problems))
    kept = {s: parties[s]["rows_after"] for s in sites}
    if len({tuple(sorted(v.items())) for v in kept.values()}) != 1:
        raise JobFailed("PSI result: the parties kept different numbers of rows ("
                        + "; ".join(f"{s} {kept[s]}" for s in sites) + "); the intersection is not one set")
    first = kept[sites[0]]
    kind = counted_kind(kinds)
    if kind and first[kind] < min_rows:
        raise JobFailed(f"PSI result: the intersection holds {first[kind]} {kind} rows, fewer than min_rows "
                        f"{min_rows} (--psi-min-rows); the parties share too few rows to train on")
    if sum(first.values()) == 0:
        raise JobFailed("PSI result: the intersection is empty; the parties share no rows")
    return int(sum(first.values()))


class _PsiPhase(ResultWorkflow):
    """A workflow of the phase: on failure it writes the phase's result (status failed, the reason) and ends the
    run; on success it hands its part of the result on, unwritten, to the next workflow."""

    JOB = JOB_NAME
    RESULT_FILE = RESULT_FILE
    WRITES_ON_SUCCESS = False

    def __init__(self, sites: list | None = None, kinds=("train", "test"), min_rows: int = DEFAULT_MIN_ROWS,
                 task_timeout: int = 600, task_check_period: float = TASK_CHECK_PERIOD):
        super().__init__(task_check_period=task_check_period)
        self.sites = [str(s) for s in sites or []]
        self.kinds = check_kinds(list(kinds))
        self.min_rows = check_min_rows(min_rows)
        self.task_timeout = int(task_timeout)

    def ask(self, name: str, fl_ctx, abort_signal, data: dict | None = None) -> tuple[dict, dict]:
        task = Task(name=name, data=Shareable({"request": data or request(self.kinds)}), timeout=self.task_timeout)
        self.broadcast_and_wait(task, fl_ctx, targets=self.sites, min_responses=len(self.sites),
                                abort_signal=abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed(f"aborted during the PSI phase ({name})")
        return replies_of(task, self.sites)

    def control_flow(self, abort_signal, fl_ctx):
        result = phase_state(fl_ctx, self.sites, self.kinds, self.min_rows)
        start = time.perf_counter()
        try:
            self.run_workflow(result, run_dir_of(fl_ctx), abort_signal, fl_ctx)
            if self.WRITES_ON_SUCCESS:
                result["status"] = "completed"
        except JobFailed as exc:
            result["status"], result["error"] = "failed", str(exc)
            self.log_error(fl_ctx, f"{self.JOB} failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - whatever went wrong must reach the report, not vanish
            result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
            self.log_error(fl_ctx, f"{self.JOB} failed: {result['error']}\n{traceback.format_exc()}")
        finally:
            result["timings_s"][self.PART] = time.perf_counter() - start
            if result["status"] != "running":
                write_json_atomic(run_dir_of(fl_ctx) / self.RESULT_FILE, result)
        if result["status"] == "failed":
            self.system_panic(result["error"], fl_ctx)


class PsiCheckController(_PsiPhase):
    PART = "check"

    def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
        replies, problems = self.ask(TASK_CHECK, fl_ctx, abort_signal)
        evaluate_check(self.sites, replies, problems, self.kinds, self.min_rows, result["parties"])


class PsiResultController(_PsiPhase):
    PART = "result"
    WRITES_ON_SUCCESS = True

    def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
        replies, problems = self.ask(TASK_RESULT, fl_ctx, abort_signal)
        try:
            result["intersection_size"] = evaluate_result(self.sites, replies, problems, self.kinds, self.min_rows,
                                                          result["parties"])
        except JobFailed:
            self.ask(TASK_DISCARD, fl_ctx, abort_signal)  # nothing kept at a site of a phase that failed
            raise


class PromptBroadcastAndWait(BroadcastAndWait):
    """NVFlare 2.9's ``BroadcastAndWait`` as its DH-PSI workflow uses it, with two fixes: a multicast (10 of the
    13 task rounds of a 3-party DH-PSI) is looked at every ``TASK_CHECK_PERIOD`` seconds, not every 0.5 s (its
    default: each such round took at least that long, however small the sets); and no debug
    ``print("task_name", ...)`` to stdout per result.
    Installed in the server process by :class:`MeteredDhPSIController` as the name NVFlare's workflow module uses."""

    def multicasts_and_wait(self, task_name, task_inputs, fl_ctx, abort_signal=None,
                            task_check_period=TASK_CHECK_PERIOD):
        return super().multicasts_and_wait(task_name, task_inputs, fl_ctx, abort_signal, task_check_period)

    def results_cb(self, client_task, fl_ctx):
        result = client_task.result
        rc = result.get_return_code()
        if rc == ReturnCode.OK:
            self.update_result(client_task.client.name, from_shareable(result))
        elif rc in self.controller.abort_job_in_error:
            self.controller.handle_client_errors(rc, client_task, fl_ctx)
        client_task.result = None


class MeteredDhPSIController(DhPSIController):
    """NVFlare's DH-PSI workflow: polled every ``task_check_period`` seconds, timed, and failing cleanly."""

    def __init__(self, sites: list | None = None, kinds=("train", "test"), min_rows: int = DEFAULT_MIN_ROWS,
                 task_timeout: int = 600, task_check_period: float = TASK_CHECK_PERIOD):
        super().__init__()
        self._task_check_period = float(task_check_period)
        self.sites = [str(s) for s in sites or []]
        self.kinds = check_kinds(list(kinds))
        self.min_rows = check_min_rows(min_rows)
        self.task_timeout = int(task_timeout)

    def set_communicator(self, communicator):
        super().set_communicator(communicator)
        poll_often(self, communicator)

    def start_controller(self, fl_ctx):
        from nvflare.app_common.psi.dh_psi import dh_psi_workflow

        dh_psi_workflow.BroadcastAndWait = PromptBroadcastAndWait  # the name the workflow's module calls
        super().start_controller(fl_ctx)

    def control_flow(self, abort_signal, fl_ctx):
        result = phase_state(fl_ctx, self.sites, self.kinds, self.min_rows)
        start = time.perf_counter()
        error = None
        try:
            super().control_flow(abort_signal, fl_ctx)
            if abort_signal is not None and abort_signal.triggered:
                error = "DH-PSI was aborted (see the server log)"
        except KeyError as exc:  # NVFlare's workflow reads each site's result without looking: one was missing
            error = f"DH-PSI failed: no result from {exc} (it failed or stopped; see that site's log)"
            self.log_error(fl_ctx, f"{error}\n{traceback.format_exc()}")
            self._discard(fl_ctx, abort_signal)
        except Exception as exc:  # noqa: BLE001 -- NVFlare's workflow fails by raising; the report must say why
            error = f"DH-PSI failed: {type(exc).__name__}: {str(exc)[:1000]}"
            self.log_error(fl_ctx, f"{error}\n{traceback.format_exc()}")
            self._discard(fl_ctx, abort_signal)
        finally:
            result["timings_s"]["dh_psi"] = time.perf_counter() - start
        passes = getattr(getattr(self, "psi_workflow", None), "forward_processed", None) or {}
        if error and 0 in passes.values():  # NVFlare's handler cannot go on from an empty set: say what happened
            error = ("PSI: the parties share no rows (a pass's intersection was already empty, and NVFlare's "
                     f"DH-PSI stops there: {error})")
        if error:
            result["status"], result["error"] = "failed", error
            write_json_atomic(run_dir_of(fl_ctx) / RESULT_FILE, result)
            self.system_panic(error, fl_ctx)

    def _discard(self, fl_ctx, abort_signal) -> None:
        """The sites delete what DH-PSI's passes saved (a phase that failed keeps nothing)."""
        try:
            task = Task(name=TASK_DISCARD, data=Shareable({"request": request(self.kinds)}),
                        timeout=min(self.task_timeout, 60))
            self.broadcast_and_wait(task, fl_ctx, targets=self.sites, min_responses=len(self.sites),
                                    abort_signal=abort_signal)
        except Exception as exc:  # noqa: BLE001 -- the job fails anyway; the reason above is the one to report
            self.log_warning(fl_ctx, f"PSI: the sites could not be asked to delete their intersection: {exc}")
