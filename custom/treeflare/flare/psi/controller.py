"""Server side of the PSI phase: three workflows, run in this order (they are added to the job in it).

1. :class:`PsiCheckController` -- every site reads and checks its ids (no rows, a blank or repeated id: the job
   ends ``failed`` naming the site and the redacted reason, before any PSI message) and reports its rows per kind;
   a party with fewer training rows than ``min_rows`` ends it too (the intersection could not hold more).
2. :class:`MeteredDhPSIController` -- NVFlare's ``DhPSIController`` (the DH-PSI workflow itself), polling its tasks
   more often, timed, retried with fresh keys when its own consistency check fails, followed by an identity check
   of the intersections, and ending the job with a clear reason (and the result file) if it fails. Every DH-PSI
   task has the job's task timeout (NVFlare gives them none): a site that does not answer one ends the job naming
   the site and the step (``site-3: no reply to PSI (DH-PSI setup) within 60 s``), see
   :class:`PromptBroadcastAndWait`.
3. :class:`PsiResultController` -- every site reports the rows it kept per kind and what PSI cost it; all parties
   must have kept the same numbers, and at least ``min_rows`` training rows. On a failure the sites delete their
   intersection. Writes ``psi_result.json`` (``protocol.RESULT_FILE``) in the server's run folder.

The module is past 400 lines because the phase's three workflows share one result, its checks and the fixes to
NVFlare's DH-PSI, and are read together, in the order above.

The result file is written whatever happens: by the phase that failed, or by the result phase. The server handles
row counts, seconds and byte counts only: the ids stay at the sites, and DH-PSI's messages carry only values
encrypted under keys the server never holds.

**False positives.** openmined-psi's Bloom filter, at a handful of ids, puts an id into a pass's intersection that
the partner does not hold in about 1 run in 100, whatever the configured rate. Let T be the true intersection of
three parties in NVFlare's order (P0 the DH "server" of P1, then P1 of P2; P2 the server of the backward pass):
P1 gets I1 = (S0 & S1) + F1, P2 gets I2 = (S2 & I1) + F2, then P0 keeps B0 = (S0 & I2) + G0, P1 keeps
B1 = (I1 & I2) + G1 and P2 keeps I2 (F, G: false positives, never items the partner holds). NVFlare checks
|I2| <= |I1| and |B0| = |B1| = |I2|. One false positive either drops out (F1 outside S2: B0 = B1 = I2 = T) or breaks
a count (F1 in S2 or F2: |B0| or |B1| is |I2| - 1; G: |B| = |I2| + 1): NVFlare's check fails and the attempt is
retried (:data:`MAX_ATTEMPTS`, fresh keys: NVFlare makes new ones at every setup, our handler starts clean at every
``PREPARE``, and the sites delete the failed attempt's intersection). But two can cancel out: F2 = {x} with x in
S0 & S2 and not in S1, and G1 = {g}, give B0 = I2 = T + {x}, B1 = T + {g}: equal counts, different sets (two
parties: F1 = {y}, G0 = {g}, likewise). No count of these passes tells that apart, so after every attempt that
passes NVFlare's checks the sites run DH-PSI once more, on ``protocol.verification_items`` of the set each keeps
(``VERIFY_ITEMS`` strings derived from the whole set): equal sets give the same items, and since a false positive
is only ever an item the partner lacks, every pass then keeps all of them; different sets share none, and all of
them would have to be false positives to pass. Every count must be ``VERIFY_ITEMS``, else the attempt is retried.
What this adds to the leaks: the server sees the same kind of blinded DH-PSI messages, of items it cannot invert,
and counts equal to a constant; a party learns whether its set is every other's. A retry reveals what the attempt
it replaces would have (the same sets, the same order); a failed attempt's false positive told its receiver that an
id of its own was in the partner's set, which the retry's true answer then contradicts, about its own id.
"""

from __future__ import annotations

import time
import traceback

from nvflare.apis.controller_spec import Task, TaskCompletionStatus
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable
from nvflare.apis.dxo import from_shareable
from nvflare.app_common.app_constant import PSIConst
from nvflare.app_common.psi.dh_psi.dh_psi_controller import DhPSIController
from nvflare.app_common.psi.dh_psi.dh_psi_workflow import DhPSIWorkFlow
from nvflare.app_common.workflows.broadcast_operator import BroadcastAndWait

