"""A site's side of ``--psi ecdh``: the phase's check, result and discard tasks (:class:`PsiSiteExecutor`'s), and
the relay's requests, which come as aux messages (``ECDH_TOPIC``: pushed to the site at once, where a task waits for
the site's next poll), fed to its :class:`treeflare.psi.session.PsiSession`. Its intersection is written to its own
run folder at the phase's result task, which comes only after every party is done (nothing before; a new start
deletes an earlier one).

The party's items are the ids its ``SiteIds`` component read and checked; its identity (startup kit) and the job id
come from its own context, never from a task. Its blinding runs on a crypto worker pool (``crypto.workers``, started
while the phase's check runs) when the run is large enough to pay for starting one (:data:`POOL_MIN_ITEMS`): the
job's ``workers`` (processes, 0 = all cores, in the simulator each party's share of them, or ``dask-local:N``), or the
site's own ``$TREEFLARE_VERTICAL_WORKERS`` (which alone may name a Dask scheduler, ``dask://HOST:PORT``); one worker
is the site's own process. ``$TREEFLARE_PSI_MAX_RATIO`` lowers the set-size ratio this site takes part with.
"""

from __future__ import annotations

import os
import threading
import time

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...crypto.workers import make_pool, parse_workers
from ...data.errors import public_error
from ...data.intersection import psi_items, write_intersection
from ...psi.party import DEFAULT_MAX_RATIO, PsiError, check_ratio
from ...psi.session import PsiSession
from ..icdta4fl.executor import _job_id, site_identity
from .executor import LOCAL_PSI_ID, PsiSiteExecutor, delete_intersection
from .protocol import ECDH_TOPIC, PsiProtocolError, intersection_dir, run_dir_of

WORKERS_ENV = "TREEFLARE_VERTICAL_WORKERS"
RATIO_ENV = "TREEFLARE_PSI_MAX_RATIO"
POOL_MIN_ITEMS = 40_000  # below this many items in all lists, a worker process costs more than it saves
POOL_MODULES = ("treeflare.psi.group",)


def site_ratio(job_ratio: float) -> float:
    """The lower of the job's ratio bound and this site's own (``$TREEFLARE_PSI_MAX_RATIO``)."""
    own = os.environ.get(RATIO_ENV, "").strip()
    if not own:
        return job_ratio
    try:
        value = float(own)
    except ValueError:
        raise PsiProtocolError(f"${RATIO_ENV} must be a number from 1 to 1e6") from None
    return min(job_ratio, check_ratio(value, f"${RATIO_ENV}"))


