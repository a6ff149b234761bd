"""What the project's estimators share, on the ground floor of the package (as scikit-learn keeps its mixins in
``sklearn/base.py``): it imports none of the models, so every model can build on it and ``prediction`` can import
every model without a circle."""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

__all__ = ["ClassCodesClassifier"]


class ClassCodesClassifier(ClassifierMixin, BaseEstimator):
    """A scikit-learn classifier that a federation fitted: ``predict`` and ``score`` of the project's estimators
    (``GlobalTree``, ``XGBModel``), from their ``predict_codes`` (class indices into ``classes_``).

    The model is complete when it is made, so it needs no ``fit`` before ``predict`` (tag ``requires_fit`` is
    False) and ``fit`` raises (``sklearn.frozen.FrozenEstimator`` wraps it for tools that call ``fit``). A
    subclass's constructor parameters are its fitted model, so ``clone`` gives an equal model that predicts the
    same; a subclass sets its fitted attributes (``classes_`` ...) in ``_set_fitted``, which the constructor and
    ``set_params`` call. For the same reasons these ``check_estimator`` checks do not apply: every check that fits
    on generated data, ``check_no_attributes_set_in_init`` (the model is fitted when made),
    ``check_n_features_in`` (``n_features_in_`` exists before any fit) and
    ``check_do_not_raise_errors_in_init_or_set_params`` (the parameters are checked when given). The others pass
    (``tests/icdta4fl/test_global_tree_estimator.py``, ``tests/xgb/test_xgb_sklearn_model.py``)."""

    classes_: np.ndarray

    def _set_fitted(self) -> None:
        raise NotImplementedError

    def set_params(self, **params):
        """Set parameters, then check them and the fitted attributes made from them; on an error the model keeps
        its old parameters."""
        old = self.get_params(deep=False)
        try:
            super().set_params(**params)
            self._set_fitted()
        except Exception:
            super().set_params(**old)
            self._set_fitted()
            raise
        return self

    def fit(self, X, y=None, **fit_params):
        raise NotImplementedError(
            f"{type(self).__name__} holds a model the federation trained; it is not refitted on local rows. "
            "Use it as it is (predict, score, scikit-learn's scorers), or wrap it in "
            "sklearn.frozen.FrozenEstimator for tools that call fit (cross_val_score, stacking, calibration)")

    def __sklearn_is_fitted__(self) -> bool:
        return True

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.requires_fit = False  # fitted when made
        tags.input_tags.allow_nan = True  # NaN is a missing value, routed as in training
        # with a schema, a DataFrame of raw values: category names as strings
        raw = getattr(self, "data_schema", None) is not None
        tags.input_tags.categorical = tags.input_tags.string = raw
        return tags

    def predict_codes(self, X) -> np.ndarray:
        raise NotImplementedError

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_codes(X)]

    def score(self, X, y, sample_weight=None) -> float:
        """Accuracy; ``y`` may hold class indices (integers) or class names."""
        y = np.asarray(y)
        if y.dtype.kind in "iu":
            right = self.predict_codes(X) == y
        else:
            right = self.predict(X) == y.astype(str)
        return float(np.average(right, weights=sample_weight))
