"""In-process driver (tests, oracle comparison, benchmark) and model utilities.

The driver only routes messages between the party objects, exactly as the FLARE controller
does between sites; it can record every message for the privacy tests.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..crypto import MIN_SECURE_BITS, native
from .active import ActiveParty
from .params import VerticalParams
from .passive import PassiveParty, PassivePolicy


@dataclass
class VerticalData:
    """Column blocks of the same rows (aligned on ids)."""
    X_active: np.ndarray
    y: np.ndarray
    X_passive: list                 # list of arrays, one per passive party
    X_active_test: np.ndarray
    y_test: np.ndarray
    X_passive_test: list
    names_active: list
    names_passive: list             # list of name lists
    n_classes: int
    ids_train: list | None = None
    ids_test: list | None = None
    class_names: list = field(default_factory=list)

    @property
    def passive_names(self):
        return [f"site-{i + 2}" for i in range(len(self.X_passive))]


def make_parties(data: VerticalData, params: VerticalParams, active_name="site-1",
                 passive_names=None, min_key_bits=None, key_holder=None, policy: PassivePolicy | None = None):
    """The parties of one run.  The passives' policy defaults to accepting what ``params`` asks
    (tests pass a stricter one)."""
    passive_names = passive_names or data.passive_names
    if min_key_bits is None:
        min_key_bits = params.key_bits if params.allow_insecure_key else MIN_SECURE_BITS
    if policy is None:
        policy = PassivePolicy(min_key_bits=min_key_bits, min_rows_node=params.min_rows_node,
                               allow_mock=params.scheme == "mock")
    active = ActiveParty(active_name, data.X_active, data.y, data.X_active_test, data.names_active,
                         data.n_classes, passive_names, params, data.ids_train, data.ids_test,
                         key_holder=key_holder)
    passives = {
        nm: PassiveParty(nm, X, Xt, names, data.ids_train, data.ids_test, workers=params.n_workers,
                         min_key_bits=min_key_bits, allow_mock=params.scheme == "mock", policy=policy)
        for nm, X, Xt, names in zip(passive_names, data.X_passive, data.X_passive_test,
                                    data.names_passive)}
    return active, passives


def run_protocol(active: ActiveParty, passives: dict, record: list | None = None) -> ActiveParty:
    """Route messages until the active party is done.  record: list of (src, dst, msg)."""
    out = active.step(None)
    while out is not None:
        replies = {}
        for p, msg in out.items():
            if record is not None:
                record.append((active.name, p, msg))
            r = passives[p].handle(msg)
            if record is not None:
                record.append((p, active.name, r))
            replies[p] = r
        out = active.step(replies)
    return active


def run_vertical(data: VerticalData, params: VerticalParams, record=None, key_holder=None):
    t = time.perf_counter()
    active, passives = make_parties(data, params, key_holder=key_holder)
    try:
        run_protocol(active, passives, record)
    finally:
        close_parties(active, passives)
    active.timings["total"] = time.perf_counter() - t
    return active, passives


def close_parties(active, passives) -> None:
    """Stop every worker process of a run (normally done when the protocol finishes)."""
    active.close()
    for p in passives.values():
        p.close()


def run_oracle(data: VerticalData, params: VerticalParams):
    """The plaintext oracle: the same protocol on the same quantised integers, mock cipher."""
    return run_vertical(data, replace(params, scheme="mock", workers=1))


# ---------------------------------------------------------------------------------- models
def joint_model(active_model: dict, passive_models: dict) -> list:
    """Trees with every split resolved to (owner, feature, bin, threshold): only possible
    with all parties' models together (used for the oracle comparison, never on a site)."""
    trees = []
    for tree in active_model["trees"]:
        nodes = []
        for nd in tree["nodes"]:
            nd = dict(nd)
            sid = nd.pop("split_id", None)
            if sid is not None:
                s = passive_models[nd["owner"]]["splits"][sid]
                nd.update(feature=s["feature"], feature_index=s["feature_index"], bin=s["bin"],
                          threshold=s["threshold"])
            nodes.append(nd)
        trees.append(nodes)
    return trees


def canonical(active: ActiveParty, passives: dict) -> str:
    jm = joint_model(active.model(), {p: q.model() for p, q in passives.items()})
    return json.dumps(jm, sort_keys=True)