class EcdhPsiExecutor(PsiSiteExecutor):
    PUBLIC_ERRORS = (PsiError, PsiProtocolError)

    def __init__(self, sites: list | None = None, local_psi_id: str = LOCAL_PSI_ID,
                 max_ratio: float = DEFAULT_MAX_RATIO, workers: int | str = 0):
        """``sites``: the job's parties (this site's configuration: it takes part with no other). ``max_ratio``:
        the job's bound on one party's set over the largest other's. ``workers``: the blinding's pool, as the
        vertical job's ``--workers`` (a number or ``dask-local:N``; only the site's environment names a scheduler)."""
        super().__init__(local_psi_id=local_psi_id)
        self.sites = [str(s) for s in sites or []]
        self.max_ratio = check_ratio(max_ratio)
        self.workers = parse_workers(workers, "EcdhPsiExecutor workers", allow_address=False)
        self.session: PsiSession | None = None
        self.pool = None
        self._pool_thread: threading.Thread | None = None
        self._pool_error: Exception | None = None
        self.saved = self.finished = False
        self.seconds = 0.0
        self.bytes_sent = 0
        self.bytes_received = 0

    def meter(self, fl_ctx):
        return self

    def handle_event(self, event_type: str, fl_ctx):
        if event_type == EventType.START_RUN:
            fl_ctx.get_engine().register_aux_message_handler(topic=ECDH_TOPIC, message_handle_func=self._on_aux)
        elif event_type == EventType.END_RUN:
            self._close_pool()

    def _on_aux(self, topic: str, request: Shareable, fl_ctx) -> Shareable:
        site = fl_ctx.get_identity_name()
        try:
            return self._ecdh(site, request, fl_ctx)
        except Exception as exc:  # noqa: BLE001 -- a failure is a reply naming the request, never a crash
            self.log_error(fl_ctx, f"{ECDH_TOPIC} failed at {site}: {type(exc).__name__}: {exc}")
            self.failed(fl_ctx)
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc, passthrough=self.PUBLIC_ERRORS)
            return reply

    def _check(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        """The phase's check; a site whose set is large starts its blinding pool meanwhile (worker processes take a
        moment to start), so that the protocol's first round does not wait for it."""
        reply = super()._check(site, task, fl_ctx)
        self.close()
        n = sum(len(v) for v in self._local(fl_ctx).ids(fl_ctx).values())
        if n * 2 >= POOL_MIN_ITEMS or os.environ.get(WORKERS_ENV, "").strip():
            simulated = bool(fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False))
            self._pool_thread = threading.Thread(target=self._start_pool, args=(simulated,), daemon=True,
                                                 name="psi-pool-start")
            self._pool_thread.start()
        return reply

    def _start_pool(self, simulated: bool) -> None:
        try:
            self.pool = self._make_pool(simulated)
        except Exception as exc:  # noqa: BLE001 -- the start request reports it (the site's own settings)
            self._pool_error = exc

    def _make_pool(self, simulated: bool):
        own = os.environ.get(WORKERS_ENV, "").strip()
        try:  # the message names the setting, never its value (an address)
            workers = parse_workers(own, f"${WORKERS_ENV}") if own else self.workers
        except ValueError as exc:
            raise PsiProtocolError(str(exc)) from None
        if workers == 0:
            # all cores; in the simulator every party runs on this one machine: its share of them
            workers = max((os.cpu_count() or 1) // (len(self.sites) if simulated else 1), 1)
        if workers == 1:
            return None  # the site's own process blinds (a worker process would only add its start and a copy)
        return make_pool(workers, POOL_MODULES)

    def _pool(self):
        """The pool started at the check (None: none, the set is small)."""
        if self._pool_thread is not None:
            self._pool_thread.join()
            self._pool_thread = None
        if self._pool_error is not None:
            error, self._pool_error = self._pool_error, None
            raise error
        return self.pool

    def _ecdh(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        req = task.get("request")
        t0 = time.perf_counter()
        run_dir = run_dir_of(fl_ctx)
        if isinstance(req, dict) and req.get("type") == "start":
            if self.session is not None:  # a second start: the run begins again from nothing
                self.close()
            comp = self._local(fl_ctx)
            delete_intersection(run_dir)  # a new run starts from nothing
            items = psi_items(comp.ids(fl_ctx))
            self.session = PsiSession(site, items, job_id=_job_id(fl_ctx), sites=self.sites,
                                      identity=site_identity(fl_ctx, site), max_ratio=site_ratio(self.max_ratio),
                                      pool=self._pool())
        if self.session is None:
            raise PsiProtocolError("an ECDH-PSI round before its start")
        reply_data = self.session.handle(req)
        if self.session.done and not self.finished:
            self.finished = True
            self._close_pool()
            self.log_info(fl_ctx, f"{site}: ECDH-PSI done, {len(self.session.kept_items())} shared items (kept once "
                                  "the server's result task says every party is done)")
        self.bytes_sent, self.bytes_received = self.session.bytes_sent, self.session.bytes_received
        self.seconds += time.perf_counter() - t0
        reply = make_reply(ReturnCode.OK)
        reply["reply"] = reply_data
        return reply

    def _result(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        """The phase's result task comes only once the relay has seen every party done: the intersection is written
        now, so that a phase that fails (a party late with its last reply, say) leaves nothing at any site."""
        if self.session is not None and self.session.done and not self.saved:
            write_intersection(intersection_dir(run_dir_of(fl_ctx)), self.session.kept_items(), site=site)
            self.saved = True
        return super()._result(site, task, fl_ctx)

    def _close_pool(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def close(self) -> None:
        if self._pool_thread is not None:  # the pool being started: let it start, then close it
            self._pool_thread.join()
            self._pool_thread = None
        self._pool_error = None
        self._close_pool()
        self.session, self.saved, self.finished = None, False, False
        self.seconds, self.bytes_sent, self.bytes_received = 0.0, 0, 0

    def failed(self, fl_ctx) -> None:
        self._close_pool()
