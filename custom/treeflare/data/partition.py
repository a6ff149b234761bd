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


# -- vertical parties whose customers differ ------------------------------------------------------------
# Stream tags of the seeded generators below, so changing one never shifts another's draws.
_OVERLAP_STREAM, _ORDER_STREAM, _TEST_ORDER_STREAM, _ID_STREAM = 2201, 2202, 2203, 2204
# A random id: 16 hex digits (64 bits), so a party cannot guess the ids it does not hold from its own.
_ID_HEX_DIGITS = 16


def check_overlap(overlap) -> float:
    """``overlap`` as a float in (0, 1], else a DataError naming ``--overlap``."""
    ok = isinstance(overlap, (int, float, np.integer, np.floating)) and not isinstance(overlap, bool) \
        and np.isfinite(overlap) and 0 < overlap <= 1
    if not ok:
        raise DataError(f"--overlap must be a number in (0, 1] (each party's share of its training rows that all "
                        f"parties hold), got {overlap!r}")
    return float(overlap)


def overlap_sizes(n_rows: int, n_parties: int, overlap: float) -> tuple[int, int]:
    """(shared, private per party) for ``n_rows`` rows dealt to ``n_parties`` parties at ``overlap`` F.

    Every party holds the shared rows plus ``private`` rows no other party holds, so its own share of shared rows
    is shared / (shared + private) = F. The rows are used up when shared + parties * private = n_rows, hence
    shared = n_rows * F / (F + parties * (1 - F)), rounded down, and the other rows are dealt equally (fewer than
    ``n_parties`` left over go to no party); the party's share is then F to within about 1 / its row count."""
    f = check_overlap(overlap)
    if f == 1.0:
        return n_rows, 0
    shared = int(np.floor(n_rows * f / (f + n_parties * (1 - f))))
    private = (n_rows - shared) // n_parties
    if shared < 2:
        raise DataError(f"--overlap {f:g}: {n_rows} training rows among {n_parties} parties leave {shared} row(s) "
                        "that all parties hold; need at least 2: use a larger --overlap (or more data)")
    return shared, private


def overlap_rows(n_rows: int, n_parties: int, overlap: float, seed: int) -> tuple[list[np.ndarray], int]:
    """Each party's rows (indices into ``n_rows``) in the party's own shuffled order, and the shared count.

    The shared rows and each party's private rows are a seeded random draw; each party's order is its own seeded
    shuffle, so row i of one party's file tells nothing about row i of another's."""
    shared, private = overlap_sizes(n_rows, n_parties, overlap)
    perm = np.random.default_rng([seed, _OVERLAP_STREAM]).permutation(n_rows)
    common = perm[:shared]
    parties = []
    for i in range(n_parties):
        own = perm[shared + i * private: shared + (i + 1) * private]
        rows = np.concatenate([common, own])
        parties.append(np.random.default_rng([seed, _ORDER_STREAM, i]).permutation(rows))
    return parties, shared


def party_order(n_rows: int, party: int, seed: int) -> np.ndarray:
    """Party ``party``'s own seeded order of ``n_rows`` rows (the global test rows every party holds)."""
    return np.random.default_rng([seed, _TEST_ORDER_STREAM, party]).permutation(n_rows)


def random_ids(n_rows: int, seed: int) -> np.ndarray:
    """``n_rows`` distinct random ids (16 hex digits each) from a seeded generator, as an object array."""
    rng = np.random.default_rng([seed, _ID_STREAM])
    ids: list[str] = []
    seen: set[str] = set()
    while len(ids) < n_rows:  # a repeat among 2**64 values is all but impossible; draw again if one happens
        for v in rng.integers(0, 2**64, size=n_rows - len(ids), dtype=np.uint64).tolist():
            text = f"{v:0{_ID_HEX_DIGITS}x}"
            if text not in seen:
                seen.add(text)
                ids.append(text)
    return np.array(ids, dtype=object)
