"""Federated XGBoost (histogram-based) as an NVFlare Recipe, for both transports and both split modes.

    recipe = XGBHistogramRecipe(sites=sites, xgb_params=make_params(2), num_rounds=50,
                                data_loader=lambda: TreeflareXGBDataLoader(folder="/data/fed", schema=schema))
    recipe.execute(SimEnv(clients=recipe.sites))

``transport="direct"`` (default): our controller starts XGBoost's own federated gRPC server and every site's
XGBoost connects straight to it (:mod:`.controller`, :mod:`.executor`). ``transport="flare"``: NVFlare's
histogram_based_v2 controller and executor relay every collective operation through NVFlare messaging, built here
from their public classes as NVFlare's own XGB recipes build them, with what those recipes do not expose: the sites'
ranks fixed in site order for horizontal training too (the controller would rank a string sort of the names, site-10
before site-2), the executor's message timeouts, and the PSI phase before vertical training in the same job.

Every site gets an app of its own (the layout of NVFlare's recipes): a FedJob holding an all-sites app too would
export only that one.
"""

from __future__ import annotations

from typing import Callable

from nvflare.app_common.widgets.convert_to_fed_event import ConvertToFedEvent
from nvflare.app_opt.tracking.tb.tb_receiver import TBAnalyticsReceiver
from nvflare.app_opt.tracking.tb.tb_writer import TBWriter
from nvflare.job_config.api import FedJob

from ..recipe import TreeflareRecipe
from .protocol import TRAIN_TASK, job_ranks

JOB_NAME = "xgb_histogram"
TRANSPORTS = ("direct", "flare")
DATA_LOADER_ID = "dataloader"
METRICS_WRITER_ID = "log_writer"
MODEL_FILE = "model.json"
# One FLARE aux message per XGBoost collective operation (per_msg_timeout == tx_timeout makes ReliableMessage
# send a plain request/reply instead of request + ack + separate reply + query: two messages instead of four).
PER_MSG_TIMEOUT = 600.0


class PerSiteApps:
    """``job`` with ``to_clients(obj)`` made one ``to(obj, site)`` per site (the PSI phase adds its components
    with ``to_clients``; this job has one app per site)."""

    def __init__(self, job: FedJob, sites):
        self.job, self.sites = job, list(sites)

    def to_clients(self, obj, **kwargs):
        for site in self.sites:
            self.job.to(obj, site, **kwargs)

    def to_server(self, obj, **kwargs):
        self.job.to_server(obj, **kwargs)