from ...data.intersection import DEFAULT_MIN_ROWS
from ...files import write_json_atomic
from ...psi.party import DEFAULT_MAX_RATIO, PsiError, check_ratio, check_sizes
from ..progress import say
from ..workflow import JobFailed, ResultWorkflow, collect, no_reply_reason, replies_of, wait_for_tasks
from .protocol import (JOB_NAME, RESULT_FILE, TASK_CHECK, TASK_DISCARD, TASK_RESULT, VERIFY_ITEMS, VERIFY_KEY,
                       PsiProtocolError, check_kinds, check_reply, check_result_reply, request, run_dir_of)

PHASE_PROP = "treeflare.psi.phase"  # what the three workflows hand on to each other (a sticky, private prop)
TASK_CHECK_PERIOD = 0.02  # the phase is a chain of short tasks: look for finished ones often
# DH-PSI attempts before the job fails. Attempts fail independently (fresh keys), each with the ~1-2.5% measured at
# a handful of ids, so three all fail about once in 10^5 jobs or fewer; a failure that repeats (not chance: a bug,
# or a party that changes its answers) still ends the job after three runs of DH-PSI, not an unbounded number.
MAX_ATTEMPTS = 3


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


def evaluate_check(sites, replies: dict, problems: dict, kinds, min_rows: int, parties: dict,
                   max_ratio: float | None = None) -> None:
    """The check phase's verdict: every site's ids checked, enough training rows at each, and no party's set more
    than ``max_ratio`` times the largest other's (``treeflare.psi.party.check_sizes``). Fills
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
    if max_ratio is not None:
        try:
            check_sizes({s: int(sum(parties[s]["rows_before"].values())) for s in sites}, sites, max_ratio)
        except PsiError as exc:
            raise JobFailed(f"PSI check (before any encryption): {exc} (--psi-max-ratio)") from None


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
    empty = [k for k in kinds if first.get(k, 0) == 0]  # e.g. no shared test row: the job cannot score, say so now
    if empty:
        raise JobFailed(f"PSI result: the parties share no {' and no '.join(empty)} rows")
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
        self.last_task = task
        collect(self, task, fl_ctx, self.sites, abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed(f"aborted during the PSI phase ({name})")
        replies, problems = replies_of(task, self.sites)
        return replies, {s: f"no reply to {name} within {self.task_timeout} s" if p.startswith("no reply") else p
                         for s, p in problems.items()}

    def start_result(self, fl_ctx) -> dict:
        return phase_state(fl_ctx, self.sites, self.kinds, self.min_rows)

    def record_time(self, result: dict, seconds: float) -> None:
        result["timings_s"][self.PART] = seconds


class PsiCheckController(_PsiPhase):
    PART = "check"

    def __init__(self, *args, max_ratio: float = DEFAULT_MAX_RATIO, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_ratio = check_ratio(max_ratio)

    def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
        say(fl_ctx, f"PSI: the {len(self.sites)} parties check their ids, then intersect them (the server sees none)")
        result["max_ratio"] = self.max_ratio
        t0 = time.time()
        replies, problems = self.ask(TASK_CHECK, fl_ctx, abort_signal)
        # the first task of a job waits for every site to start and ask for it (seconds in the simulator): said
        # apart, so that the phase's own time is what PSI costs
        sent = [t for ct in self.last_task.client_tasks for t in [getattr(ct, "task_sent_time", None)] if t]
        result["timings_s"]["waiting_for_sites"] = max(max(sent) - t0, 0.0) if sent else 0.0
        evaluate_check(self.sites, replies, problems, self.kinds, self.min_rows, result["parties"], self.max_ratio)


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


class PsiSiteFailed(JobFailed):
    """A site that did not answer a DH-PSI task (silent past the timeout, deemed dead, an error at the site): the
    phase cannot go on without it, and another attempt would not help."""

    def __init__(self, site: str, reason: str):
        super().__init__(f"{site}: {reason}")
        self.site = site


class PromptBroadcastAndWait(BroadcastAndWait):
    """NVFlare 2.9's ``BroadcastAndWait`` as its DH-PSI workflow uses it, with these fixes: every task has the
    controller's ``task_timeout`` (NVFlare's have none: a site whose link is gone kept the job running for good),
    and a site that does not answer ends the phase naming the site and the DH-PSI step (:class:`PsiSiteFailed`),
    its partners' tasks cancelled; a multicast (10 of the 13 task rounds of a 3-party DH-PSI) waits for its own
    tasks only, looked at every ``task_check_period`` seconds of its controller (``TASK_CHECK_PERIOD``), not every
    0.5 s (its default: each such round took at least that long, however small the sets), ended by its own deadline
    (``DEADLINE_GRACE_S`` past the timeout) should NVFlare's task monitor not end a task; and no debug
    ``print("task_name", ...)`` to stdout per result.
    Installed in the server process by :class:`MeteredDhPSIController` as the name NVFlare's workflow module uses."""

    def __init__(self, fl_ctx, controller):
        super().__init__(fl_ctx, controller)
        self.timeout = int(getattr(controller, "task_timeout", 0) or 0)  # seconds (NVFlare: an int); 0: none
        self.failures: dict = {}  # site -> what its reply said instead of a result

    @staticmethod
    def label(task_name: str, task_input) -> str:
        step = task_input.get(PSIConst.TASK_KEY) if hasattr(task_input, "get") else None
        step = str(step).removeprefix("PSI_").removeprefix("TASK_").lower() if step else ""  # PSI_SETUP: setup
        return f"{task_name} (DH-PSI {step})" if step else f"{task_name} (DH-PSI)"

    def _task(self, task_name, task_input, task_props=None) -> Task:
        return Task(name=task_name, data=task_input, result_received_cb=self.results_cb, props=task_props,
                    timeout=self.timeout)

    def _check(self, site: str, task: Task, label: str) -> None:
        if site in self.results:
            return
        if site in self.failures:
            raise PsiSiteFailed(site, f"{label} {self.failures[site]}")
        raise PsiSiteFailed(site, no_reply_reason(label, task.completion_status, self.timeout))

    def broadcast_and_wait(self, task_name, task_input, fl_ctx, targets=None, task_props=None, min_responses=1,
                           abort_signal=None):
        task = self._task(task_name, task_input, task_props)
        names = [t if isinstance(t, str) else t.name for t in targets] if targets else \
            [c.name for c in fl_ctx.get_engine().get_clients()]
        collect(self.controller, task, fl_ctx, names, abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            return self.results
        for site in names:
            self._check(site, task, self.label(task_name, task_input))
        return self.results

    def multicasts_and_wait(self, task_name, task_inputs, fl_ctx, abort_signal=None, task_check_period=None):
        # NVFlare's workflow passes no period: the controller's (MeteredDhPSIController's task_check_period)
        task_check_period = task_check_period or getattr(self.controller, "task_check_period", TASK_CHECK_PERIOD)
        tasks = {site: self._task(task_name, data) for site, data in task_inputs.items()}
        for site, task in tasks.items():
            self.controller.send(task=task, fl_ctx=fl_ctx, targets=[site])

        def finish(site, task):
            self._check(site, task, self.label(task_name, task_inputs[site]))

        def late(site):
            raise PsiSiteFailed(site, no_reply_reason(self.label(task_name, task_inputs[site]), None, self.timeout))

        def cancel(task):
            self.controller.cancel_task(task, completion_status=TaskCompletionStatus.TIMEOUT, fl_ctx=fl_ctx)

        aborted = (lambda: abort_signal.triggered) if abort_signal is not None else (lambda: False)
        if not wait_for_tasks(tasks, finish, self.timeout, cancel, aborted, late, task_check_period):
            return None  # as NVFlare's: the workflow sees the signal
        return self.results

    def results_cb(self, client_task, fl_ctx):
        result = client_task.result
        rc = result.get_return_code()
        if rc == ReturnCode.OK:
            self.update_result(client_task.client.name, from_shareable(result))
        else:
            self.failures[client_task.client.name] = f"failed with return code {rc}"
            if rc in self.controller.abort_job_in_error:
                self.controller.handle_client_errors(rc, client_task, fl_ctx)
        client_task.result = None


class PsiInconsistent(RuntimeError):
    """A DH-PSI run whose intersections do not agree (NVFlare's own consistency check, or our identity check): a
    Bloom-filter false positive, so another attempt with fresh keys may succeed."""


class PsiNothingShared(RuntimeError):
    """A pass of DH-PSI found no id in common: the intersection is empty, whatever later passes would say."""


class CheckedDhPSIWorkFlow(DhPSIWorkFlow):
    """NVFlare's DH-PSI workflow, telling its consistency failures (:class:`PsiInconsistent`) from any other error,
    and telling the sites at ``PREPARE`` whether this run is the identity check (``verify``)."""

    def __init__(self, verify: bool = False):
        super().__init__()
        self.verify = bool(verify)

    def prepare_sites(self, abort_signal):
        # NVFlare's prepare_sites, with VERIFY_KEY in the PREPARE task and our prompt BroadcastAndWait
        inputs = Shareable()
        inputs[PSIConst.TASK_KEY] = PSIConst.TASK_PREPARE
        inputs[PSIConst.BLOOM_FILTER_FPR] = self.bloom_filter_fpr
        inputs[VERIFY_KEY] = self.verify
        bop = PromptBroadcastAndWait(self.fl_ctx, self.controller)
        results = bop.broadcast_and_wait(task_name=self.task_name, task_input=inputs, fl_ctx=self.fl_ctx,
                                         targets=None, min_responses=len(self.fl_ctx.get_engine().get_clients()),
                                         abort_signal=abort_signal)
        if not results:
            abort_signal.trigger("no items to perform PSI")
            raise RuntimeError("There is no item to perform PSI calculation")
        self.ordered_sites = self.get_ordered_sites(results)
        # NVFlare's ordering silently leaves out a site that answered no size (or 0): the others would intersect
        # without it. Every party takes part, or none does.
        absent = sorted({c.name for c in self.fl_ctx.get_engine().get_clients()} - {s.name for s in self.ordered_sites})
        if absent:
            raise RuntimeError(f"DH-PSI: no set size from {', '.join(absent)} (every party must take part)")

    def pairwise_intersect(self, ordered_sites, response_msg):
        sizes = super().pairwise_intersect(ordered_sites, response_msg)
        if 0 in sizes.values():
            if self.verify:  # the identity check: different kept sets share none of their derived items
                raise PsiInconsistent(f"a pass of the identity check found nothing in common: {sizes}")
            # stop here: no later pass may run on a set that is already empty (see MeteredDhPSITaskHandler.get_items)
            raise PsiNothingShared("PSI: the parties share no rows (a pass's intersection was already empty; the "
                                   "phase stops there, so no later pass compares any other id)")
        return sizes

    def check_processed_sites(self, last_site, processed_sites):
        try:
            super().check_processed_sites(last_site, processed_sites)
        except RuntimeError as exc:
            raise PsiInconsistent(" ".join(str(exc).split())) from exc

    def check_final_intersection_sizes(self, intersect_site):
        try:
            super().check_final_intersection_sizes(intersect_site)
        except RuntimeError as exc:
            raise PsiInconsistent(" ".join(str(exc).split())) from exc


class MeteredDhPSIController(DhPSIController):
    """NVFlare's DH-PSI workflow: polled every ``task_check_period`` seconds, timed, retried on a consistency
    failure (module docstring), checked for identical intersections, and failing cleanly. ``psi_result.json`` gets
    ``attempts`` and, per failed attempt, why (``failed_attempts``)."""

    def __init__(self, sites: list | None = None, kinds=("train", "test"), min_rows: int = DEFAULT_MIN_ROWS,
                 task_timeout: int = 600, task_check_period: float = TASK_CHECK_PERIOD):
        super().__init__()
        # how often the DH-PSI multicasts look (PromptBroadcastAndWait)
        self.task_check_period = float(task_check_period)
        self.sites = [str(s) for s in sites or []]
        self.kinds = check_kinds(list(kinds))
        self.min_rows = check_min_rows(min_rows)
        self.task_timeout = int(task_timeout)

    def start_controller(self, fl_ctx):
        from nvflare.app_common.psi.dh_psi import dh_psi_workflow

        dh_psi_workflow.BroadcastAndWait = PromptBroadcastAndWait  # the name the workflow's module calls
        super().start_controller(fl_ctx)

    def load_psi_workflow(self, fl_ctx, verify: bool = False) -> CheckedDhPSIWorkFlow:
        workflow = CheckedDhPSIWorkFlow(verify=verify)
        workflow.initialize(fl_ctx, controller=self)
        return workflow

    def _attempt(self, abort_signal, fl_ctx) -> None:
        """One DH-PSI run from the parties' ids (``main_workflow``), then the identity check."""
        self.psi_workflow = self.main_workflow = self.load_psi_workflow(fl_ctx)
        super().control_flow(abort_signal, fl_ctx)
        if abort_signal is not None and abort_signal.triggered:
            return
        self.psi_workflow = check = self.load_psi_workflow(fl_ctx, verify=True)
        not_one_set = "the parties' intersections are not one set (equal counts, different ids)"
        try:
            super().control_flow(abort_signal, fl_ctx)
        except PsiInconsistent as exc:  # different sets share no verification item: a pass came back short
            raise PsiInconsistent(f"{not_one_set}: the identity check: {exc}") from exc
        if abort_signal is not None and abort_signal.triggered:
            return
        missing = sorted(set(self.sites) - {site.name for site in check.ordered_sites})
        if missing:
            raise RuntimeError(f"the identity check of the intersections got no set size from {', '.join(missing)} "
                               f"(see that site's log)")
        counts = {**{s.name: s.size for s in check.ordered_sites}, **check.forward_processed,
                  **check.backward_processed}
        if any(n != VERIFY_ITEMS for n in counts.values()):
            raise PsiInconsistent(f"{not_one_set}: {VERIFY_ITEMS} items of each party's set expected in every pass of the identity "
                                  f"check, got {counts}")

    def control_flow(self, abort_signal, fl_ctx):
        result = phase_state(fl_ctx, self.sites, self.kinds, self.min_rows)
        start = time.perf_counter()
        error = None
        failed = result.setdefault("failed_attempts", [])
        try:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                result["attempts"] = attempt
                try:
                    self._attempt(abort_signal, fl_ctx)
                    break
                except PsiInconsistent as exc:
                    failed.append(f"attempt {attempt}: {str(exc)[:500]}")
                    self._discard(fl_ctx, abort_signal)  # its intersections are never used
                    if attempt == MAX_ATTEMPTS:
                        raise JobFailed(f"DH-PSI failed: its intersections disagreed in all {MAX_ATTEMPTS} attempts, "
                                        f"each with fresh keys (not a Bloom-filter false positive by chance: a "
                                        f"party whose ids or answers change?); last: {str(exc)[:1000]}") from exc
                    self.log_warning(fl_ctx, f"PSI: DH-PSI attempt {attempt} of {MAX_ATTEMPTS} failed its "
                                             f"consistency check ({str(exc)[:500]}); again with fresh keys")
                    if abort_signal is not None and abort_signal.triggered:
                        break
            if abort_signal is not None and abort_signal.triggered:
                error = "DH-PSI was aborted (see the server log)"
        except PsiSiteFailed as exc:  # a site gone or failing: the others delete what they kept, it cannot
            error = str(exc)
            self.log_error(fl_ctx, error)
            self._discard(fl_ctx, abort_signal, without=exc.site)
        except JobFailed as exc:
            error = str(exc)
            self.log_error(fl_ctx, error)
        except PsiNothingShared as exc:
            error = str(exc)
            self.log_error(fl_ctx, error)
            self._discard(fl_ctx, abort_signal)
        except KeyError as exc:  # NVFlare's workflow reads each site's result without looking: one was missing
            error = self._explained(f"DH-PSI failed: no result from {exc} (it failed or stopped; see that site's log)")
            self.log_error(fl_ctx, f"{error}\n{traceback.format_exc()}")
            self._discard(fl_ctx, abort_signal)
        except Exception as exc:  # noqa: BLE001 -- NVFlare's workflow fails by raising; the report must say why
            error = self._explained(f"DH-PSI failed: {type(exc).__name__}: {str(exc)[:1000]}")
            self.log_error(fl_ctx, f"{error}\n{traceback.format_exc()}")
            self._discard(fl_ctx, abort_signal)
        finally:
            result["timings_s"]["dh_psi"] = time.perf_counter() - start
        if error:
            result["status"], result["error"] = "failed", error
            write_json_atomic(run_dir_of(fl_ctx) / RESULT_FILE, result)
            self.system_panic(error, fl_ctx)

    def _explained(self, error: str) -> str:
        """``error``, saying what happened when a pass's intersection was empty (NVFlare's handler cannot go on)."""
        passes = getattr(getattr(self, "main_workflow", None), "forward_processed", None) or {}
        if 0 in passes.values():
            return ("PSI: the parties share no rows (a pass's intersection was already empty, and NVFlare's "
                    f"DH-PSI stops there: {error})")
        return error

    def _discard(self, fl_ctx, abort_signal, without: str | None = None) -> None:
        """The sites (but ``without``, one that did not answer) delete what DH-PSI's passes saved (a failed attempt
        or phase keeps nothing)."""
        discard_at_sites(self, fl_ctx, abort_signal, without)


def discard_at_sites(controller, fl_ctx, abort_signal, without: str | None = None) -> None:
    """``controller``'s sites, but ``without`` (one that stopped answering), delete what they kept of a failed PSI
    (``TASK_DISCARD``, at most 60 s); a failure to ask them is logged, the job's own reason is the one reported."""
    targets = [s for s in controller.sites if s != without]
    try:
        task = Task(name=TASK_DISCARD, data=Shareable({"request": request(controller.kinds)}),
                    timeout=min(controller.task_timeout, 60))
        collect(controller, task, fl_ctx, targets, abort_signal)
    except Exception as exc:  # noqa: BLE001 -- the job fails anyway; the reason above is the one to report
        controller.log_warning(fl_ctx, f"PSI: the sites could not be asked to delete their intersection: {exc}")
