"""Site side of ``--engine treeflare``: the engine's site (``treeflare.xgb.engine.site``, masked by
``engine.secure``) answering the server's ``xgb_engine`` tasks. The rows come from the job's data loader component
(the site's own binding, as for ``--engine xgboost``); the site's identity (startup kit) and the job id come from its
own context, never from a task. Its row work runs on the workers the job asks for, or those of its own
``$TREEFLARE_XGB_WORKERS`` (which alone may name a Dask scheduler, ``dask://HOST:PORT``). At the end the site keeps its copy of the model (``model.json`` in its run folder).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...crypto.secagg import SecAggError
from ...crypto.workers import parse_workers
from ...data import DataError
from ...data.errors import public_error
from ...trees.validate import PayloadError
from ...xgb.engine.secure import SecureSite
from ...xgb.engine.site import HistSite
from ..icdta4fl.executor import _job_id, site_identity
from ..site_config import load_binding
from ..site_executor import SiteExecutor
from .engine_controller import ENGINE_TASK, ENGINE_TOPIC, MODEL_FILE

PUBLIC_ERRORS = (PayloadError, SecAggError)  # about what the server sent: no site data in them
WORKERS_ENV = "TREEFLARE_XGB_WORKERS"  # a site's own setting: it alone may name a Dask scheduler (dask://HOST:PORT)


class XGBEngineExecutor(SiteExecutor):
    PUBLIC_ERRORS = PUBLIC_ERRORS

    def __init__(self, data_loader_id: str = "dataloader", data_root: str = "", binding: str = "", workers=0):
        """``workers``: the job's ask for this site's row workers (N processes or dask-local:N, never an address);
        ``$TREEFLARE_XGB_WORKERS`` on the site overrides it."""
        super().__init__()
        self.workers = parse_workers(workers, "workers", allow_address=False)
        self.data_loader_id = data_loader_id
        self.data_root, self.binding = data_root, binding
        self._site = None

    def handlers(self) -> dict:
        return {ENGINE_TASK: self._handle}  # the setup, and every request where the job sends tasks

    def failed(self, fl_ctx) -> None:
        if self._site is not None:  # its worker processes (or cluster state) end with the run
            self._site.site.close()

    def handle_event(self, event_type: str, fl_ctx):
        if event_type == EventType.START_RUN:  # the requests after setup come as aux messages
            fl_ctx.get_engine().register_aux_message_handler(topic=ENGINE_TOPIC, message_handle_func=self._on_aux)

    def _on_aux(self, topic: str, request: Shareable, fl_ctx) -> Shareable:
        site = fl_ctx.get_identity_name()
        try:
            if self._site is None:
                raise PayloadError("request", "asked before the setup task")
            return self._handle(site, request, fl_ctx)
        except Exception as exc:  # noqa: BLE001 -- a failure is a reply naming the request, never a crash
            self.log_error(fl_ctx, f"{ENGINE_TOPIC} failed at {site}: {type(exc).__name__}: {exc}")
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc, passthrough=self.PUBLIC_ERRORS)
            self.failed(fl_ctx)
            return reply

    def _handle(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        req = task.get("request")
        first = self._site is None
        if first:
            if not isinstance(req, dict) or req.get("type") != "setup":
                raise PayloadError("request", "the first request of a run must be its setup")
            self._site = self._make_site(site, fl_ctx)
            self._run_dir = Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))
        t = time.perf_counter()
        out = self._answer(req)
        seconds = time.perf_counter() - t
        if first and task.get("channel") is not None:  # the later requests come on a connection of our own
            self._connect(site, task.get("channel"), fl_ctx)
        reply = make_reply(ReturnCode.OK)
        reply["reply"] = out
        reply["site_s"] = seconds  # the site's own work on the request (the rest of a round trip is messaging)
        return reply

    def _answer(self, req) -> dict:
        out = self._site.handle(req)
        if isinstance(req, dict) and req.get("type") == "finish":  # the site keeps its copy of the model
            (self._run_dir / MODEL_FILE).write_text(json.dumps(self._site.site.model(), allow_nan=False))
        return out

    def _connect(self, site: str, spec, fl_ctx) -> None:
        """Connect to the engine's port and answer there, on a thread of its own, until the server says bye."""
        from nvflare.apis.fl_constant import FLContextKey

        from ...xgb.engine import channel
        from ...xgb.fedserver import ClientTLS
        from .protocol import site_server_host

        if not isinstance(spec, dict) or type(spec.get("port")) is not int or not isinstance(spec.get("token"), str) \
                or not isinstance(spec.get("tls"), bool) or not isinstance(spec.get("server_host", ""), str):
            raise PayloadError("channel", "expected port, token, tls and server_host")
        simulate = bool(fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False))
        if not spec["tls"] and not simulate:
            raise PayloadError("channel", "the server asked for a connection without TLS outside the simulator")
        startup = fl_ctx.get_engine().get_workspace().get_startup_kit_dir()
        tls = ClientTLS.from_kit(startup) if spec["tls"] else None
        host, source = site_server_host(spec.get("server_host", ""), startup, simulate)
        self.log_info(fl_ctx, f"{site}: the engine's requests come on {host}:{spec['port']} (host from {source}), "
                              f"TLS {'on' if tls else 'off'}")
        def public(exc):  # the full error stays in this site's log; the server hears the redacted form
            self.logger.error(f"{site}: an engine request failed: {type(exc).__name__}: {exc}")
            self.failed(None)
            return public_error(exc, passthrough=self.PUBLIC_ERRORS)

        def run():  # on a thread: the TLS handshake needs the server, which first waits for every setup reply
            try:
                conn = channel.connect(host, spec["port"], site, spec["token"], tls)
            except (channel.ChannelError, OSError) as exc:  # the server names this site when it does not connect
                self.logger.error(f"{site}: cannot connect to the engine's port: {type(exc).__name__}: {exc}")
                self.failed(None)
                return
            channel.serve(conn, self._answer, public)

        threading.Thread(target=run, daemon=True, name=f"treeflare-engine-{site}").start()

    def _make_site(self, site: str, fl_ctx) -> SecureSite:
        loader = fl_ctx.get_engine().get_component(self.data_loader_id)
        if loader is None:
            raise DataError(f"{site}: no data loader component {self.data_loader_id!r} in this job")
        loader.initialize(client_id=site, rank=0)
        train, valid = loader.arrays()
        if train.y is None:
            raise DataError(f"{site}: its training rows have no label column", site=site)
        allowed = None
        try:
            binding = load_binding(site, fl_ctx, self.data_root, name=self.binding)
            allowed = binding.refine_peers  # the operator's own list of the federation, never the server's word
        except Exception:  # noqa: BLE001 - no binding of its own: any client site of the project
            allowed = None
        own = os.environ.get(WORKERS_ENV, "").strip()
        workers = parse_workers(own, WORKERS_ENV) if own else self.workers
        return SecureSite(HistSite(site, train.X, train.y, valid.X, valid.y, workers=workers), _job_id(fl_ctx),
                          identity=site_identity(fl_ctx, site), allowed_sites=allowed)
