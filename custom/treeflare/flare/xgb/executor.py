"""Site side of the ``direct`` XGBoost transport: train with XGBoost's federated communicator connected straight
to the server's XGBoost federated server (no per-operation relay through NVFlare).

On the ``xgb_direct_train`` task the site checks the task against its own expectations, finds the server's host
(see ``protocol.site_server_host``), checks the port is reachable within ``connect_timeout`` (a clear
error naming host and port instead of XGBoost's minutes of retries), loads its data with the job's data loader
and trains. Outside the simulator it always uses TLS with its startup kit's root CA and client key/certificate,
and refuses a task that asks for plain TCP. Per-round metrics go to the job's metrics writer (TensorBoard on the
server) from rank 0 only, and from a thread of their own: XGBoost computes eval metrics collectively, so every
rank holds the same values, and writing them inside the boosting loop held up every rank at the next collective
(about 12% of the train time on 200k rows, 3 sites). The model goes to ``<run dir>/model.json`` with the shared
schema attached (``treeflare.xgb.model``: a site can predict with it on raw rows); the reply carries only rank,
timings, sizes and the model's sha256 (every rank must end with the same model).
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...data.errors import public_error
from ...xgb.fedserver import ClientTLS, FederatedServerError, communicator_args, wait_reachable
from .protocol import HEARTBEAT_TOPIC, TRAIN_TASK, ProtocolError, parse_train_task, short_error, site_server_host


class XGBDirectExecutor(Executor):
    def __init__(self, data_loader_id: str, xgb_params: dict, num_rounds: int, early_stopping_rounds: int = 0,
                 vertical: bool = False, metrics_writer_id: str = "", model_file_name: str = "model.json",
                 connect_timeout: float = 30.0, heartbeat_interval: float = 1.0):
        """
        Args:
            data_loader_id: component id of the site's ``XGBDataLoader``.
            xgb_params, num_rounds, early_stopping_rounds: ``xgboost.train`` settings (0 = no early stopping).
            vertical: column split (the label owner must be rank 0).
            metrics_writer_id: component id of a LogWriter for per-round metrics ("" for none).
            model_file_name: file name of the model in the site's run folder.
            connect_timeout: seconds to wait for the server's XGBoost port before failing with host and port.
            heartbeat_interval: seconds between "still training" messages to the server (through NVFlare), so
                the server can name a site that died or froze.
        """
        super().__init__()
        self.data_loader_id = data_loader_id
        self.xgb_params = dict(xgb_params)
        self.num_rounds = int(num_rounds)
        self.early_stopping_rounds = int(early_stopping_rounds)
        self.vertical = bool(vertical)
        self.metrics_writer_id = metrics_writer_id
        self.model_file_name = Path(model_file_name).name  # a file name, never a path out of the run folder
        self.connect_timeout = float(connect_timeout)
        self.heartbeat_interval = float(heartbeat_interval)

    def execute(self, task_name: str, shareable: Shareable, fl_ctx, abort_signal) -> Shareable:
        site = fl_ctx.get_identity_name()
        if task_name != TRAIN_TASK:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        stop = threading.Event()
        beats = threading.Thread(target=self._heartbeats, args=(fl_ctx.get_engine(), stop), daemon=True,
                                 name="xgb_direct_heartbeat")
        beats.start()
        try:
            return self._train(site, shareable, fl_ctx, abort_signal)
        except (ProtocolError, FederatedServerError) as exc:
            return self._error(fl_ctx, site, str(exc))
        except Exception as exc:  # XGBoost (e.g. the server stopped mid-training), the data loader, ...
            self.log_exception(fl_ctx, f"{site}: XGBoost training failed")
            return self._error(fl_ctx, site, public_training_error(exc))
        finally:
            stop.set()

    def _heartbeats(self, engine, stop: threading.Event) -> None:
        """Tell the server this site is alive until ``stop`` (XGBoost releases the GIL while it trains)."""
        while True:
            try:
                with engine.new_context() as ctx:
                    engine.fire_and_forget_aux_request(topic=HEARTBEAT_TOPIC, request=Shareable(), fl_ctx=ctx)
            except Exception:  # a lost heartbeat is what the server watches for; never fail training over it
                pass
            if stop.wait(self.heartbeat_interval):
                return

    def _error(self, fl_ctx, site: str, message: str) -> Shareable:
        self.log_error(fl_ctx, f"{site}: {message}")
        reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
        reply["error"] = message[:2000]
        return reply

    def _train(self, site: str, task: Shareable, fl_ctx, abort_signal) -> Shareable:
        import xgboost as xgb
        from nvflare.app_opt.xgboost.data_loader import XGBDataLoader

        spec = parse_train_task(dict(task), site)
        simulate = bool(fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False))
        workspace = fl_ctx.get_engine().get_workspace()
        startup = workspace.get_startup_kit_dir()
        if not spec["tls"] and not simulate:
            raise ProtocolError("the server asked for XGBoost without TLS outside the simulator; refused")
        tls = ClientTLS.from_kit(startup) if spec["tls"] else None
        host, source = site_server_host(spec["server_host"], startup, simulate)
        self.log_info(fl_ctx, f"{site}: rank {spec['rank']} of {spec['world_size']}, XGBoost federated server "
                              f"{host}:{spec['port']} (host from {source}), TLS {'on' if tls else 'off'}")
        wait_reachable(host, spec["port"], self.connect_timeout, who=site)

        engine = fl_ctx.get_engine()
        loader = engine.get_component(self.data_loader_id)
        if not isinstance(loader, XGBDataLoader):
            raise ProtocolError(f"component {self.data_loader_id!r} is not an XGBDataLoader")
        callbacks = [_abort_callback(abort_signal)]
        metrics = None
        if self.metrics_writer_id and spec["rank"] == 0:
            metrics = queued_metrics_callback(engine.get_component(self.metrics_writer_id))
            callbacks.append(metrics)
        mode = xgb.core.DataSplitMode.COL if self.vertical else xgb.core.DataSplitMode.ROW
        loader.initialize(client_id=site, rank=spec["rank"], data_split_mode=mode)
        run_dir = Path(workspace.get_run_dir(fl_ctx.get_job_id()))
        comm = communicator_args(host, spec["port"], spec["world_size"], spec["rank"], tls)
        try:
            with xgb.collective.CommunicatorContext(**comm):
                t0 = time.time()
                # DMatrix must be built inside the communicator context (column split needs it)
                dtrain, dvalid = loader.load_data()
                t1 = time.time()
                booster = xgb.train(self.xgb_params, dtrain, self.num_rounds,
                                    evals=[(dvalid, "eval"), (dtrain, "train")],
                                    early_stopping_rounds=self.early_stopping_rounds or None, verbose_eval=False,
                                    callbacks=callbacks)
                t2 = time.time()
        finally:
            if metrics is not None:
                metrics.close()  # every round's metrics written before the reply (and no thread left behind)
        if abort_signal.triggered:
            return make_reply(ReturnCode.TASK_ABORTED)
        model_path = run_dir / self.model_file_name
        if isinstance(getattr(loader, "schema", None), dict):  # the model carries its schema (for predictions)
            from ...data import Schema
            from ...xgb.model import attach_schema

            attach_schema(booster, Schema.from_dict(loader.schema), "vertical" if self.vertical else "horizontal",
                          spec["ranks"])
        booster.save_model(str(model_path))
        reply = make_reply(ReturnCode.OK)
        reply["rank"] = spec["rank"]
        reply["load_s"], reply["train_start"], reply["train_end"] = t1 - t0, t1, t2
        reply["rounds"] = int(booster.num_boosted_rounds())
        reply["n_train"] = int(dtrain.num_row())
        reply["model_sha256"] = _model_digest(booster)
        return reply


def public_training_error(exc: BaseException) -> str:
    """What the server is told of a failed training: XGBoost's own errors (the federated link, training state) in
    one line; a data error in its redacted form; anything else by its type only (a library's message may quote
    a cell or a local path; the full error is in the site's log)."""
    import xgboost as xgb

    if isinstance(exc, xgb.core.XGBoostError):
        return short_error(exc)
    return public_error(exc)


def _model_digest(booster) -> str:
    """sha256 of the trees and parameters (the raw JSON model), the same on every rank of a federated run."""
    return hashlib.sha256(bytes(booster.save_raw("json"))).hexdigest()


def _abort_callback(abort_signal):
    """An XGBoost callback that stops boosting after the current round once FLARE aborts the task."""
    import xgboost as xgb

    class StopOnAbort(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            return bool(abort_signal.triggered)

    return StopOnAbort()


def queued_metrics_callback(writer):
    """NVFlare's ``MetricsCallback`` (one ``writer.write`` per watched set and round), with the writes done by a
    thread of its own so the boosting loop never waits for FLARE's event machinery. ``close()`` writes what is
    queued and ends the thread; a failed write is dropped (metrics are for show, never a reason to fail training).
    """
    import queue

    import xgboost as xgb
    from nvflare.app_common.tracking.log_writer import LogWriter

    if not isinstance(writer, LogWriter):
        raise ProtocolError("the metrics writer component is not an NVFlare LogWriter")

    class QueuedMetrics(xgb.callback.TrainingCallback):
        def __init__(self):
            super().__init__()
            self._queue: queue.SimpleQueue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, daemon=True, name="xgb_metrics_writer")
            self._thread.start()

        def after_iteration(self, model, epoch, evals_log):
            records = [(f"{data}_metrics", {name: float(log[-1][0] if isinstance(log[-1], tuple) else log[-1])
                                            for name, log in metric.items()})
                       for data, metric in (evals_log or {}).items()]
            if records:
                self._queue.put((epoch, records))
            return False

        def close(self, timeout: float = 30.0) -> None:
            if self._thread.is_alive():
                self._queue.put(None)
                self._thread.join(timeout)

        def _drain(self) -> None:
            data_type = writer.get_default_metric_data_type()
            while (item := self._queue.get()) is not None:
                epoch, records = item
                for tag, record in records:
                    try:
                        writer.write(tag=tag, value=record, data_type=data_type, global_step=epoch)
                    except Exception:
                        pass

    return QueuedMetrics()