def compare_runs(a, b) -> dict:
    """a, b: (active, passives) of two runs.  Identical trees (owner, feature, bin, threshold,
    leaf values) and identical test predictions?"""
    (aa, ap), (ba, bp) = a, b
    same_tree = canonical(aa, ap) == canonical(ba, bp)
    same_pred = bool(np.array_equal(aa.test_pred, ba.test_pred)
                     and np.array_equal(np.asarray(aa.test_score), np.asarray(ba.test_score)))
    return {"identical": bool(same_tree and same_pred), "same_tree": bool(same_tree),
            "same_predictions": same_pred}


def metrics(y_true, pred, score, n_classes, objective: str | None = None) -> dict:
    """Classification: :func:`treeflare.metrics.classification_metrics` (accuracy, macro-F1, AUC and log loss
    for 2 classes, multiclass log loss); regression (``objective="squared_error"``): RMSE, MAE, R^2."""
    # imported here: scikit-learn takes seconds to import, and the crypto worker processes import this package
    from sklearn.metrics import mean_absolute_error, r2_score

    from ..metrics import classification_metrics
    if objective != "squared_error":
        return classification_metrics(y_true, pred, score, n_classes)
    y, p = np.asarray(y_true, dtype=np.float64), np.asarray(pred, dtype=np.float64)
    return {"rmse": float(np.sqrt(np.mean((y - p) ** 2))), "mae": float(mean_absolute_error(y, p)),
            "r2": float(r2_score(y, p)) if len(y) > 1 else None}


def crypto_report(active: ActiveParty) -> dict:
    ops = active.ops()
    c = active.comm
    li = active.layout_info
    return {"scheme": active.kh.public.scheme, "obfuscation": active.params.obfuscation,
            "encryptions": int(ops.get("encryptions", 0)), "decryptions": int(ops.get("decryptions", 0)),
            "additions": int(ops.get("additions", 0)), "shifts": int(ops.get("shifts", 0)),
            "ciphertexts_to_passive": int(c["ciphertexts_to_passive"]),
            "ciphertexts_to_active": int(c["ciphertexts_to_active"]),
            "bytes_to_passive": int(c["bytes_to_passive"]), "bytes_to_active": int(c["bytes_to_active"]),
            "messages": int(c["messages_to_passive"] + c["messages_to_active"]),
            "key_bits": int(active.kh.public.key_bits),
            "values_per_ciphertext": int(li.get("values_per_ciphertext", 1)),
            "units_per_row": int(li.get("units_per_row", 1)),
            "slot_widths": li.get("widths"), "packing": li.get("packing"), "compress": li.get("compress"),
            # whether the key holder's encryptions ran in the C kernel (same integers either way)
            "native_kernel": native.status() if active.kh.public.scheme in ("paillier", "ou") else None}


# ---------------------------------------------------------------------------- synthetic data
def synthetic(n=400, n_test=200, active_features=2, passive_features=(3,), n_classes=2, seed=0,
              ties=False, extreme=False, regression_scale=None) -> VerticalData:
    """Labels depend on columns of every party; optional duplicate columns across parties
    (exact ties) and extreme values / constant columns.  ``regression_scale``: a real-valued
    target of that magnitude instead of classes."""
    rng = np.random.default_rng(seed)
    n_all = n + n_test
    blocks = [rng.normal(size=(n_all, active_features))]
    for k in passive_features:
        blocks.append(rng.normal(size=(n_all, k)))
    if ties:
        for b in blocks[1:]:
            b[:, 0] = blocks[0][:, 0]          # a passive column equal to an active one
    z = sum(b[:, : min(2, b.shape[1])].sum(axis=1) * (j + 1) for j, b in enumerate(blocks))
    z = z + 0.5 * rng.normal(size=n_all)
    if extreme:
        blocks[0][:, -1] = 0.0                  # constant column
        for b in blocks[1:]:
            b[: n_all // 3, -1] = 1e300
            b[n_all // 3: n_all // 2, -1] = -1e300
    if regression_scale is not None:
        y = z * float(regression_scale)
        n_classes = 0
    else:
        qs = np.quantile(z, np.linspace(0, 1, n_classes + 1)[1:-1])
        y = np.searchsorted(qs, z).astype(np.int64)
    tr, te = slice(0, n), slice(n, n_all)
    return VerticalData(
        X_active=blocks[0][tr], y=y[tr], X_passive=[b[tr] for b in blocks[1:]],
        X_active_test=blocks[0][te], y_test=y[te], X_passive_test=[b[te] for b in blocks[1:]],
        names_active=[f"a{j}" for j in range(active_features)],
        names_passive=[[f"p{i}_{j}" for j in range(k)] for i, k in enumerate(passive_features)],
        n_classes=n_classes, ids_train=list(range(n)), ids_test=list(range(n, n_all)))
