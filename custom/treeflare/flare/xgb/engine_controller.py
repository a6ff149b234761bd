"""Server side of ``--engine treeflare``: the engine's server (``treeflare.xgb.engine.server``) driven over FLARE.

The engine's setup request goes to every site as an ``xgb_engine`` task; every later one on the sites' own
connections to ``--xgb-port`` (``engine.channel``; messaging "direct", the default), or as FLARE aux messages or
tasks (the benchmark's comparison). The routing and the checks of the replies are the engine's own router's
(``engine.driver.run_protocol``, which the in-process runs use too): a setup reply holds the feature count and a
well-formed key announcement, any other one masked uint64 vector of the request, the same length at every site, and
only their sum mod 2^64 reaches the engine. The key list the sites announced goes out with every later request; each
site checks it itself. The server writes ``engine_result.json`` (status, rounds, the pooled validation metric per
round, requests, values summed, seconds per request type) and ``model.json`` (XGBoost's JSON, the schema added by
the job script) in its run folder. A site that fails, times out or sends a malformed reply ends the job, naming the
site and the request; a pooled sum that honest sites cannot give ends it too (the sum cannot say which site).
"""

from __future__ import annotations

import json
import threading
import time

from nvflare.apis.controller_spec import Task
from nvflare.apis.fl_constant import ReturnCode

from ...xgb.engine.driver import run_protocol
from ...xgb.engine.params import BoostParams
from ...xgb.engine.server import EngineError, HistServer
from ..progress import format_duration, say
from ..workflow import JobFailed, ResultWorkflow, collect, replies_of

ENGINE_TASK = "xgb_engine"
# every request after the setup task goes as an aux message: pushed to the sites at once, where a task would wait for
# each site's next poll (task_request_interval): one request per tree level makes that the cost of a round
ENGINE_TOPIC = "treeflare.xgb_engine"
MESSAGING = ("direct", "aux", "task")
RESULT_FILE = "engine_result.json"
MODEL_FILE = "model.json"


