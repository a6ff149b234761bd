"""Site side of the vertical packed-Paillier tree job: a thin shell over the party objects.

* the **active** site (labels + private key) answers ``vertical_step``: it feeds the replies
  the server routed to it into :meth:`ActiveParty.step` and returns the next messages;
* a **passive** site answers ``vertical_msg``: one message in, one reply out
  (:meth:`PassiveParty.handle`).

Data are read against the job's schema from the site's own binding (``local/treeflare_site.json``,
``$TREEFLARE_DATA_ROOT``; see ``site_config``), else from ``<data_root>/<site>/{train,test}.csv``; without a
schema in the job, from ``<data_root>`` as a federation folder with its ``partition.json``.  Each site writes
its own model file into its run folder.  What leaves a site (and so what the server sees): from the active
site, the public key,
ciphertexts, slot layouts, the row-to-node assignment of every layer, candidate ids, and the test
rows that reach each passive split; from a passive site, ciphertexts, candidate ids, partitions of
node rows and prediction bits for those test rows; and, from the active site at the end, the test
metrics and operation counts.  See SECURITY.md.

A passive site's limits (whatever the active site proposes) come from the executor's arguments or
the environment: ``$TREEFLARE_VERTICAL_MIN_KEY_BITS``, ``$TREEFLARE_VERTICAL_MIN_NODE_ROWS``,
``$TREEFLARE_VERTICAL_MAX_TREES``, ``$TREEFLARE_VERTICAL_MAX_DEPTH``.
"""
from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

import numpy as np

from ..data import DataError, Schema, read_site
from ..data.errors import public_error
from ..reporting import write_json_atomic
from ..vertical import (ActiveParty, PassiveParty, PassivePolicy, ProtocolError, VerticalParams, crypto_report,
                        metrics)
from ..vertical.packing import SlotOverflowError
from ..vertical.params import DEFAULT_MIN_ROWS_NODE, MAX_DEPTH, MAX_TREES
from .site_config import load_binding

STEP, MSG = "vertical_step", "vertical_msg"
DATA_ROOT_ENV = "TREEFLARE_DATA_ROOT"
MIN_KEY_BITS_ENV = "TREEFLARE_VERTICAL_MIN_KEY_BITS"
MIN_NODE_ROWS_ENV = "TREEFLARE_VERTICAL_MIN_NODE_ROWS"
MAX_TREES_ENV = "TREEFLARE_VERTICAL_MAX_TREES"
MAX_DEPTH_ENV = "TREEFLARE_VERTICAL_MAX_DEPTH"
ACTIVE_MODEL, PASSIVE_MODEL, ACTIVE_PRED = ("vertical_active_model.json", "vertical_passive_model.json",
                                            "vertical_active_predictions.json")


_WIRE_DTYPES = {"uint8", "int32", "int64", "float64"}
_ND = "__ndarray__"


