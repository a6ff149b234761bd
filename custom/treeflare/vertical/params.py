"""Training parameters of the vertical job."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields

from ..crypto import MIN_SECURE_BITS


@dataclass
class VerticalParams:
    model: str = "tree"            # "tree" (classification tree) | "gbdt" (binary logistic)
    criterion: str = "gini"        # tree only: "gini" | "entropy"
    n_trees: int = 1               # gbdt: boosting rounds; tree: must be 1
    max_depth: int = 3
    bins: int = 32
    learning_rate: float = 0.3
    reg_lambda: float = 1.0
    min_child_weight: float = 1.0  # gbdt: min hessian per child; tree: min samples per child
    key_bits: int = 2048
    precision: int = 53            # gbdt fixed-point bits
    packing: bool = True           # pack all channels of a sample in one plaintext (claims 3/4)
    compress: bool = True          # several split results per returned ciphertext (claim 6)
    scheme: str = "paillier"       # "paillier" | "mock" (plaintext oracle only)
    obfuscation: str = "full"      # "full" r^n | "djn" short exponent (faster, extra assumption)
    workers: int = 0               # processes for encryption/decryption/histograms; 0 = os.cpu_count()
    hist_subtraction: bool = True
    allow_insecure_key: bool = False  # permit key_bits < 2048 (tests only)

    def validate(self) -> "VerticalParams":
        if self.model not in ("tree", "gbdt"):
            raise ValueError("model must be 'tree' or 'gbdt'")
        if self.criterion not in ("gini", "entropy"):
            raise ValueError("criterion must be 'gini' or 'entropy'")
        if self.model == "tree" and self.n_trees != 1:
            raise ValueError("the classification tree model builds exactly one tree (n_trees=1)")
        if not 1 <= self.n_trees <= 10_000:
            raise ValueError("n_trees out of range")
        if not 1 <= self.max_depth <= 16:
            raise ValueError("max_depth must be in [1, 16]")
        if not 2 <= self.bins <= 1024:
            raise ValueError("bins must be in [2, 1024]")
        if not 8 <= self.precision <= 60:
            raise ValueError("precision must be in [8, 60] bits")
        if self.scheme not in ("paillier", "mock"):
            raise ValueError("scheme must be 'paillier' or 'mock'")
        if self.obfuscation not in ("full", "djn"):
            raise ValueError("obfuscation must be 'full' or 'djn'")
        if self.key_bits % 2 or self.key_bits < 256:
            raise ValueError("key_bits must be even and >= 256")
        if self.key_bits < MIN_SECURE_BITS and not self.allow_insecure_key:
            raise ValueError(f"key_bits < {MIN_SECURE_BITS} is insecure; only allowed for tests "
                             "(allow_insecure_key)")
        if self.learning_rate <= 0 or self.reg_lambda < 0 or self.min_child_weight < 0:
            raise ValueError("learning_rate must be > 0, reg_lambda and min_child_weight >= 0")
        return self

    @property
    def n_workers(self) -> int:
        return self.workers if self.workers and self.workers > 0 else max(1, os.cpu_count() or 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VerticalParams":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
