"""XGBoost parameters shared by the federated job and its baselines: objective, metrics, build checks."""

from __future__ import annotations

DEFAULT_ROUNDS = 50
DEFAULT_MAX_DEPTH = 6
DEFAULT_ETA = 0.1

ENCRYPT_MESSAGE = (
    "--encrypt is not supported by the XGBoost histogram job: NVFlare's 'secure' XGBoost modes need encryption "
    "plugins (libcuda_paillier.so / libnvflare.so) that no pip wheel ships, and the PyPI xgboost ignores "
    "`federated_plugin`, so they would silently train in the clear. For encrypted vertical training use the "
    "packed-Paillier job: treeflare vertical --help"
)


class XGBSetupError(RuntimeError):
    """The environment cannot run federated XGBoost (message says what to install)."""


def check_federated_build() -> None:
    """Fail clearly unless this xgboost build has the federated communicator."""
    try:
        import xgboost
    except ImportError as exc:  # pragma: no cover - xgboost is a requirement
        raise XGBSetupError(f"xgboost is not installed ({exc}); pip install xgboost==3.2.0") from None
    info = xgboost.build_info()
    if not info.get("USE_FEDERATED"):
        raise XGBSetupError(
            f"this xgboost {xgboost.__version__} build has no federated support (build_info()['USE_FEDERATED'] is "
            f"{info.get('USE_FEDERATED')!r}); install the full manylinux wheel `pip install xgboost==3.2.0` "
            "(the `xgboost-cpu` package and some conda builds lack it)"
        )


def make_params(n_classes: int, *, max_depth: int = DEFAULT_MAX_DEPTH, eta: float = DEFAULT_ETA,
                nthread: int = 1, seed: int = 0, max_bin: int = 256) -> dict:
    """``xgboost.train`` parameters: binary:logistic for 2 classes, multi:softprob otherwise."""
    if n_classes < 2:
        raise ValueError(f"need at least 2 classes, got {n_classes}")
    params = {
        "tree_method": "hist",
        "max_depth": int(max_depth),
        "eta": float(eta),
        "max_bin": int(max_bin),
        "nthread": int(nthread),
        "seed": int(seed),
    }
    # One watched metric: each metric on each watched set costs collective operations every round.
    if n_classes == 2:
        params.update(objective="binary:logistic", eval_metric="auc")
    else:
        params.update(objective="multi:softprob", num_class=int(n_classes), eval_metric="mlogloss")
    return params


def metric_keys(n_classes: int) -> tuple[str, ...]:
    """The report's metric keys: binary ``auc, accuracy, logloss``; multiclass ``accuracy, macro_f1, mlogloss``."""
    return ("auc", "accuracy", "logloss") if n_classes == 2 else ("accuracy", "macro_f1", "mlogloss")
