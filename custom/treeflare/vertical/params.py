"""Training parameters of the vertical job."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

from ..crypto import check_key_bits
from ..crypto.workers import is_address, is_cluster, parse_workers
from .objectives import OBJECTIVES

MAX_TREES = 1000
MAX_DEPTH = 16
DEFAULT_MIN_ROWS_NODE = 10
MAX_PREDICT_ROWS = 1_000_000   # a passive site's default cap on the rows it answers prediction requests about


@dataclass
class VerticalParams:
    model: str = "tree"            # "tree" (classification tree) | "gbdt" (boosting)
    objective: str = "binary"      # gbdt: "binary" | "softmax" | "squared_error"
    criterion: str = "gini"        # tree only: "gini" | "entropy"
    n_trees: int = 1               # gbdt: boosting rounds; tree: must be 1
    max_depth: int = 3
    bins: int = 32
    learning_rate: float = 0.3
    reg_lambda: float = 1.0
    min_child_weight: float = 1.0  # gbdt: min hessian per child; tree: min samples per child
    min_rows_node: int = DEFAULT_MIN_ROWS_NODE   # a node with fewer rows is never split (agreed at setup)
    key_bits: int = 2048
    precision: int = 53            # gbdt fixed-point bits
    packing: bool = True           # pack all channels of a row in one plaintext (claims 3/4)
    compress: bool = True          # several split results per returned ciphertext (claim 6)
    scheme: str = "paillier"       # "paillier" | "ou" (Okamoto-Uchiyama, opt-in) | "mock" (plaintext oracle only)
    obfuscation: str = "full"      # "full" r^n | "djn" short exponent (faster, extra assumption)
    workers: int | str = 0         # crypto workers: N processes (0 = all cores), 'dask-local:N', or 'dask://HOST:PORT'
                                   # (the latter from the site's own environment only: flare.vertical.executor)
    hist_subtraction: bool = True  # the larger sibling's sums = the parent's minus the smaller's (at the active)
    allow_insecure_key: bool = False  # permit key_bits < 2048 (tests only)

    def validate(self) -> "VerticalParams":
        if self.model not in ("tree", "gbdt"):
            raise ValueError("model must be 'tree' or 'gbdt'")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}")
        if self.criterion not in ("gini", "entropy"):
            raise ValueError("criterion must be 'gini' or 'entropy'")
        if self.model == "tree" and self.n_trees != 1:
            raise ValueError("the classification tree model builds exactly one tree (n_trees=1)")
        if not 1 <= self.n_trees <= MAX_TREES:
            raise ValueError(f"n_trees must be in [1, {MAX_TREES}]")
        if not 1 <= self.max_depth <= MAX_DEPTH:
            raise ValueError(f"max_depth must be in [1, {MAX_DEPTH}]")
        if not 2 <= self.bins <= 1024:
            raise ValueError("bins must be in [2, 1024]")
        if not 8 <= self.precision <= 60:
            raise ValueError("precision must be in [8, 60] bits")
        if not 2 <= self.min_rows_node <= 1_000_000:
            raise ValueError("min_rows_node must be in [2, 1000000]")
        if self.scheme not in ("paillier", "ou", "mock"):
            raise ValueError("scheme must be 'paillier', 'ou' (Okamoto-Uchiyama) or 'mock'")
        if self.scheme == "ou" and self.obfuscation != "full":
            raise ValueError("obfuscation 'djn' is Paillier's; Okamoto-Uchiyama takes 'full'")
        if self.obfuscation not in ("full", "djn"):
            raise ValueError("obfuscation must be 'full' or 'djn'")
        check_key_bits(self.key_bits, self.allow_insecure_key)
        self.workers = parse_workers(self.workers, "workers")
        if not (self.learning_rate > 0 and self.reg_lambda >= 0 and self.min_child_weight >= 0):
            raise ValueError("learning_rate must be > 0, reg_lambda and min_child_weight >= 0")
        return self

    @property
    def n_workers(self) -> int | str:
        """The number of local worker processes, or the Dask cluster spec as it is."""
        w = parse_workers(self.workers, "workers")
        if is_cluster(w):
            return w
        return w if w > 0 else max(1, os.cpu_count() or 1)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_record(self) -> dict:
        """:meth:`to_dict` as a model file or a report keeps it: a Dask scheduler's address is the site's own
        (``$TREEFLARE_VERTICAL_WORKERS``), never written down: ``workers`` is recorded as ``"site"`` instead."""
        d = self.to_dict()
        if is_address(parse_workers(self.workers, "workers")):
            d["workers"] = "site"
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VerticalParams":
        """The parameters of ``d`` (the others at their defaults); a key that is not a parameter is refused, so a
        misspelt option is never silently ignored (as the ICDTA4FL parameters are)."""
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown vertical parameters {sorted(map(str, unknown))}; known: {sorted(names)}")
        return cls(**d)
