"""Pure (NVFlare-free) parts of the federated XGBoost histogram job: parameters, shared encoding, metrics,
centralized and XGBoost-native distributed baselines."""

from .encoding import Arrays, dmatrix, global_test, load_site, table_arrays, union_train
from .metrics import metric_diffs, predict_proba, score, score_booster
from .params import ENCRYPT_MESSAGE, XGBSetupError, check_federated_build, make_params, metric_keys

__all__ = [
    "Arrays", "ENCRYPT_MESSAGE", "XGBSetupError", "check_federated_build", "dmatrix", "global_test", "load_site",
    "make_params", "metric_diffs", "metric_keys", "predict_proba", "score", "score_booster", "table_arrays",
    "union_train",
]
