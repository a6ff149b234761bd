"""The public value lattices the federated jobs count rows on (ICDTA4FL's growth from the root, the XGBoost engine's
sketch): 0, +-10^(k/per_decade) over a span of magnitudes, and every half-integer below ``half_integers`` in size,
so that an integer column keeps each of its values in a cell of its own. Public: every party computes the same."""

from __future__ import annotations

import numpy as np


def log_lattice(per_decade: int, decades: tuple[int, int], half_integers: int) -> np.ndarray:
    """The lattice's points, increasing (float64)."""
    k = np.arange(decades[0] * per_decade, decades[1] * per_decade + 1)
    pos = 10.0 ** (k / per_decade)
    half = np.arange(-half_integers, half_integers) + 0.5
    return np.union1d(np.concatenate([-pos[::-1], [0.0], pos]), half)
