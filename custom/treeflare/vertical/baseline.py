"""Centralised XGBoost on the joined columns, with the vertical GBDT's settings: the accuracy a
single party holding every column would get (simulation only: it needs every party's data)."""
from __future__ import annotations

import time

import numpy as np

from .driver import metrics

_XGB_OBJECTIVE = {"binary": "binary:logistic", "softmax": "multi:softprob", "squared_error": "reg:squarederror"}


def xgboost_baseline(data, params, seed: int = 0) -> dict:
    """Same trees, depth, bins, learning rate, lambda and min_child_weight; ``hist`` trees; softmax as
    one multi-output tree per round (``multi_strategy="multi_output_tree"``), as the vertical job builds."""
    import xgboost as xgb

    P = params
    X = np.hstack([data.X_active, *data.X_passive])
    Xt = np.hstack([data.X_active_test, *data.X_passive_test])
    kw = dict(n_estimators=P.n_trees, max_depth=P.max_depth, max_bin=P.bins, learning_rate=P.learning_rate,
              reg_lambda=P.reg_lambda, min_child_weight=P.min_child_weight, tree_method="hist",
              objective=_XGB_OBJECTIVE[P.objective], n_jobs=1, random_state=seed)
    t = time.perf_counter()
    if P.objective == "squared_error":
        model = xgb.XGBRegressor(**kw)
        model.fit(X, np.asarray(data.y, dtype=np.float64))
        pred = model.predict(Xt)
        score = pred
    else:
        if P.objective == "softmax":
            kw["multi_strategy"] = "multi_output_tree"
        model = xgb.XGBClassifier(**kw)
        model.fit(X, np.asarray(data.y, dtype=np.int64))
        score = model.predict_proba(Xt)
        pred = np.argmax(score, axis=1)
    seconds = time.perf_counter() - t
    out = metrics(data.y_test, pred, score, data.n_classes, P.objective)
    return {"library": f"xgboost {xgb.__version__}", "seconds": seconds,
            "settings": {k: v for k, v in kw.items() if k not in ("n_jobs", "random_state")}, "global": out}
