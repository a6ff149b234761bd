"""Site side of the vertical packed-Paillier tree job: a thin shell over the party objects.

* the **active** site (labels + private key) answers ``vertical_step``: it feeds the replies
  the server routed to it into :meth:`ActiveParty.step` and returns the next messages;
* a **passive** site answers ``vertical_msg``: one message in, one reply out
  (:meth:`PassiveParty.handle`).

Data are read against the job's schema from the site's own binding (``local/treeflare_site.json``,
``$TREEFLARE_DATA_ROOT``; see ``site_config``), else from ``<data_root>/<site>/{train,test}.csv``; without a
schema in the job, from ``<data_root>`` as a federation folder with its ``partition.json``.  The job's PSI phase
(``treeflare.flare.psi``) ran first and left this site's share of the intersection in its own run folder
(``psi/intersection.json``): the site keeps only those rows, sorted by id (``data.intersection.restrict``), so
row i is the same customer at every party without any order crossing the wire.  Each site writes its own model
file into its run folder (with the schema of its own columns).

A prediction run (the controller's ``mode="predict"``) trains nothing: each site loads its own model part and its
new rows from its binding (``vertical_model``, ``predict``: by default ``vertical_<role>_model.json`` and
``predict.csv`` in its data folder), keeps the rows the prediction run's PSI phase found at every party, and
runs :mod:`treeflare.vertical.prediction`; the active site writes ``vertical_predictions.csv`` (the rows it could
score) into its run folder and the server gets counts (rows scored, the active site's rows left unscored) and the
model's fingerprint.

What leaves a site in training (and so what the server sees): from the active site, the public key, ciphertexts,
slot layouts, the row-to-node assignment of every layer, candidate ids, and the test
rows that reach each passive split; from a passive site, ciphertexts, candidate ids, partitions of
node rows and prediction bits for those test rows; and, from the active site at the end, the test
metrics and operation counts.  See SECURITY.md.

A passive site's limits (whatever the active site proposes) come from the executor's arguments or
the environment: ``$TREEFLARE_VERTICAL_MIN_KEY_BITS``, ``$TREEFLARE_VERTICAL_MIN_NODE_ROWS``,
``$TREEFLARE_VERTICAL_MAX_TREES``, ``$TREEFLARE_VERTICAL_MAX_DEPTH``.  A site's crypto workers (local processes,
or its own Dask cluster: ``dask://HOST:PORT``, ``dask-local:N``) come from ``$TREEFLARE_VERTICAL_WORKERS`` where
set, else the executor's ``workers``, else (the active site) the task's.  The cluster that receives the private key
or a party's rows is the party's choice alone: a Dask scheduler address is taken only from the site's environment;
the job's executor configuration and the server's task may ask for a number of processes or ``dask-local:N``, and a
``dask://`` there is refused; the model file records such an address as ``"site"``.
"""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

import numpy as np

from ...crypto.packing import SlotOverflowError
from ...crypto.workers import parse_workers
from ...data import DataError, Schema, read_site
from ...data.csv_io import party_rows_table
from ...data.intersection import read_intersection, restrict
from ...files import csv_text, write_json_atomic, write_text_atomic
from ...vertical import (ActiveParty, PassiveParty, PassivePolicy, ProtocolError, VerticalParams, crypto_report,
                         metrics)
from ...vertical.model_parts import ACTIVE_MODEL, MAX_MODEL_BYTES, PASSIVE_MODEL
from ...vertical.params import DEFAULT_MIN_ROWS_NODE, MAX_DEPTH, MAX_PREDICT_ROWS, MAX_TREES
from ...vertical.prediction import (ActivePredictor, ModelPartError, PassivePredictor, check_active_model,
                                    check_passive_model, model_id, predictions_frame)
from ..psi.protocol import intersection_dir
from ..site_config import DATA_ROOT_ENV, load_binding
from ..site_executor import SiteExecutor
from .protocol import MSG, STEP, from_wire, to_wire

