"""What the project's estimators share, on the ground floor of the package (as scikit-learn keeps its mixins in
``sklearn/base.py``): it imports none of the models, so every model can build on it and ``prediction`` can import
every model without a circle."""

from __future__ import annotations

import numpy as np

__all__ = ["ClassCodesClassifier"]


class ClassCodesClassifier:
    """``predict`` and ``score`` of the project's estimators (``GlobalTree``, ``XGBModel``), from their
    ``predict_codes`` (class indices into ``classes_``)."""

    classes_: np.ndarray

    def predict_codes(self, X) -> np.ndarray:
        raise NotImplementedError

    def predict(self, X) -> np.ndarray:
        return self.classes_[self.predict_codes(X)]

    def score(self, X, y) -> float:
        """Accuracy; ``y`` may hold class indices (integers) or class names."""
        y = np.asarray(y)
        if y.dtype.kind in "iu":
            return float(np.mean(self.predict_codes(X) == y))
        return float(np.mean(self.predict(X) == y.astype(str)))
