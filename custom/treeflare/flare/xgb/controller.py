"""Server side of the ``direct`` XGBoost transport: start XGBoost's federated server, send every site its rank,
supervise, and always stop the server.

Sequence: check every ranked site is connected; check the port (in use or out of range: the job fails before
any site trains); start ``xgboost.federated`` in a child process (``treeflare.xgb.fedserver``), with mutual TLS
from the server's startup kit everywhere except the simulator; broadcast ``xgb_direct_train``; then watch, every
0.2 s, for: all replies in, a site's error reply, a site NVFlare reports dead, the federated server exiting, an
abort, or ``train_timeout``. XGBoost needs every rank, so the first failure ends the job: the server is stopped at
once (the other sites' XGBoost calls then fail within a second instead of waiting forever), and the reason,
naming the site, goes to ``xgb_result.json``. The server is also stopped in ``stop_controller`` (abort, system
panic), so it never outlives the job.

Why not NVFlare's deprecated ``histogram_based.XGBFedController``: it ranks sites by a string sort of their
names, lets sites connect to ``localhost`` unless overridden in code, waits for a dead site until its train
timeout, and reports no reason; these thin components fix each of those and need nothing but the pinned
packages.
"""

from __future__ import annotations

import time
from pathlib import Path

from nvflare.apis.controller_spec import Task
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...xgb.fedserver import DEFAULT_XGB_PORT, FederatedServer, FederatedServerError, ServerTLS, check_port, free_port
from ..workflow import JobFailed, ResultWorkflow
from .protocol import (HEARTBEAT_TOPIC, TRAIN_TASK, ProtocolError, check_host, check_ranks, check_site_reply,
                       natural_key, train_task_data)

RESULT_FILE = "xgb_result.json"
POLL_S = 0.2
ABORT_SETTLE_S = 3.0  # after an abort, heartbeats still arriving for this long tell which site went silent


def _secure_system(fl_ctx) -> bool:
    """True on a POC or provisioned system (FLARE's own connections use mutual TLS), False in the simulator.
    Unknown counts as secure: then the server's certificates are required."""
    if fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False):
        return False
    server = getattr(fl_ctx.get_engine(), "server", None)
    return bool(getattr(server, "secure_train", True))


