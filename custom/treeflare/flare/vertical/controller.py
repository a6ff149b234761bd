"""Server side of the vertical packed-Paillier tree job: a message router, nothing more.

The active site drives the protocol (``vertical_step``); the server forwards each message of
its outbox to the addressed passive site (``vertical_msg``, one task per site, all in flight
together), and hands the replies back to the active site.  The server holds no key, but it sees
everything that crosses it: the public key, the slot layouts (gradient bounds; for a regression
the range of the residuals), ciphertexts, the row-to-node assignment of every layer (so every
partition of the training rows, and which nodes closed early -- a classification node closes early
when it is pure), the number of candidates per node, which party won each split, the test rows that
reach each passive split and that split's prediction bits, and at the end the active site's test
metrics and operation counts -- which it writes to ``vertical_result.json`` in its run folder.
Both modes run after the job's PSI phase (``treeflare.flare.psi``), on the rows it kept at each site.
In training it sees no digest of the ids: each passive site proves its rows match the active site's with a hash of
its ids encrypted under the active site's key (one ciphertext; ``treeflare.vertical.messages``).
In a prediction run (``mode="predict"``) it sees the number of new rows scored and of the active site's rows left
unscored (the PSI phase's row counts give both), no digest of their ids (for each passive site a nonce and an
HMAC under a key it never saw), one digest per passive site of the split ids it holds (random tokens), the rows
that reach each passive split and that split's bits, and the model's fingerprint; the predictions stay at the
active site.  See SECURITY.md.

Every reply is checked for shape (a dict with a ``type``, from a site that was addressed);
a site that fails, times out or sends a malformed payload ends the job with a logged reason naming the site and
the task (``status: failed`` in the result file); the server itself keeps running.  A site has ``task_timeout``
seconds for one task, counted from when the server scheduled it: NVFlare ends the task then, and the controller's
own deadline (``workflow.DEADLINE_GRACE_S`` later) ends it should NVFlare not; the first failed reply of a round ends
the round at once, without waiting for the other sites' replies, and their tasks are cancelled.
"""
from __future__ import annotations

import time

from nvflare.apis.controller_spec import Task, TaskCompletionStatus
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable

from ..progress import PROGRESS_ID, format_duration, remaining, say
from ..workflow import JobFailed, ResultWorkflow, no_reply_reason, wait_for_tasks
from ...vertical.params import MAX_PREDICT_ROWS
from .protocol import MSG, MSG_TYPES, REPLY_TYPES, STEP

RESULT_FILE = "vertical_result.json"
MODES = ("train", "predict")
_RESULT_KEYS = {
    "train": ("objective", "global", "crypto", "layout", "timings_s", "passive_timings_s", "n_train", "n_test",
              "n_classes", "n_trees", "n_splits"),
    # a prediction run: the predictions stay at the active site; the server learns counts (rows scored, the active
    # site's rows the intersection left out: the PSI phase's row counts tell it both) and the model's fingerprint
    "predict": ("mode", "n_rows", "n_unscored", "model_id", "model", "objective", "n_trees", "messages", "timings_s"),
}


