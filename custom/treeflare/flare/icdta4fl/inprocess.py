"""The ICDTA4FL job's own protocol run in one process, every task and reply through NVFlare's serializer (FOBS), as
the job sends them: what tests, benchmarks and tools run instead of a copy of the workflow."""

from __future__ import annotations

import numpy as np
from nvflare.apis.shareable import Shareable
from nvflare.app_common.decomposers import common_decomposers
from nvflare.fuel.utils import fobs

from ...data.federation import site_name
from ...icdta4fl.driver import run_protocol, schema_for_arrays
from ...icdta4fl.server import ICDTA4FLServer
from ...icdta4fl.site import ArrayLoader, SiteProtocol

__all__ = ["fobs_wire", "run_in_process"]

common_decomposers.register()


def fobs_wire(message: dict) -> dict:
    """What arrives at the other end of FLARE."""
    return dict(fobs.loads(fobs.dumps(Shareable(message))))


def run_in_process(sites, *, algorithm, classes, feature_kinds=None, feature_names=None, n_categories=None,
                   category_names=None, local_params=None, statistic="percentile", q=75.0, score="clipped_mean",
                   aggregate_params=None, X_global_test=None, y_global_test=None, refine_rounds=0,
                   refine_objective=None, refine_epsilon=None, refine_adopt=None, refine_from=None, schema=None, min_clients=1,
                   wire=fobs_wire,
                   record=None, handlers=None, identities=None, job_id="in-process", allowed_sites=None) -> dict:
    """The job's protocol over ``sites`` (dicts of encoded ``X_train, y_train, X_test, y_test``, named site-1, ...).

    ``schema``: the run's schema (the arrays are its encoding for ``algorithm``); without one, a schema is made from
    the matrix's kinds (``driver.schema_for_arrays``). ``handlers``/``identities``: site name -> a hostile handler /
    its ``secagg.SiteIdentity``. Returns the job's ``result`` and, as tools read them: the local tree dicts, the
    peer-score matrices, the selection and thresholds, the one-round ``model`` and its ``stats``, the global-test
    scores, and with ``refine_rounds`` the ``refined`` tree, its start, history and adoption decisions.
    """
    X0 = np.asarray(sites[0]["X_train"])
    kinds = list(feature_kinds) if feature_kinds is not None else ["numeric"] * X0.shape[1]
    if schema is None:
        schema = schema_for_arrays(classes=classes, feature_kinds=kinds, feature_names=feature_names,
                                   n_categories=n_categories, category_names=category_names)
    # refine_rounds None: the start's default rounds (``grow.DEFAULT_ROUNDS``); 0: no refinement
    refine_params = {} if refine_rounds is None else {"rounds": int(refine_rounds)}
    if refine_from is not None:
        refine_params["grow_from"] = refine_from
    if refine_objective is not None:
        refine_params["objective"] = refine_objective
    if refine_epsilon is not None:
        refine_params["epsilon"] = refine_epsilon
    if refine_adopt is not None:
        refine_params["adopt"] = refine_adopt
    server = ICDTA4FLServer(schema, algorithm, local_params=dict(local_params or {}),
                            selection={"statistic": statistic, "q": q, "score": score},
                            aggregation=dict(aggregate_params or {}), refine_params=refine_params,
                            min_clients=min_clients)
    names = [site_name(i) for i in range(len(sites))]
    protocols = {n: SiteProtocol(n, ArrayLoader(s["X_train"], s["y_train"], s["X_test"], s["y_test"]),
                                 job_id=job_id, identity=(identities or {}).get(n), allowed_sites=allowed_sites)
                 for n, s in zip(names, sites)}
    test = None if X_global_test is None else (np.asarray(X_global_test, dtype=np.float64),
                                               np.asarray(y_global_test, dtype=np.int64))
    notes = []
    kit = next(iter((identities or {}).values()), None)  # with kits, the server checks signatures as sites do
    verify = None if kit is None else {"job_id": job_id, "root_ca": kit.root_ca, "server_names": kit.server_names}
    result, model, one_round = run_protocol(server, protocols, server_test=test, wire=wire, record=record,
                                            notes=notes, handlers=handlers, verify=verify)
    order = result["sites_trained"]
    stats = result["aggregation"]
    out = {"result": result, "notes": notes, "sites": order, "model": one_round, "final_model": model,
           "trees": [result["local_trees"][s] for s in order], "accuracy": result["peer_scores"]["accuracy"],
           "macro_f1": result["peer_scores"]["macro_f1"], "selected": stats["selected"],
           "thresholds": result["thresholds"], "stats": stats, "timings_s": result["timings_s"]}
    if test is not None:
        out["global"] = {k: result["one_round"][k] for k in ("accuracy", "macro_f1")}
        base = result["baselines"]["local_on_global_test"]
        out["local_on_global_test"] = {m: [base[s][m] for s in order] for m in ("accuracy", "macro_f1")}
    if refine_rounds is None or refine_rounds:
        info = result["refinement"]
        start = info.get("start_site")
        out["refined"] = {"tree": model.tree_, "start": "one_round" if start is None else order.index(start),
                          "why": info.get("start"), "history": info["history"],
                          "adoption": info["adoption"], "status": info.get("status")}
    return out
