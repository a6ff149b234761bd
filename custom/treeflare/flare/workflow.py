"""What our server workflows share: a result file written whatever happens, and a clean failure.

A workflow subclasses :class:`ResultWorkflow` and implements :meth:`run_workflow`, filling the
``result`` dict. If it raises :class:`JobFailed` (a reason we chose) or any other exception (a bug, or
an input nothing validated), the result says ``status: failed`` with the real error, is still written
to the run folder (job scripts read it from there), and the run is ended with a system panic so FLARE
reports the job as failed too. A result never says ``running`` once the workflow has returned.
Our workflows wait for their tasks themselves (:func:`collect`, :func:`wait_for_tasks`): a reply counts once NVFlare
has received and handed it over (the task's public ``client_tasks``), not at the server communicator's next check,
which NVFlare 2.9 runs every 0.2 s whatever a controller's ``task_check_period`` says.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from nvflare.apis.controller_spec import TaskCompletionStatus
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.impl.controller import Controller

from ..files import write_json_atomic


# how often our waits look at their tasks: replies arrive by the communicator's threads, this only notices them
REPLY_CHECK_PERIOD = 0.005


def answered(task, sites) -> bool:
    """Whether every one of ``sites`` has replied to ``task`` (NVFlare has received the reply and run the task's
    result callback: ``ClientTask.result_received_time``), or the task has ended (a timeout, a cancel)."""
    if task.completion_status is not None:
        return True
    got = {ct.client.name for ct in task.client_tasks if ct.result_received_time is not None}
    return set(sites) <= got


def collect(controller, task, fl_ctx, sites, abort_signal=None, period: float = REPLY_CHECK_PERIOD) -> None:
    """``controller.broadcast(task)`` to ``sites`` and wait until every one has replied or the task has ended, as
    ``broadcast_and_wait`` does, without waiting for the communicator's next check of its tasks. An abort signal
    ends the wait and cancels the task."""
    sites = list(sites)
    controller.broadcast(task, fl_ctx, targets=sites, min_responses=len(sites))
    while not answered(task, sites):
        if abort_signal is not None and abort_signal.triggered:
            controller.cancel_task(task, fl_ctx=fl_ctx)
            return
        time.sleep(period)


def replies_of(task, sites, key: str = "reply") -> tuple[dict, dict]:
    """(site -> the field ``key`` of its reply, site -> problem) for the sites asked: a site that timed out, failed
    or sent nothing is a problem (its error text, cut to 2,000 characters), a reply from a site not asked ignored."""
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
            replies[site] = reply.get(key)
    for site in sites:
        if site not in replies and site not in problems:
            problems[site] = "no reply"
    return replies, problems


# seconds past a task's timeout after which a workflow ends the task itself (NVFlare's task monitor ends it at the
# timeout; this bounds the wait should the monitor not, e.g. a site half-way through its reply)
DEADLINE_GRACE_S = 5.0


def no_reply_reason(label: str, status, timeout) -> str:
    """Why a task (``label``: its name and step) ended without a reply, from its completion status."""
    if status == TaskCompletionStatus.CLIENT_DEAD:
        return f"disconnected (NVFlare deemed it dead) with no reply to {label}"
    if status in (TaskCompletionStatus.OK, TaskCompletionStatus.IGNORED):
        return (f"its reply to {label} did not come through (a result the site could not serialize, or one lost on "
                f"the way; see the site's log)")
    if status not in (None, TaskCompletionStatus.TIMEOUT):  # cancelled, aborted, an error at the server
        return f"{label} ended ({status.value}) with no reply"
    return f"no reply to {label} within {timeout} s"


def wait_for_tasks(tasks: dict, finish, timeout, cancel, aborted, late, period: float = REPLY_CHECK_PERIOD,
                   done=None) -> bool:
    """Wait for one task per site (site -> task), all in flight: ``finish(site, task)`` as each ends or is answered
    (``done(site, task)``, default :func:`answered`; it may raise, which ends the wait); ``late(site)`` (it raises)
    for a task still open ``DEADLINE_GRACE_S`` after ``timeout`` seconds (0: no deadline); False when ``aborted()``
    says so.  A task left open when the wait ends is cancelled with ``cancel(task)``: no task of a failed round
    stays standing."""
    done = done or (lambda site, task: answered(task, [site]))
    deadline = time.monotonic() + timeout + DEADLINE_GRACE_S if timeout else None
    open_ = dict(tasks)
    try:
        while open_:
            for site, task in list(open_.items()):
                if done(site, task):
                    del open_[site]
                    finish(site, task)
            if not open_:
                break
            if aborted():
                return False
            if deadline is not None and time.monotonic() > deadline:
                late(next(iter(open_)))
            time.sleep(period)
    finally:
        for site, task in open_.items():
            if task.completion_status is None and not done(site, task):
                cancel(task)
    return True


class JobFailed(RuntimeError):
    """The workflow cannot go on; the message says why (which site, which task)."""


class ResultWorkflow(Controller):
    JOB = ""
    RESULT_FILE = ""

    def start_controller(self, fl_ctx):
        pass

    def stop_controller(self, fl_ctx):
        pass

    def process_result_of_unknown_task(self, client, task_name, client_task_id, result, fl_ctx):
        self.log_warning(fl_ctx, f"ignored result of unknown task {task_name!r} from {client.name}")

    def initial_result(self) -> dict:
        return {"job": self.JOB, "status": "running", "timings_s": {}}

    def run_workflow(self, result: dict, run_dir: Path, abort_signal, fl_ctx) -> None:
        raise NotImplementedError

    # A workflow that is one phase of several (the PSI phase before a job's own) hands its part of the result on,
    # unwritten and still ``running``, when it succeeds; it writes the result (and ends the run) only on failure.
    WRITES_ON_SUCCESS = True

    def start_result(self, fl_ctx) -> dict:
        """The result this run fills (a phase may continue one an earlier workflow began)."""
        return self.initial_result()

    def record_time(self, result: dict, seconds: float) -> None:
        """Where the workflow's own seconds go in the result (nowhere by default)."""

    def control_flow(self, abort_signal, fl_ctx):
        run_dir = Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))
        result = self.start_result(fl_ctx)
        start = time.perf_counter()
        try:
            self.run_workflow(result, run_dir, abort_signal, fl_ctx)
            if self.WRITES_ON_SUCCESS:
                result["status"] = "completed"
        except JobFailed as exc:
            result["status"], result["error"] = "failed", str(exc)
            self.log_error(fl_ctx, f"{self.JOB} failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - whatever went wrong must reach the report, not vanish
            result["status"], result["error"] = "failed", f"{type(exc).__name__}: {exc}"
            self.log_error(fl_ctx, f"{self.JOB} failed: {result['error']}\n{traceback.format_exc()}")
        finally:
            self.record_time(result, time.perf_counter() - start)
            if result["status"] != "running":
                write_json_atomic(run_dir / self.RESULT_FILE, result)
        if result["status"] == "failed":
            self.system_panic(result.get("error", f"{self.JOB} did not complete"), fl_ctx)