class XGBDirectController(ResultWorkflow):
    JOB = "xgb_histogram"
    RESULT_FILE = RESULT_FILE

    def __init__(self, site_ranks: dict, port: int = DEFAULT_XGB_PORT, server_host: str = "",
                 train_timeout: float = 3600.0, start_timeout: float = 30.0, heartbeat_timeout: float = 120.0):
        """
        Args:
            site_ranks: {site: rank}, fixed by the job (vertical: the label owner is rank 0).
            port: the XGBoost federated server's port (0: any free port, for the simulator).
            server_host: host name every site's XGBoost connects to ("" = each site's own view: its
                ``$TREEFLARE_XGB_SERVER_HOST`` or its startup kit's FL server host).
            train_timeout: seconds the whole training may take.
            start_timeout: seconds the federated server may take to listen.
            heartbeat_timeout: a site silent this long during training (no heartbeat: dead, frozen or cut off)
                fails the job, naming it; XGBoost itself would wait for it forever.
        """
        super().__init__()
        self.site_ranks = site_ranks
        self.port = port
        self.server_host = server_host
        self.train_timeout = float(train_timeout)
        self.start_timeout = float(start_timeout)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self._last_seen: dict = {}  # site -> time.monotonic() of its last heartbeat or reply
        self._beats: dict = {}  # site -> heartbeats received (reported)
        self._server: FederatedServer | None = None
        self._failures: dict = {}  # site -> reason, from replies and dead-site reports
        self._replies: dict = {}
        self._server_ended = True  # False if a server we started could not be ended

    # ------------------------------------------------------------------ lifecycle
    def start_controller(self, fl_ctx):
        fl_ctx.get_engine().register_aux_message_handler(topic=HEARTBEAT_TOPIC, message_handle_func=self._on_heartbeat)
        # NVFlare hands a dead site's report to the workflow's communicator and deems the site disconnected only
        # after a grace period (60 s). XGBoost cannot finish without every rank: note the report at once.
        comm = self.communicator
        original = getattr(comm, "process_dead_client_report", None)
        if callable(original):
            def on_dead_report(client_name, ctx):
                self._fail(client_name, "NVFlare reports its job process dead (killed, crashed or disconnected)")
                return original(client_name, ctx)

            comm.process_dead_client_report = on_dead_report

    def stop_controller(self, fl_ctx):
        self._stop_server()

    def handle_event(self, event_type: str, fl_ctx):
        super().handle_event(event_type, fl_ctx)
        if event_type in (EventType.CLIENT_DISCONNECTED, EventType.CLIENT_QUIT):
            name = fl_ctx.get_prop(FLContextKey.DISCONNECTED_CLIENT_NAME) or ""
            if name in (self.site_ranks or {}):
                self._fail(name, "disconnected from the FL server during training")

    def _on_heartbeat(self, topic, request, fl_ctx):
        peer = fl_ctx.get_peer_context()
        site = peer.get_identity_name() if peer else None
        if site in self._last_seen:
            self._last_seen[site] = time.monotonic()
            self._beats[site] = self._beats.get(site, 0) + 1
        return make_reply(ReturnCode.OK)

    def _silent(self, longer_than: float) -> dict:
        now = time.monotonic()
        return {s: now - t for s, t in self._last_seen.items() if s not in self._replies and now - t > longer_than}

    def _fail(self, site: str, reason: str) -> None:
        self._failures.setdefault(site, reason)

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            self._server_ended = server.stop() and self._server_ended

    # ------------------------------------------------------------------ workflow
    def initial_result(self) -> dict:
        return {**super().initial_result(), "transport": "direct"}

    def run_workflow(self, result: dict, run_dir: Path, abort_signal, fl_ctx) -> None:
        try:
            self._run(result, run_dir, abort_signal, fl_ctx)
        except JobFailed:
            raise
        except (ProtocolError, FederatedServerError) as exc:
            raise JobFailed(str(exc)) from None
        except Exception as exc:  # a bug or an environment problem: still a failed job with the real error
            self.log_exception(fl_ctx, "XGBoost direct workflow failed")
            raise JobFailed(f"{type(exc).__name__}: {exc}") from None
        finally:
            self._stop_server()
            result["federated_server_stopped"] = self._server_ended

    def _run(self, result: dict, run_dir: Path, abort_signal, fl_ctx) -> None:
        ranks = check_ranks(self.site_ranks)
        sites = sorted(ranks, key=ranks.get)
        check_host(self.server_host)
        result["ranks"] = ranks
        connected = {c.name for c in fl_ctx.get_engine().get_clients()}
        missing = [s for s in sites if s not in connected]
        if missing:
            raise JobFailed(f"sites {missing} are not connected; XGBoost needs every ranked site "
                            f"(connected: {sorted(connected, key=natural_key)})")
        port = free_port() if self.port == 0 else check_port(self.port)
        tls = None
        if _secure_system(fl_ctx):  # POC and provisioned systems: always mutual TLS with the kit's certificates
            tls = ServerTLS.from_kit(fl_ctx.get_engine().get_workspace().get_startup_kit_dir())
        t0 = time.perf_counter()
        self._server = FederatedServer(len(sites), port, tls, log_path=run_dir / "xgb_federated_server.log",
                                       ready_timeout=self.start_timeout).start()
        result["federated_server"] = {"bind": f"0.0.0.0:{port}", "port": port, "tls": tls is not None,
                                      "server_host_override": self.server_host or None}
        result["timings_s"]["server_start"] = time.perf_counter() - t0
        self.log_info(fl_ctx, f"started {self._server.describe()}")

        task = Task(name=TRAIN_TASK, data=Shareable(train_task_data(ranks, port, tls is not None, self.server_host)),
                    timeout=int(self.train_timeout), result_received_cb=self._on_result)
        t0 = time.perf_counter()
        self._last_seen = {s: time.monotonic() for s in sites}
        self.broadcast(task, fl_ctx, targets=sites, min_responses=len(sites), wait_time_after_min_received=0)
        reason = self._supervise(task, sites, abort_signal, t0)
        result["timings_s"]["train_task"] = time.perf_counter() - t0
        self._stop_server()  # before anything else: no surviving site may keep waiting on it
        if task.completion_status is None:
            self.cancel_task(task, fl_ctx=fl_ctx)
        result["sites"] = {s: self._replies[s] for s in sites if s in self._replies}
        result["heartbeats"] = {s: self._beats.get(s, 0) for s in sites}
        if reason:
            raise JobFailed(reason)
        self._summarise(result, sites)

    def _supervise(self, task: Task, sites: list, abort_signal, t0: float) -> str | None:
        """Wait until every site replied; return why not, at the first failure."""
        deadline = t0 + self.train_timeout
        while True:
            if self._failures:
                site, why = next(iter(self._failures.items()))
                others = {s: w for s, w in self._failures.items() if s != site}
                more = f" (also: {others})" if others else ""
                return (f"{site} (rank {self.site_ranks.get(site)}): {why}; training stopped, the XGBoost "
                        f"federated server was shut down{more}")
            if all(s in self._replies for s in sites):
                return None
            if abort_signal is not None and abort_signal.triggered:
                return self._abort_reason(sites)
            if self._server is None or not self._server.alive():
                log = self._server.log_tail() if self._server else ""
                return f"the XGBoost federated server exited during training: {log}"
            for s in sites:
                if s not in self._replies and self.get_client_disconnect_time(s):
                    self._fail(s, "deemed disconnected by NVFlare")
            for s, quiet in self._silent(self.heartbeat_timeout).items():
                self._fail(s, f"stopped responding: no heartbeat for {quiet:.0f} s (its job process died, froze or "
                              "lost its connection)")
            if task.completion_status is not None and not self._failures:
                waiting = [s for s in sites if s not in self._replies]
                return f"the train task ended ({task.completion_status}) without replies from {waiting}"
            if time.perf_counter() > deadline:
                waiting = [s for s in sites if s not in self._replies]
                return f"XGBoost training did not finish within {self.train_timeout:g} s (no reply from {waiting})"
            time.sleep(POLL_S)

    def _abort_reason(self, sites: list) -> str:
        """NVFlare aborted the run (an admin, or the FL server failing the job after a site's job process
        died). NVFlare does not tell the workflow why; the sites that went silent do."""
        waiting = [s for s in sites if s not in self._replies]
        time.sleep(ABORT_SETTLE_S)  # live sites keep beating until their own abort arrives
        silent = self._silent(ABORT_SETTLE_S)
        if self._failures:
            site, why = next(iter(self._failures.items()))
            return f"{site} (rank {self.site_ranks.get(site)}): {why}; NVFlare aborted the job"
        if silent and len(silent) < len(waiting):  # all silent at once says more about load than about a site
            named = ", ".join(f"{s} (rank {self.site_ranks.get(s)}, silent for {q:.0f} s)" for s, q in silent.items())
            return (f"{named} stopped responding during XGBoost training (its job process died or froze) and NVFlare "
                    f"aborted the job; training stopped, the XGBoost federated server was shut down")
        ages = {s: round(time.monotonic() - t, 1) for s, t in self._last_seen.items() if s in waiting}
        return (f"the job was aborted during XGBoost training (by an admin or by the FL server); sites still "
                f"training: {waiting} (seconds since their last heartbeat: {ages}); the XGBoost federated server "
                f"was shut down")

    def _on_result(self, client_task, fl_ctx) -> None:
        site = client_task.client.name
        self._last_seen.pop(site, None)
        reply = client_task.result
        client_task.result = None  # keep nothing large in the task
        rc = reply.get_return_code() if reply is not None else None
        if rc != ReturnCode.OK:
            error = reply.get("error") if reply is not None else None
            self._fail(site, str(error)[:2000] if isinstance(error, str) else f"failed with return code {rc}")
            return
        try:
            self._replies[site] = check_site_reply(dict(reply), site, self.site_ranks[site])
        except (ProtocolError, KeyError) as exc:
            self._fail(site, f"bad reply: {exc}")

    def _summarise(self, result: dict, sites: list) -> None:
        replies = [self._replies[s] for s in sites]
        start, end = min(r["train_start"] for r in replies), max(r["train_end"] for r in replies)
        result["timings_s"]["train"] = end - start  # first site's xgb.train start -> last one's end
        result["timings_s"]["load_max"] = max(r["load_s"] for r in replies)
        result["rounds"] = replies[0]["rounds"]
        result["models_identical"] = len({r["model_sha256"] for r in replies}) == 1