MIN_KEY_BITS_ENV = "TREEFLARE_VERTICAL_MIN_KEY_BITS"
MIN_NODE_ROWS_ENV = "TREEFLARE_VERTICAL_MIN_NODE_ROWS"
MAX_TREES_ENV = "TREEFLARE_VERTICAL_MAX_TREES"
MAX_DEPTH_ENV = "TREEFLARE_VERTICAL_MAX_DEPTH"
MAX_PREDICT_ROWS_ENV = "TREEFLARE_VERTICAL_MAX_PREDICT_ROWS"
WORKERS_ENV = "TREEFLARE_VERTICAL_WORKERS"
ACTIVE_PRED = "vertical_active_predictions.json"
PREDICTIONS = "vertical_predictions.csv"    # a prediction run's output, at the active site only


def _site_tables(data_root: str, site: str, schema: dict | None = None, fl_ctx=None, binding_name: str = ""):
    if schema is not None:  # this party's columns of the job's schema, from its own binding
        binding = load_binding(site, fl_ctx, data_root, name=binding_name)
        schema = Schema.from_dict(schema)
        return tuple(binding.read(which, schema, site, own_columns=True) for which in ("train", "test"))
    root = os.environ.get(DATA_ROOT_ENV) or data_root
    if not root:
        raise DataError(f"{site}: no data root configured (executor data_root or ${DATA_ROOT_ENV})")
    sd = read_site(root, site)
    return sd.train, sd.test


def kept_rows(table, run_dir, site: str, kind: str):
    """``table`` restricted to this site's share of the PSI intersection of ``kind`` (kept in its run folder by the
    job's PSI phase), sorted by id; with the number of its rows the intersection left out."""
    kept = read_intersection(intersection_dir(run_dir), site=site).get(kind, [])
    rows = restrict(table, kept, site=site, kind=kind)
    if len(rows) == 0:  # PSI's minimum refuses this first; a hand-edited file must not start a run on no rows
        raise DataError(f"{site}: the intersection holds none of its {kind} rows", site=site,
                        problem=f"no {kind} rows in the intersection")
    return rows, len(table) - len(rows)