class XGBEngineController(ResultWorkflow):
    JOB = "xgb_histogram"
    RESULT_FILE = RESULT_FILE

    def __init__(self, sites: list, params: dict, n_features: int, feature_names: list | None = None,
                 task_timeout: int = 600, messaging: str = "direct", port: int = 0, server_host: str = "",
                 connect_timeout: float = 60.0):
        """``messaging``: "direct" (every request after the setup on the sites' own connections to ``port``,
        ``engine.channel``: mutual TLS with the kits' certificates outside the simulator), "aux" (as FLARE aux
        messages) or "task" (every request a FLARE task; the benchmark's comparison). ``server_host``: the host the
        sites connect to (default: the FL server's in each site's kit; localhost in the simulator)."""
        super().__init__()
        if messaging not in MESSAGING:
            raise ValueError(f"messaging must be one of {MESSAGING}, not {messaging!r}")
        self.messaging = messaging
        self.port, self.server_host, self.connect_timeout = int(port), str(server_host), float(connect_timeout)
        self._channel = None
        self.sites = list(sites)
        self.params = dict(params)
        self.n_features = int(n_features)
        self.feature_names = list(feature_names) if feature_names else None
        self.task_timeout = int(task_timeout)

    def initial_result(self) -> dict:
        return {**super().initial_result(), "engine": "treeflare", "sites": self.sites}

    def run_workflow(self, result, run_dir, abort_signal, fl_ctx):
        connected = {c.name for c in fl_ctx.get_engine().get_clients()}
        missing = [s for s in self.sites if s not in connected]
        if missing:
            raise JobFailed(f"sites not connected: {missing}")
        params = BoostParams.from_dict(self.params)
        server = HistServer(params, self.n_features, self.feature_names)
        try:
            self._train(server, params, result, run_dir, abort_signal, fl_ctx)
        finally:
            if self._channel is not None:
                self._channel.close()
                result["channel_closed"] = True

    def _open_channel(self, fl_ctx) -> dict:
        """Listen for the sites (messaging "direct"); what the setup task tells them about it."""
        from ...xgb.engine.channel import ChannelServer, new_token
        from ...xgb.fedserver import ServerTLS
        from .controller import _secure_system

        # as the XGBoost direct transport: TLS wherever FLARE's own connections use it (POC, provisioned systems)
        tls = ServerTLS.from_kit(fl_ctx.get_engine().get_workspace().get_startup_kit_dir()) \
            if _secure_system(fl_ctx) else None
        token = new_token()
        self._channel = ChannelServer(self.sites, token, self.port, tls, timeout=float(self.task_timeout))
        # the sites connect as soon as they have set up: accept while the setup task is out (a TLS handshake waits
        # for the server's side of it)
        self._accepted: dict = {}

        def accept():
            try:
                self._channel.accept_all(float(self.task_timeout) + self.connect_timeout)
            except Exception as exc:  # noqa: BLE001 - handed to the workflow, which ends the job naming the site
                self._accepted["error"] = exc

        self._acceptor = threading.Thread(target=accept, daemon=True, name="treeflare-engine-accept")
        self._acceptor.start()
        return {"port": self._channel.port, "token": token, "tls": tls is not None, "server_host": self.server_host}

    def _train(self, server, params, result, run_dir, abort_signal, fl_ctx):
        channel = self._open_channel(fl_ctx) if self.messaging == "direct" else None
        if channel is not None:
            result["channel"] = {"bind": f"0.0.0.0:{channel['port']}", "tls": channel["tls"]}
        t0 = time.perf_counter()
        self._site_s = 0.0
        by_type: dict = {}  # request type -> [requests, seconds waiting for the sites' replies, sites' own seconds]

        def ask(req):
            ts = time.perf_counter()
            replies = self._ask(req, abort_signal, fl_ctx, channel if req["type"] == "setup" else None)
            counts = by_type.setdefault(req["type"], [0, 0.0, 0.0])
            counts[0] += 1
            counts[1] += time.perf_counter() - ts
            counts[2] += self._site_s
            return replies

        def observe(req, replies, answer):
            if req["type"] == "round":
                say(fl_ctx, f"round {req['round'] + 1}/{params.rounds}  elapsed "
                            f"{format_duration(time.perf_counter() - t0)}", done=req["round"] + 1, total=params.rounds)

        try:
            doc = run_protocol(server, ask, observe)
        except EngineError as exc:  # a pooled sum honest sites cannot give, or a reply not of the protocol
            raise JobFailed(str(exc)) from None
        (run_dir / MODEL_FILE).write_text(json.dumps(doc, allow_nan=False))
        result.update(rounds=server.stats["rounds"], requests=server.stats["requests"],
                      values_summed=server.stats["values_summed"], eval_metric=params.eval_metric,
                      validation_history=server.history, best_iteration=server.best_iteration,
                      n_train=server.n_train, n_valid=server.n_valid, grad_bits=server.grad_bits,
                      bins=[max(len(c) - 1, 0) for c in server.cuts], model_file=MODEL_FILE)
        setup = by_type.get("setup", [0, 0.0, 0.0])[1]  # the sites load their rows (and XGBoost) in their setup
        result["timings_s"].update(setup=setup, train=time.perf_counter() - t0 - setup,
                                   waiting_for_sites=sum(t for _, t, _ in by_type.values()) - setup)
        result["messaging"] = self.messaging
        # seconds: waiting for every site's reply; site_seconds: the slowest site's own work on each request, summed
        result["requests_by_type"] = {k: {"requests": n, "seconds": round(t, 3), "site_seconds": round(w, 3)}
                                      for k, (n, t, w) in by_type.items()}

    def _ask(self, req: dict, abort_signal, fl_ctx, channel: dict | None = None) -> dict:
        from nvflare.apis.shareable import Shareable

        from ...xgb.engine.channel import ChannelError

        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed(f"aborted before request {req['seq']} ({req['type']})")
        if self.messaging == "direct" and req["type"] != "setup":
            try:
                replies = self._checked(req, self._channel.ask(req), {})
                self._site_s = self._channel.last_site_s
                return replies
            except ChannelError as exc:
                raise JobFailed(f"{exc} (request {req['seq']}, {req['type']})") from None
        if req["type"] == "setup" or self.messaging == "task":
            data = {"request": req, **({"channel": channel} if channel else {})}
            task = Task(name=ENGINE_TASK, data=Shareable(data), timeout=self.task_timeout)
            collect(self, task, fl_ctx, self.sites, abort_signal)
            if abort_signal is not None and abort_signal.triggered:
                raise JobFailed(f"aborted during request {req['seq']} ({req['type']})")
            replies, problems = replies_of(task, self.sites)
            self._site_s = max((ct.result.get("site_s") or 0.0 for ct in task.client_tasks
                                if ct.result is not None and isinstance(ct.result.get("site_s"), float)),
                               default=0.0)
        else:
            answers = fl_ctx.get_engine().send_aux_request(targets=self.sites, topic=ENGINE_TOPIC,
                                                           request=Shareable({"request": req}),
                                                           timeout=float(self.task_timeout), fl_ctx=fl_ctx) or {}
            replies, problems = {}, {}
            for site in self.sites:
                answer = answers.get(site)
                if answer is None:
                    problems[site] = f"no reply within {self.task_timeout} s"
                elif answer.get_return_code() != ReturnCode.OK:
                    problems[site] = f"{answer.get('error') or answer.get_return_code()}"[:2000]
                else:
                    replies[site] = answer.get("reply")
            times = [a.get("site_s") for a in answers.values() if a is not None]
            self._site_s = max((t for t in times if isinstance(t, float)), default=0.0)
        replies = self._checked(req, replies, problems)
        if channel is not None:  # every site set up: each connects to the engine's port (accepted meanwhile)
            self._acceptor.join(self.connect_timeout)
            missing = sorted(set(self.sites) - set(self._channel.conns))
            if "error" in self._accepted or missing:
                raise JobFailed(str(self._accepted.get("error") or
                                    f"{', '.join(missing)}: did not connect to the engine's port "
                                    f"{self._channel.port} within {self.connect_timeout:.0f} s"))
        return replies

    def _checked(self, req: dict, replies: dict, problems: dict) -> dict:
        if problems:
            site = sorted(problems)[0]
            raise JobFailed(f"{site}: {req['type']} request {req['seq']} failed: {problems[site]}")
        for site, reply in replies.items():
            if not isinstance(reply, dict):
                raise JobFailed(f"{site}: its reply to {req['type']} request {req['seq']} is not a dict")
        return replies
