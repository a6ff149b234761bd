"""The learners a site may train its local tree with, and the encoding each reads a table in.

An encoding is named for what it is: ``one_hot`` (every categorical column one 0/1 column per category; CART's
binary splits read it) or ``category_codes`` (every categorical column one column of its codes 0..k-1; ID3 splits it
into one branch per category). Numeric and ordinal columns are the same in both. A saved global tree records its
encoding; files written before these names record the learner instead ("cart", "id3"), which :func:`encoding_of`
reads as its encoding.

To add a learner (docs/CONTRIBUTING.md), write a ``fit`` that returns a :class:`~treeflare.trees.tree.Tree` over
the encoded columns and register it: every job option, check and export that takes a learner name takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cart import fit_cart
from .id3 import fit_id3
from .tree import Tree

ONE_HOT = "one_hot"
CATEGORY_CODES = "category_codes"
ENCODINGS = (ONE_HOT, CATEGORY_CODES)


@dataclass(frozen=True)
class Learner:
    """A local tree learner.

    ``fit(X, y, *, n_classes, feature_kinds, n_categories, params) -> Tree``: ``X`` in ``encoding``, ``y`` class
    indices into the global class list, ``feature_kinds`` per column ("numeric" or "categorical"),
    ``n_categories`` per column (None for numeric), ``params`` the job's local parameters with their defaults.
    ``multiway``: a categorical column may split into one branch per category (bounds an honest tree's size).
    """

    name: str
    encoding: str
    fit: Callable[..., Tree]
    multiway: bool


LEARNERS: dict[str, Learner] = {}


def register_learner(learner: Learner) -> Learner:
    if learner.encoding not in ENCODINGS:
        raise ValueError(f"learner {learner.name!r}: encoding must be one of {ENCODINGS}, got {learner.encoding!r}")
    if learner.name in LEARNERS or learner.name in ENCODINGS:
        raise ValueError(f"a learner or encoding named {learner.name!r} exists already")
    LEARNERS[learner.name] = learner
    return learner


def get_learner(name: str) -> Learner:
    try:
        return LEARNERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"algorithm must be one of {tuple(LEARNERS)}, got {name!r}") from None


def encoding_of(name: str) -> str:
    """The encoding an encoding's or a learner's name stands for (saved models name either)."""
    if name in ENCODINGS:
        return name
    if isinstance(name, str) and name in LEARNERS:
        return LEARNERS[name].encoding
    raise ValueError(f"encoding must be one of {ENCODINGS} (or a learner: {tuple(LEARNERS)}), got {name!r}")


def _fit_cart(X, y, *, n_classes, feature_kinds, n_categories, params) -> Tree:
    return fit_cart(X, y, n_classes=n_classes, criterion=params["criterion"], max_depth=params["max_depth"],
                    min_samples_split=params["min_samples_split"], random_state=params["random_state"],
                    feature_kinds=feature_kinds)


def _fit_id3(X, y, *, n_classes, feature_kinds, n_categories, params) -> Tree:
    return fit_id3(X, y, n_classes=n_classes, feature_kinds=feature_kinds, n_categories=n_categories,
                   max_depth=params["max_depth"], min_samples_split=params["min_samples_split"] or 2,
                   min_gain=params["min_gain"], n_bins=params["n_bins"])


register_learner(Learner("cart", ONE_HOT, _fit_cart, multiway=False))
register_learner(Learner("id3", CATEGORY_CODES, _fit_id3, multiway=True))