class VerticalExecutor(SiteExecutor):
    PUBLIC_ERRORS = (ProtocolError, SlotOverflowError, ModelPartError)

    def __init__(self, data_root: str = "", workers: int | str = 0, min_key_bits: int = 2048,
                 allow_mock: bool = False, min_node_rows: int = DEFAULT_MIN_ROWS_NODE,
                 max_trees: int = MAX_TREES, max_depth: int = MAX_DEPTH, schema: dict | None = None,
                 max_predict_rows: int = MAX_PREDICT_ROWS, binding: str = "", raw_text: bool = False):
        """
        Args:
            data_root: folder with ``<site>/train.csv`` and ``test.csv``.
            binding: the name of the site binding to read ("" the default one; see site_config).
            schema: the job's schema (``Schema.to_dict()``); each party reads the columns its files hold.
            workers: the crypto workers at this site: processes (0 = all cores) or ``dask-local:N``
              (``$TREEFLARE_VERTICAL_WORKERS`` overrides it on the site, and only it may name a Dask scheduler
              ``dask://HOST:PORT``: this argument is the job's, the submitter's word).
            min_key_bits: a passive site refuses a public key shorter than this
              (``$TREEFLARE_VERTICAL_MIN_KEY_BITS`` overrides it on the site).
            allow_mock: accept the plaintext mock scheme (oracle/testing only; never in production).
            min_node_rows: a passive site refuses a run whose minimum rows per node is lower, and never
              answers for a smaller node (``$TREEFLARE_VERTICAL_MIN_NODE_ROWS``).
            max_trees, max_depth: the largest model a passive site takes part in
              (``$TREEFLARE_VERTICAL_MAX_TREES``, ``$TREEFLARE_VERTICAL_MAX_DEPTH``).
            max_predict_rows: the most rows a passive site answers prediction requests about in one run, test rows
              of a training run or new rows of a prediction run (``$TREEFLARE_VERTICAL_MAX_PREDICT_ROWS``).
            raw_text: a prediction run writes its CSV's text cells (ids, classes) as they are, without the leading
              ' that keeps a cell starting with = + - @, a tab or a carriage return from running as a formula in
              a spreadsheet (``files.spreadsheet_safe``).
        """
        super().__init__()
        self.data_root = data_root
        self.binding = binding
        self.workers = parse_workers(workers, "VerticalExecutor workers", allow_address=False)
        self.min_key_bits = int(min_key_bits)
        self.allow_mock = bool(allow_mock)
        self.min_node_rows = int(min_node_rows)
        self.max_trees = int(max_trees)
        self.max_depth = int(max_depth)
        self.max_predict_rows = int(max_predict_rows)
        self.raw_text = bool(raw_text)
        self.schema = schema
        self.active: ActiveParty | ActivePredictor | None = None
        self.passive: PassiveParty | PassivePredictor | None = None
        self.active_test_y = None
        self.own_schema: Schema | None = None   # this party's columns (training), or its model part's (prediction)
        self.unscored = 0                       # a prediction run: this site's new rows outside the intersection

    def handlers(self) -> dict:
        return {STEP: self._step, MSG: self._msg}

    def failed(self, fl_ctx) -> None:
        self.log_debug(fl_ctx, traceback.format_exc())
        self._close()

    def _close(self) -> None:
        """Stop this site's worker processes and forget the run (after a failure the job ends)."""
        for party in (self.active, self.passive):
            if party is not None:
                party.close()
        self.active = self.passive = None

    def _run_dir(self, fl_ctx) -> Path:
        return Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))

    def _psi_tables(self, site, fl_ctx):
        """This site's train and test tables (read and checked first), restricted to its share of the
        intersection (see the module's docstring)."""
        train, test = _site_tables(self.data_root, site, self.schema, fl_ctx, self.binding)
        run_dir = self._run_dir(fl_ctx)
        return kept_rows(train, run_dir, site, "train")[0], kept_rows(test, run_dir, site, "test")[0]

    # ------------------------------------------------------------------ active site
    def _step(self, site, task: Shareable, fl_ctx) -> Shareable:
        inbox = from_wire(task.get("inbox"))
        if self.active is None:
            if task.get("mode") == "predict":
                model, X, ids = self._prediction_part(site, fl_ctx, ACTIVE_MODEL, check_active_model)
                self.active = ActivePredictor(site, model, X, ids)
            else:
                params = self._active_params(task["params"])
                passives = [str(p) for p in task["passives"]]
                train, test = self._psi_tables(site, fl_ctx)
                X, names, _ = train.codes()
                Xt, _, _ = test.codes()
                y, self.active_test_y, n_classes = labels_for(params, train, test)
                self.own_schema = train.schema
                self.active = ActiveParty(site, X, y, Xt, names, n_classes, passives,
                                          params, ids_train=list(map(str, train.ids)),
                                          ids_test=list(map(str, test.ids)))
            inbox = None
        elif not isinstance(inbox, dict):
            raise ProtocolError("step without an inbox")
        out = self.active.step(inbox or None)
        reply = make_reply(ReturnCode.OK)
        if out is not None:
            reply["outbox"] = to_wire(out)
            reply["done"] = False
            return reply
        reply["done"] = True
        if isinstance(self.active, ActivePredictor):
            reply["result"] = to_wire(self._predictions_done(self.active, fl_ctx))
            self.active = None
            return reply
        a = self.active
        run_dir = self._run_dir(fl_ctx)
        # the party's own columns' schema travels with its model part: a prediction run reads new rows with it
        # the params as recorded: a site's own Dask scheduler address is not written down
        write_json_atomic(run_dir / ACTIVE_MODEL, {**a.model(), "params": a.params.to_record(),
                                                   "schema": self.own_schema.to_dict()})
        write_json_atomic(run_dir / ACTIVE_PRED, {"pred": a.test_pred, "score": a.test_score,
                                                  "ids": a.ids_test})
        reply["result"] = to_wire({
            "objective": a.objective.name if a.objective else None,
            "global": metrics(self.active_test_y, a.test_pred, a.test_score, a.n_classes,
                              a.objective.name if a.objective else None),
            "crypto": crypto_report(a), "layout": a.layout_info,
            "timings_s": {k: float(v) for k, v in a.timings.items()},
            "passive_timings_s": {p: st.get("timings_s", {}) for p, st in a.passive_stats.items()},
            "n_train": int(a.n), "n_test": int(len(a.X_test)), "n_classes": int(a.n_classes),
            "n_trees": len(a.trees),
            "n_splits": {"active": sum(1 for t in a.trees for nd in t["nodes"]
                                       if not nd["leaf"] and nd["owner"] == a.name),
                         "passive": sum(1 for t in a.trees for nd in t["nodes"]
                                        if not nd["leaf"] and nd["owner"] != a.name)},
        })
        self.active = None
        return reply

    # ------------------------------------------------------------------ prediction runs
    def _prediction_part(self, site, fl_ctx, default_name, check):
        """(model part, features, ids) of this site for a prediction run: its model part and its new rows, both
        from its own binding (``vertical_model``, ``predict``; see site_config). Nothing of either is sent."""
        binding = load_binding(site, fl_ctx, self.data_root, name=self.binding)
        path = binding.model_path(default_name)
        if not path.is_file():
            raise DataError(f"{site}: {path}: this site's part of the vertical model not found (put the training "
                            f"run's {default_name} there, or name it with 'vertical_model' in the site's binding)",
                            site=site, file=path, problem="this site's part of the vertical model not found")
        if path.stat().st_size > MAX_MODEL_BYTES:
            raise DataError(f"{site}: {path}: larger than {MAX_MODEL_BYTES} bytes", site=site, file=path,
                            problem="this site's model part is too large")
        try:
            model = check(json.loads(path.read_text()), site)
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a 5,000-digit integer, deep nesting
            raise DataError(f"{site}: {path}: not valid JSON ({exc})", site=site, file=path,
                            problem="this site's model part is not valid JSON") from None
        if not isinstance(model.get("schema"), dict):
            raise ModelPartError(f"{default_name} holds no schema of this party's columns (written by an older "
                                 "version): train again to predict with it")
        schema = Schema.from_dict(model["schema"])
        if schema.feature_names != model["features"]:
            raise ModelPartError(f"{default_name}: its schema's columns differ from its features")
        raw = binding.read_raw("predict", site, None, schema.id_column)   # new rows need no label
        rows = party_rows_table(raw, schema, file=os.fspath(binding.path("predict")), site=site, name=site)
        rows, self.unscored = kept_rows(rows, self._run_dir(fl_ctx), site, "predict")
        self.own_schema = schema
        X, _, _ = rows.codes()
        return model, X, list(map(str, rows.ids))

    def _predictions_done(self, a: ActivePredictor, fl_ctx) -> dict:
        """Write the predictions into this site's run folder; the server gets counts and the model's fingerprint
        only, never a prediction."""
        frame = predictions_frame(a.row_ids, self.own_schema.id_column, a.pred, a.score, a.model,
                                  self.own_schema.classes)
        write_text_atomic(self._run_dir(fl_ctx) / PREDICTIONS, csv_text(frame, raw_text=self.raw_text))
        m = a.model
        # n_unscored: the active site's new rows that some party does not hold (PSI left them out); a count the
        # server learns from the PSI phase anyway
        return {"mode": "predict", "n_rows": int(a.n), "n_unscored": int(self.unscored), "model_id": model_id(m),
                "model": m["model"], "objective": m.get("objective") if m["model"] == "gbdt" else None,
                "n_trees": len(a.trees),
                "passive_sites": list(a.passives), "messages": int(a.comm["messages_to_passive"]
                                                                    + a.comm["messages_to_active"]),
                "timings_s": {k: float(v) for k, v in a.timings.items()}}

    def _site_workers(self):
        """This site's crypto workers: its environment (which alone may name a Dask scheduler) overrides the job's
        executor argument."""
        env = os.environ.get(WORKERS_ENV, "").strip()
        return parse_workers(env, WORKERS_ENV) if env else self.workers

    def _active_params(self, task_params) -> VerticalParams:
        """The server's parameters with this site's workers: the task's ``workers`` (the submitter's word) may be a
        number of processes or ``dask-local:N``, used only where the site sets none of its own."""
        if not isinstance(task_params, dict):
            raise ProtocolError("params is not a dict")
        params = VerticalParams.from_dict(dict(task_params))
        try:
            params.workers = parse_workers(params.workers, "params.workers", allow_address=False)
        except ValueError as exc:
            raise ProtocolError(str(exc)) from None
        own = self._site_workers()
        if os.environ.get(WORKERS_ENV, "").strip() or own:
            params.workers = own
        return params

    # ------------------------------------------------------------------ passive site
    def _policy(self) -> PassivePolicy:
        """This site's limits: its environment overrides the job's executor arguments."""
        return PassivePolicy(min_key_bits=int(os.environ.get(MIN_KEY_BITS_ENV) or self.min_key_bits),
                             min_rows_node=int(os.environ.get(MIN_NODE_ROWS_ENV) or self.min_node_rows),
                             max_trees=int(os.environ.get(MAX_TREES_ENV) or self.max_trees),
                             max_depth=int(os.environ.get(MAX_DEPTH_ENV) or self.max_depth),
                             max_predict_rows=int(os.environ.get(MAX_PREDICT_ROWS_ENV) or self.max_predict_rows),
                             allow_mock=self.allow_mock)

    def _msg(self, site, task: Shareable, fl_ctx) -> Shareable:
        msg = from_wire(task.get("msg"))
        if not isinstance(msg, dict):
            raise ProtocolError("message is not a dict")
        if msg.get("type") in ("setup", "predict_setup") and self.passive is not None:
            self.passive.close()
            self.passive = None
        if msg.get("type") == "setup":
            train, test = self._psi_tables(site, fl_ctx)
            if train.y is not None:
                raise ProtocolError(f"{site} holds labels: it is the active site, not a passive one")
            X, names, _ = train.codes()
            Xt, _, _ = test.codes()
            self.own_schema = train.schema
            self.passive = PassiveParty(site, X, Xt, names, ids_train=list(map(str, train.ids)),
                                        ids_test=list(map(str, test.ids)),
                                        workers=self._site_workers() or os.cpu_count(),
                                        policy=self._policy())
        elif msg.get("type") == "predict_setup":
            model, X, ids = self._prediction_part(site, fl_ctx, PASSIVE_MODEL, check_passive_model)
            self.passive = PassivePredictor(site, model, X, ids, policy=self._policy())
        if self.passive is None:
            raise ProtocolError("message before setup")
        out = self.passive.handle(msg)
        if msg.get("type") == "finish":
            if isinstance(self.passive, PassiveParty):
                write_json_atomic(self._run_dir(fl_ctx) / PASSIVE_MODEL,
                                  {**self.passive.model(), "schema": self.own_schema.to_dict()})
            self.passive = None
        reply = make_reply(ReturnCode.OK)
        reply["msg"] = to_wire(out)
        return reply


def labels_for(params, train, test):
    """(training labels, test labels, number of classes) as the model needs them: class indices, or
    real values for a regression (the label column's values read as numbers)."""
    if params.model == "gbdt" and params.objective == "squared_error":
        def values(t):
            try:
                return np.array([float(v) for v in t.y], dtype=np.float64)
            except ValueError:
                raise DataError(f"label column {t.schema.label!r} is not numeric: a regression needs numbers") from None
        return values(train), values(test), 0
    return train.y_codes(), test.y_codes(), len(train.schema.classes)


__all__ = ["VerticalExecutor", "labels_for", "kept_rows", "ACTIVE_PRED", "PREDICTIONS"]
