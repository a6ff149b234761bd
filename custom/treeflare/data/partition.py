"""Seeded, reproducible ways to split rows among sites (horizontal) or columns among parties (vertical).

All partitioners return a list of disjoint row-index arrays that together cover the input.
"""

from __future__ import annotations

import numpy as np

from .errors import DataError
from .table import Table

PARTITIONS = ("iid", "quantity", "label")
_MAX_REDRAWS = 1000
# A site needs a training row and a local test row.
MIN_ROWS_PER_SITE = 2


def check_partition_args(n_rows: int, n_sites: int, kind: str, alpha: float | None) -> None:
    if kind not in PARTITIONS:
        raise DataError(f"--partition must be one of {list(PARTITIONS)}, got {kind!r}")
    if not isinstance(n_sites, (int, np.integer)) or n_sites < 1:
        raise DataError(f"--sites must be a positive integer, got {n_sites!r}")
    if n_sites > n_rows:
        raise DataError(f"--sites {n_sites} is more than the {n_rows} rows available to partition")
    if n_sites * MIN_ROWS_PER_SITE > n_rows:
        raise DataError(f"--sites {n_sites}: the {n_rows} rows left after the global test set give some sites fewer "
                        f"than {MIN_ROWS_PER_SITE} rows (one to train on, one to test); use at most "
                        f"{n_rows // MIN_ROWS_PER_SITE} sites")
    if kind != "iid" and (alpha is None or not np.isfinite(alpha) or alpha <= 0):
        raise DataError(f"--alpha must be a positive number for the {kind!r} partition, got {alpha!r}")


def min_site_rows(n_rows: int, n_sites: int) -> int:
    """Every site gets at least this many rows (enough for a local 80/20 split and a tree)."""
    return max(MIN_ROWS_PER_SITE, min(20, n_rows // (2 * n_sites)))


def iid(n_rows: int, n_sites: int, seed: int) -> list[np.ndarray]:
    """Equal random shards."""
    perm = np.random.default_rng(seed).permutation(n_rows)
    return [np.sort(p) for p in np.array_split(perm, n_sites)]


def quantity_skew(n_rows: int, n_sites: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Site shares ~ Dirichlet(alpha, ..., alpha), as in the ICDTA4FL paper; labels stay IID."""
    rng = np.random.default_rng(seed)
    floor = min_site_rows(n_rows, n_sites)
    shares = rng.dirichlet(np.full(n_sites, float(alpha)))
    spare = n_rows - floor * n_sites
    sizes = floor + np.floor(shares * spare).astype(np.int64)
    # Largest remainders get the rows lost to flooring, so the shards cover every row.
    remainder = n_rows - sizes.sum()
    order = np.argsort(-(shares * spare - np.floor(shares * spare)), kind="stable")
    sizes[order[:remainder]] += 1
    perm = rng.permutation(n_rows)
    return [np.sort(p) for p in np.split(perm, np.cumsum(sizes)[:-1])]


def label_skew(y_codes: np.ndarray, n_sites: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Per class, its rows go to sites in proportions ~ Dirichlet(alpha): the harder non-IID case.

    Redrawn (bounded) until every site has a minimum number of rows.
    """
    rng = np.random.default_rng(seed)
    n_rows = len(y_codes)
    floor = min_site_rows(n_rows, n_sites)
    classes = np.unique(y_codes)
    for _ in range(_MAX_REDRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_sites)]
        for c in classes:
            rows = rng.permutation(np.flatnonzero(y_codes == c))
            shares = rng.dirichlet(np.full(n_sites, float(alpha)))
            cuts = (np.cumsum(shares)[:-1] * len(rows)).astype(np.int64)
            for site, chunk in enumerate(np.split(rows, cuts)):
                parts[site].append(chunk)
        shards = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(s) for s in shards) >= floor:
            return shards
    raise DataError(f"label partition: could not give each of {n_sites} sites {floor} rows with alpha={alpha}; "
                    "use fewer sites or a larger --alpha")


def partition_rows(table: Table, n_sites: int, kind: str, alpha: float | None, seed: int) -> list[np.ndarray]:
    check_partition_args(len(table), n_sites, kind, alpha)
    if kind == "iid":
        return iid(len(table), n_sites, seed)
    if kind == "quantity":
        return quantity_skew(len(table), n_sites, alpha, seed)
    return label_skew(table.y_codes(), n_sites, alpha, seed)


def stratified_split(y_codes: np.ndarray, test_size: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train_rows, test_rows), stratified by class where a class has enough rows; seeded."""
    if not 0 < test_size < 1:
        raise DataError(f"test size must be in (0, 1), got {test_size!r}")
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(y_codes):
        rows = rng.permutation(np.flatnonzero(y_codes == c))
        # Round, but never take a class's only row away from training.
        k = int(round(len(rows) * test_size)) if len(rows) > 1 else 0
        test.append(rows[:k])
    test_rows = np.sort(np.concatenate(test)) if test else np.empty(0, np.int64)
    if len(test_rows) == 0 and len(y_codes) > 1:  # tiny tables: still hold out one row
        test_rows = np.array([rng.integers(len(y_codes))])
    mask = np.ones(len(y_codes), bool)
    mask[test_rows] = False
    return np.flatnonzero(mask), test_rows


def vertical_columns(columns: list[str], n_passive: int) -> list[list[str]]:
    """Feature columns for the active party (first) and each passive party, in schema order."""
    if not isinstance(n_passive, (int, np.integer)) or n_passive < 1:
        raise DataError(f"--passive must be a positive integer, got {n_passive!r}")
    if n_passive + 1 > len(columns):
        raise DataError(f"--passive {n_passive}: {len(columns)} feature columns cannot be shared among "
                        f"{n_passive + 1} parties")
    return [list(map(str, g)) for g in np.array_split(np.array(columns, dtype=object), n_passive + 1)]