def to_wire(obj):
    """numpy arrays -> {"__ndarray__": dtype, "shape": [...], "data": bytes}: plain msgpack types that
    travel inline with the task (FOBS would fetch each array in its own download transaction)."""
    if isinstance(obj, dict):
        return {k: to_wire(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_wire(v) for v in obj]
    if isinstance(obj, np.ndarray):
        if obj.dtype.name not in _WIRE_DTYPES:
            raise ProtocolError(f"array dtype {obj.dtype} may not cross the wire")
        a = np.ascontiguousarray(obj)
        return {_ND: a.dtype.name, "shape": [int(v) for v in a.shape], "data": a.astype(a.dtype.newbyteorder("<"),
                                                                                          copy=False).tobytes()}
    if isinstance(obj, np.generic):
        raise ProtocolError(f"numpy scalar {type(obj).__name__} may not cross the wire")
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(1 << 63) <= obj < (1 << 64):
        # FLARE's msgpack would fail while encoding the reply, after this executor returned
        raise ProtocolError("an integer beyond 64 bits may not cross the wire")
    return obj


def from_wire(obj, _depth=0):
    """Inverse of :func:`to_wire`, with checks: known dtypes only, size consistent with the shape,
    bounded nesting."""
    if _depth > 32:
        raise ProtocolError("message nested too deeply")
    if isinstance(obj, dict):
        if _ND in obj:
            dt, shape, data = obj.get(_ND), obj.get("shape"), obj.get("data")
            if dt not in _WIRE_DTYPES or not isinstance(shape, list) or not isinstance(data, (bytes, bytearray)):
                raise ProtocolError("malformed array on the wire")
            if len(shape) > 4 or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in shape):
                raise ProtocolError("malformed array shape on the wire")
            dtype = np.dtype(dt).newbyteorder("<")
            if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
                raise ProtocolError("array size does not match its shape")
            return np.frombuffer(data, dtype=dtype).astype(np.dtype(dt)).reshape(shape)
        return {k: from_wire(v, _depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [from_wire(v, _depth + 1) for v in obj]
    return obj


def _site_tables(data_root: str, site: str, schema: dict | None = None, fl_ctx=None):
    if schema is not None:  # this party's columns of the job's schema, from its own binding
        binding = load_binding(site, fl_ctx, data_root)
        schema = Schema.from_dict(schema)
        return tuple(binding.read(which, schema, site, own_columns=True) for which in ("train", "test"))
    root = os.environ.get(DATA_ROOT_ENV) or data_root
    if not root:
        raise DataError(f"{site}: no data root configured (executor data_root or ${DATA_ROOT_ENV})")
    sd = read_site(root, site)
    return sd.train, sd.test


class VerticalExecutor(Executor):
    def __init__(self, data_root: str = "", workers: int = 0, min_key_bits: int = 2048,
                 allow_mock: bool = False, min_node_rows: int = DEFAULT_MIN_ROWS_NODE,
                 max_trees: int = MAX_TREES, max_depth: int = MAX_DEPTH, schema: dict | None = None):
        """
        Args:
            data_root: folder with ``<site>/train.csv`` and ``test.csv``.
            schema: the job's schema (``Schema.to_dict()``); each party reads the columns its files hold.
            workers: processes for the crypto at this site (0 = all cores).
            min_key_bits: a passive site refuses a public key shorter than this
              (``$TREEFLARE_VERTICAL_MIN_KEY_BITS`` overrides it on the site).
            allow_mock: accept the plaintext mock scheme (oracle/testing only; never in production).
            min_node_rows: a passive site refuses a run whose minimum rows per node is lower, and never
              answers for a smaller node (``$TREEFLARE_VERTICAL_MIN_NODE_ROWS``).
            max_trees, max_depth: the largest model a passive site takes part in
              (``$TREEFLARE_VERTICAL_MAX_TREES``, ``$TREEFLARE_VERTICAL_MAX_DEPTH``).
        """
        super().__init__()
        self.data_root = data_root
        self.workers = int(workers)
        self.min_key_bits = int(min_key_bits)
        self.allow_mock = bool(allow_mock)
        self.min_node_rows = int(min_node_rows)
        self.max_trees = int(max_trees)
        self.max_depth = int(max_depth)
        self.schema = schema
        self.active: ActiveParty | None = None
        self.passive: PassiveParty | None = None
        self.active_test_y = None

    def execute(self, task_name: str, shareable: Shareable, fl_ctx, abort_signal) -> Shareable:
        site = fl_ctx.get_identity_name()
        try:
            if task_name == STEP:
                return self._step(site, shareable, fl_ctx)
            if task_name == MSG:
                return self._msg(site, shareable, fl_ctx)
            return make_reply(ReturnCode.TASK_UNKNOWN)
        except Exception as exc:  # noqa: BLE001 -- any failure becomes a reply, never a crash of the site
            # The full error (cell values, local paths) stays in this site's log; the server gets the redacted form.
            self.log_error(fl_ctx, f"{task_name} failed at {site}: {type(exc).__name__}: {exc}")
            self.log_debug(fl_ctx, traceback.format_exc())
            self._close()
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc, passthrough=(ProtocolError, SlotOverflowError))
            return reply

    def _close(self) -> None:
        """Stop this site's worker processes and forget the run (after a failure the job ends)."""
        for party in (self.active, self.passive):
            if party is not None:
                party.close()
        self.active = self.passive = None

    def _run_dir(self, fl_ctx) -> Path:
        return Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))

    # ------------------------------------------------------------------ active site
    def _step(self, site, task: Shareable, fl_ctx) -> Shareable:
        inbox = from_wire(task.get("inbox"))
        if self.active is None:
            params = VerticalParams.from_dict(dict(task["params"]))
            if self.workers:
                params.workers = self.workers
            passives = [str(p) for p in task["passives"]]
            train, test = _site_tables(self.data_root, site, self.schema, fl_ctx)
            X, names, _ = train.codes()
            Xt, _, _ = test.codes()
            y, self.active_test_y, n_classes = labels_for(params, train, test)
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
        a = self.active
        run_dir = self._run_dir(fl_ctx)
        write_json_atomic(run_dir / ACTIVE_MODEL, a.model())
        write_json_atomic(run_dir / ACTIVE_PRED, {"pred": a.test_pred, "score": a.test_score,
                                                  "ids": a.ids_test})
        reply["done"] = True
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

    # ------------------------------------------------------------------ passive site
    def _msg(self, site, task: Shareable, fl_ctx) -> Shareable:
        msg = from_wire(task.get("msg"))
        if not isinstance(msg, dict):
            raise ProtocolError("message is not a dict")
        if msg.get("type") == "setup":
            train, test = _site_tables(self.data_root, site, self.schema, fl_ctx)
            if train.y is not None:
                raise ProtocolError(f"{site} holds labels: it is the active site, not a passive one")
            X, names, _ = train.codes()
            Xt, _, _ = test.codes()
            if self.passive is not None:
                self.passive.close()
            policy = PassivePolicy(min_key_bits=int(os.environ.get(MIN_KEY_BITS_ENV) or self.min_key_bits),
                                   min_rows_node=int(os.environ.get(MIN_NODE_ROWS_ENV) or self.min_node_rows),
                                   max_trees=int(os.environ.get(MAX_TREES_ENV) or self.max_trees),
                                   max_depth=int(os.environ.get(MAX_DEPTH_ENV) or self.max_depth),
                                   allow_mock=self.allow_mock)
            self.passive = PassiveParty(site, X, Xt, names, ids_train=list(map(str, train.ids)),
                                        ids_test=list(map(str, test.ids)), workers=self.workers or os.cpu_count(),
                                        policy=policy)
        if self.passive is None:
            raise ProtocolError("message before setup")
        out = self.passive.handle(msg)
        if msg.get("type") == "finish":
            write_json_atomic(self._run_dir(fl_ctx) / PASSIVE_MODEL, self.passive.model())
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


def load_json(path) -> dict:
    return json.loads(Path(path).read_text())


__all__ = ["VerticalExecutor", "STEP", "MSG", "ACTIVE_MODEL", "PASSIVE_MODEL", "ACTIVE_PRED"]