class XGBHistogramRecipe(TreeflareRecipe):
    """One federated XGBoost job.

    Args:
        sites: the sites, in rank order (vertical: ``sites[0]`` holds the label and is rank 0).
        xgb_params: XGBoost's training parameters (``treeflare.xgb.make_params``).
        num_rounds, early_stopping_rounds: boosting rounds, and the rounds without improvement that stop it.
        data_loader: makes each site's data loader component (called once per site).
        vertical: column split (needs ``psi``: the PSI phase's ``add_psi`` arguments).
        transport: "direct" or "flare" (see the module's text).
        direct: the direct transport's controller arguments (port, server_host, train_timeout, heartbeat_timeout)
            and ``connect_timeout`` for the executors.
        messaging: "direct" (default) or "reliable": the flare transport's message timeouts.
    """

    def __init__(self, *, sites, xgb_params: dict, num_rounds: int, data_loader: Callable[[], object],
                 early_stopping_rounds: int = 0, vertical: bool = False, transport: str = "direct",
                 psi: dict | None = None, direct: dict | None = None, messaging: str = "direct",
                 name: str = JOB_NAME, engine: dict | None = None):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if vertical and psi is None:
            raise ValueError("vertical training needs the PSI phase's arguments (psi=...)")
        sites = list(sites)
        self.ranks = job_ranks(sites)  # rank order == site order (site-1, site-2, ..., site-10)
        job = FedJob(name=name, min_clients=len(sites))
        if vertical:  # PSI first: server workflows run in the order added
            from ..psi.job import add_psi

            add_psi(PerSiteApps(job, sites), sites, **psi)
        if engine is not None:  # --engine treeflare: our histogram boosting on masked sums, horizontal only
            if vertical:
                raise ValueError("the treeflare engine trains horizontal federations only")
            self._engine(job, sites, data_loader, dict(engine))
        elif transport == "direct":
            self._direct(job, sites, xgb_params, num_rounds, early_stopping_rounds, vertical, data_loader,
                         dict(direct or {}))
        else:
            self._flare(job, sites, xgb_params, num_rounds, early_stopping_rounds, vertical, data_loader, messaging)
        super().__init__(job, sites, client_targets=sites)

    def _site_widgets(self, job: FedJob, site: str, data_loader) -> None:
        # NVFlare's TensorBoard relay for per-round metrics (tb_events/ on the server)
        job.to(TBWriter(event_type="analytix_log_stats"), site, id=METRICS_WRITER_ID)
        job.to(ConvertToFedEvent(events_to_convert=["analytix_log_stats"], fed_event_prefix="fed."), site,
               id="event_to_fed")
        job.to(data_loader(), site, id=DATA_LOADER_ID)

    def _engine(self, job, sites, data_loader, engine: dict) -> None:
        """``engine``: the engine controller's arguments (params as ``BoostParams.to_dict()``, n_features,
        feature_names, task_timeout; workers: each site's row workers, ``crypto.workers.parse_workers``)."""
        from .engine_controller import ENGINE_TASK, XGBEngineController
        from .engine_executor import XGBEngineExecutor

        workers = engine.pop("workers", 0)
        job.to_server(XGBEngineController(sites=sites, **engine), id="xgb_controller")
        for site in sites:
            job.to(XGBEngineExecutor(data_loader_id=DATA_LOADER_ID, workers=workers), site, id="xgb_executor",
                   tasks=[ENGINE_TASK])
            job.to(data_loader(), site, id=DATA_LOADER_ID)

    def _direct(self, job, sites, params, rounds, early_stopping, vertical, data_loader, direct) -> None:
        from .controller import XGBDirectController
        from .executor import XGBDirectExecutor

        connect_timeout = direct.pop("connect_timeout", None)
        job.to_server(XGBDirectController(site_ranks=self.ranks, **direct), id="xgb_controller")
        job.to_server(TBAnalyticsReceiver(tb_folder="tb_events"), id="tb_receiver")
        for site in sites:
            extra = {} if connect_timeout is None else {"connect_timeout": connect_timeout}
            job.to(XGBDirectExecutor(data_loader_id=DATA_LOADER_ID, xgb_params=params, num_rounds=rounds,
                                     early_stopping_rounds=early_stopping, vertical=vertical,
                                     metrics_writer_id=METRICS_WRITER_ID, model_file_name=MODEL_FILE, **extra),
                   site, id="xgb_executor", tasks=[TRAIN_TASK])
            self._site_widgets(job, site, data_loader)

    def _flare(self, job, sites, params, rounds, early_stopping, vertical, data_loader, messaging) -> None:
        from nvflare.app_common.widgets.metrics_artifact_writer import MetricsArtifactWriter
        from nvflare.app_opt.xgboost.histogram_based_v2.fed_controller import XGBFedController
        from nvflare.app_opt.xgboost.histogram_based_v2.fed_executor import FedXGBHistogramExecutor

        per_msg, tx = (PER_MSG_TIMEOUT, PER_MSG_TIMEOUT) if messaging == "direct" else (60.0, 600.0)
        job.to_server(MetricsArtifactWriter(), id="metrics_artifact_writer")
        job.to_server(XGBFedController(num_rounds=rounds, data_split_mode=1 if vertical else 0, secure_training=False,
                                       xgb_params=params,
                                       xgb_options={"early_stopping_rounds": early_stopping, "use_gpus": False},
                                       client_ranks=self.ranks),
                      id="xgb_controller")
        job.to_server(TBAnalyticsReceiver(tb_folder="tb_events"), id="tb_receiver")
        for site in sites:
            job.to(FedXGBHistogramExecutor(data_loader_id=DATA_LOADER_ID, metrics_writer_id=METRICS_WRITER_ID,
                                           per_msg_timeout=per_msg, tx_timeout=tx, in_process=True,
                                           model_file_name=MODEL_FILE),
                   site, id="xgb_executor", tasks=["config", "start"])
            self._site_widgets(job, site, data_loader)