class VerticalController(ResultWorkflow):
    JOB = "vertical_tree"
    RESULT_FILE = RESULT_FILE

    def __init__(self, active_site: str = "site-1", passive_sites: list | None = None, params: dict | None = None,
                 task_timeout: int = 3600, max_rounds: int = 100_000, job_info: dict | None = None,
                 task_check_period: float = 0.02, mode: str = "train"):
        """
        Args:
            active_site: the site with the labels and the private key.
            passive_sites: the sites with feature columns only.
            params: :class:`treeflare.vertical.VerticalParams` as a dict (sent to the active site).
            task_timeout: seconds one site has for one message (encryption of a tree's worth of
              rows happens in one step, so keep it generous).
            max_rounds: a bound on the number of protocol steps (a runaway active site is stopped).
            job_info: facts copied into the result (dataset, ...).
            task_check_period: NVFlare's Controller setting (its communicator's own checks; NVFlare 2.9 keeps
              0.2 s whatever it says). The protocol is a long chain of short message exchanges, so this workflow
              waits for each reply itself (``workflow.wait_for_tasks``), looking every 5 ms.
            mode: "train", or "predict": a prediction run of a trained model, in which every site loads its own
              model part and new rows (see ``executor``); the server routes the same way.
        """
        super().__init__(task_check_period=task_check_period)
        self.active_site = active_site
        self.passive_sites = list(passive_sites or [])
        self.params = dict(params or {})
        self.task_timeout = int(task_timeout)
        self.max_rounds = int(max_rounds)
        self.job_info = dict(job_info or {})
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode

    def initial_result(self) -> dict:
        return {**super().initial_result(), **self.job_info, "active_site": self.active_site,
                "passive_sites": self.passive_sites, "mode": self.mode}

    # ------------------------------------------------------------------------------
    def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
        sites = {c.name for c in fl_ctx.get_engine().get_clients()}
        missing = [s for s in [self.active_site, *self.passive_sites] if s not in sites]
        if missing:
            raise JobFailed(f"sites not connected: {missing}")
        t0 = time.perf_counter()
        if self.mode == "train":
            say(fl_ctx, f"training: {self.active_site} makes its Paillier key and encrypts the first gradients; a line "
                        "per tree layer follows")
        inbox = {}
        self._trace = []
        result["trace"] = self._trace
        first = True
        routed = 0
        for _round in range(self.max_rounds):
            data = {"inbox": inbox}
            if first:
                data.update(params=self.params, passives=self.passive_sites, mode=self.mode)
            ts = time.perf_counter()
            reply = self._ask_one(STEP, self.active_site, data, abort_signal, fl_ctx)
            self._trace.append(("step", round(time.perf_counter() - ts, 3)))
            first = False
            if reply.get("done") is True:
                res = reply.get("result")
                if not isinstance(res, dict):
                    raise JobFailed(f"{self.active_site}: final step without a result")
                if self.mode == "predict" and not (isinstance(res.get("n_rows"), int) and res["n_rows"] >= 0):
                    raise JobFailed(f"{self.active_site}: prediction result without a row count")
                unscored = res.get("n_unscored", 0)  # its rows no other party holds; the summary adds it up
                if self.mode == "predict" and not (isinstance(unscored, int) and not isinstance(unscored, bool)
                                                   and 0 <= unscored <= MAX_PREDICT_ROWS):
                    raise JobFailed(f"{self.active_site}: prediction result with an invalid count of unscored rows")
                result.update({k: v for k, v in res.items() if k in _RESULT_KEYS[self.mode]})
                result["server_protocol_s"] = time.perf_counter() - t0
                result["messages_routed"] = routed
                return
            outbox = reply.get("outbox")
            if not isinstance(outbox, dict) or not outbox:
                raise JobFailed(f"{self.active_site}: step returned no messages and is not done")
            for site, msg in outbox.items():
                if site not in self.passive_sites:
                    raise JobFailed(f"{self.active_site}: message addressed to unknown site {site!r}")
                if not isinstance(msg, dict) or msg.get("type") not in MSG_TYPES:
                    raise JobFailed(f"{self.active_site}: malformed message for {site}")
            self._layer_progress(outbox, t0, fl_ctx)
            ts = time.perf_counter()
            inbox = self._route(outbox, abort_signal, fl_ctx)
            self._trace.append(("route", round(time.perf_counter() - ts, 3)))
            routed += len(outbox) * 2
        raise JobFailed(f"protocol did not finish within {self.max_rounds} rounds")

    def _layer_progress(self, outbox, t0, fl_ctx) -> None:
        """A progress line when the active site starts a layer: tree and layer, elapsed, an estimate of what is
        left (at most every tree's full depth). Only the server's own counters and checked integers go in it."""
        msg = next(iter(outbox.values()))
        reporter = getattr(fl_ctx.get_engine(), "get_component", lambda _id: None)(PROGRESS_ID)
        tree, depth = msg.get("tree"), msg.get("depth")
        if reporter is None or msg.get("type") != "layer" or not all(isinstance(v, int) for v in (tree, depth)):
            return
        trees, max_depth = int(self.params.get("n_trees") or 1), int(self.params.get("max_depth") or 1)
        if not hasattr(self, "_first_layer_at"):  # the pace is measured from the first layer on
            self._first_layer_at = time.perf_counter()
        done, total = tree * max_depth + depth, trees * max_depth
        elapsed = time.perf_counter() - t0
        left = remaining(time.perf_counter() - getattr(self, "_first_layer_at", t0), done, total)
        eta = "" if left is None else f", ~{format_duration(left)} left"
        text = f"tree {tree + 1}/{trees}, layer {depth + 1}/{max_depth}  elapsed {format_duration(elapsed)}{eta}"
        reporter.emit(text, done=done + 1, total=total)  # the layer started counts: a log shows first and last

    def _check(self, label, site, task):
        """The reply of ``site`` to ``task`` (``label``: the task and message type, for the reason), or JobFailed
        saying what happened: no reply within the timeout, the site deemed disconnected, a reply that did not come
        through, an error at the site."""
        reply = next((ct.result for ct in task.client_tasks if ct.client.name == site), None)
        if reply is None:
            raise JobFailed(f"{site}: {no_reply_reason(label, task.completion_status, self.task_timeout)}")
        rc = reply.get_return_code()
        if rc != ReturnCode.OK:
            raise JobFailed(f"{site}: {label} failed with return code {rc}: {reply.get('error', '')}")
        return reply

    def _send(self, name, site, data, fl_ctx) -> Task:
        task = Task(name=name, data=Shareable(data), timeout=self.task_timeout)
        self.broadcast(task, fl_ctx, targets=[site], min_responses=1)
        return task

    def _wait(self, tasks: dict, labels: dict, abort_signal, fl_ctx) -> dict:
        """Wait for one task per site (site -> task), all in flight; site -> its checked reply. The first site that
        fails ends the wait (the other tasks are cancelled); a task still open ``DEADLINE_GRACE_S`` after its
        timeout is ended here as timed out."""
        replies = {}

        def finish(site, task):
            replies[site] = self._check(labels[site], site, task)

        def late(site):
            raise JobFailed(f"{site}: {no_reply_reason(labels[site], None, self.task_timeout)}")

        def cancel(task):
            self.cancel_task(task, completion_status=TaskCompletionStatus.TIMEOUT, fl_ctx=fl_ctx)

        wait_for_tasks(tasks, finish, self.task_timeout, cancel,
                       lambda: self._aborted(abort_signal, next(iter(labels.values()))), late, 0.005)
        return replies

    def _ask_one(self, name, site, data, abort_signal, fl_ctx):
        return self._wait({site: self._send(name, site, data, fl_ctx)}, {site: name}, abort_signal, fl_ctx)[site]

    def _route(self, outbox, abort_signal, fl_ctx) -> dict:
        """One task per addressed site, all in flight at once; wait for every one of them."""
        tasks = {site: self._send(MSG, site, {"msg": msg}, fl_ctx) for site, msg in outbox.items()}
        labels = {site: f"{MSG} ({outbox[site]['type']})" for site in outbox}
        replies = {}
        for site, reply in self._wait(tasks, labels, abort_signal, fl_ctx).items():
            msg = reply.get("msg")
            if not isinstance(msg, dict) or msg.get("type") not in REPLY_TYPES:
                raise JobFailed(f"{site}: malformed reply to {outbox[site]['type']!r}")
            replies[site] = msg
        return replies

    def _aborted(self, abort_signal, name):
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed(f"aborted during {name}")
