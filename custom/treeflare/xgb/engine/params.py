"""The engine's boosting parameters, under XGBoost's names, checked where they arrive (the server's plan is checked
by every site against the same bounds)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from ...trees.validate import PayloadError, check_int, check_number

OBJECTIVES = ("binary:logistic", "multi:softprob", "reg:squarederror")
EVAL_METRICS = {"binary:logistic": "logloss", "multi:softprob": "mlogloss", "reg:squarederror": "rmse"}
MAX_ROUNDS = 10_000
MAX_DEPTH = 16  # depth-wise growth asks one aggregation per level: 2^16 nodes a level is far past any useful tree
MAX_BIN = 1024
MAX_CLASSES = 1000


@dataclass(frozen=True)
class BoostParams:
    """XGBoost's parameters of the hist tree method that the engine implements (same meaning, same defaults)."""

    objective: str = "binary:logistic"
    num_class: int = 0  # K for multi:softprob, 0 otherwise (XGBoost's convention)
    rounds: int = 50
    max_depth: int = 6
    eta: float = 0.3
    reg_lambda: float = 1.0
    reg_alpha: float = 0.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    max_delta_step: float = 0.0
    max_bin: int = 256
    base_score: float | None = None  # None: estimated from the pooled labels (mean; 0.5 for multi:softprob)
    early_stopping_rounds: int = 0  # 0 = off; on the sites' validation rows, pooled

    def __post_init__(self):
        check(self.to_dict(), error=ValueError)

    @property
    def groups(self) -> int:
        """Trees per round: one per class for multi:softprob, else one."""
        return self.num_class if self.objective == "multi:softprob" else 1

    @property
    def eval_metric(self) -> str:
        return EVAL_METRICS[self.objective]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> "BoostParams":
        """From a received plan: every field present, of its type, within bounds (PayloadError naming it)."""
        return cls(**check(d))

    def xgb_params(self, base_score: float | None = None) -> dict:
        """The same parameters for ``xgboost.train`` (the centralized reference on the same bins)."""
        p = {"objective": self.objective, "tree_method": "hist", "max_depth": self.max_depth, "eta": self.eta,
             "lambda": self.reg_lambda, "alpha": self.reg_alpha, "gamma": self.gamma,
             "min_child_weight": self.min_child_weight, "max_delta_step": self.max_delta_step,
             "max_bin": self.max_bin, "eval_metric": self.eval_metric}
        if self.objective == "multi:softprob":
            p["num_class"] = self.num_class
        score = self.base_score if base_score is None else base_score
        if score is not None:
            p["base_score"] = float(score)
        return p


def check(d, error=PayloadError) -> dict:
    """``d`` as BoostParams' fields, each checked; ``error(field, message)`` for the first that is wrong."""
    if not isinstance(d, dict) or set(d) != {f.name for f in fields(BoostParams)}:
        raise error("params", f"expected exactly the fields {sorted(f.name for f in fields(BoostParams))}")
    out = dict(d)
    if out["objective"] not in OBJECTIVES:
        raise error("params.objective", f"must be one of {list(OBJECTIVES)}")
    multi = out["objective"] == "multi:softprob"
    out["num_class"] = check_int(out["num_class"], "params.num_class", lo=2 if multi else 0,
                                 hi=MAX_CLASSES if multi else 0, error=error)
    out["rounds"] = check_int(out["rounds"], "params.rounds", lo=1, hi=MAX_ROUNDS, error=error)
    out["max_depth"] = check_int(out["max_depth"], "params.max_depth", lo=1, hi=MAX_DEPTH, error=error)
    out["max_bin"] = check_int(out["max_bin"], "params.max_bin", lo=2, hi=MAX_BIN, error=error)
    out["early_stopping_rounds"] = check_int(out["early_stopping_rounds"], "params.early_stopping_rounds", lo=0,
                                             hi=MAX_ROUNDS, error=error)
    for name in ("eta", "reg_lambda", "reg_alpha", "gamma", "min_child_weight", "max_delta_step"):
        out[name] = check_number(out[name], f"params.{name}", nonnegative=True, error=error)
    if not 0 < out["eta"] <= 1:
        raise error("params.eta", "must be in (0, 1]")
    if out["base_score"] is not None:
        score = check_number(out["base_score"], "params.base_score", error=error)
        if out["objective"] == "binary:logistic" and not 0 < score < 1:
            raise error("params.base_score", "must be a probability in (0, 1) for binary:logistic")
        if not math.isfinite(score) or abs(score) > 1e12:
            raise error("params.base_score", "must be finite and at most 1e12 in size")
        out["base_score"] = score
    return out
