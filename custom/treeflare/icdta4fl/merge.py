"""Conjunction-set merge of the selected trees' rules.

The running rule set is replaced, tree after tree, by the compatible pairs of its cross product
with the next tree's rules. Two rules are compatible when every numeric feature's intervals
overlap by more than ``eps`` (real-valued: min(upper) - max(lower) > eps) and no categorical
feature is tested by both with different codes. A merged rule takes the intersection of the
intervals and the union of the equalities, the sum of the class masses (the sample-weighted
mean distribution) and the geometric mean of the supports (see rules.py).

Missing values (each rule's ``missing`` per feature, see rules.py). A merged rule admits NaN in a
feature where both rules do and is missing-only where either is (its value condition then drops).
Two rules whose value conditions are disjoint but which both admit NaN would meet at NaN only;
that conjunction is not formed: CART routes NaN at every split (towards the larger child where it
saw none), so it would be formed on data with no missing value at all, about a region no row
showed (measured on synthetic CART federations, 6 seeds: forming it gave 7% more merged rules and
a one-round tree 0.1 point less accurate on complete data, 0.1 point more with missing cells).
A missing-only rule meets every rule that admits NaN there.

Fixes to the reference behaviour (spec §7): merged categorical rules keep the conditions of both
rules; distributions are sample-weighted for every tree kind; overlap is real-valued (no integer
test); the cap ``max_rules`` always applies; a tree whose merge leaves nothing is skipped (and
reported), never the trees before it.

The cap. The reference keeps the 3000 lowest-entropy merged rules (``cap_by="entropy"``), which
leaves regions of the input space with no rule once many trees are merged (measured on adult,
20 IID sites: 30% of the test rows uncovered after 10 trees, and a one-leaf global tree).
By default (``cap_by="refine"``) the next tree refines only as many of the running rules as
the cap allows, most impure first, and the other rules stay unrefined: the rule set keeps its
coverage and the cost per merged tree stays bounded by the cap, so the merge is linear in the
number of selected trees.

Order: the result depends only on the multiset of selected trees, not on the order of the sites.
Trees are merged in a canonical order (fewest rules first, then by a digest of their sorted
content), rules are kept in a canonical order, and cap ties are broken by that order.
``reference_compat=True`` merges in the given order with the reference's CART arithmetic
((p_a + p_b)/2, round(sqrt(n_a n_b)), eps 0.001), for comparisons with published behaviour.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from ..trees.impurity import entropy
from .rules import MISSING_ALLOWED, MISSING_ONLY, MISSING_REFUSED, RuleSet

__all__ = ["merge_rule_sets", "compatible_pairs", "deduplicate", "DEFAULT_MAX_RULES", "MAX_MERGE_PAIRS",
           "UnusableTreeError"]

log = logging.getLogger(__name__)

DEFAULT_MAX_RULES = 3000
REFERENCE_EPS = 0.001
# Memory bounds of one merge step, whatever the trees are: compatible pairs found (each costs a few
# rule rows before the cap) and the cells of the pairwise test held at once.
MAX_MERGE_PAIRS = 2_000_000
_BLOCK_CELLS = 2_000_000


class UnusableTreeError(ValueError):
    """One input tree (``position`` in the given list) cannot be merged; the others still can."""

    def __init__(self, position: int, reason: str):
        super().__init__(f"tree {position}: {reason}")
        self.position, self.reason = position, reason


def _digest(rules: RuleSet) -> str:
    h = hashlib.sha256()
    for a in (rules.lower, rules.upper, rules.equals, rules.mass, rules.support, rules.n_sources, rules.missing):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def compatible_pairs(a: RuleSet, b: RuleSet, eps: float = 0.0,
                     max_pairs: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ia, ib) of the compatible pairs, in row-major order of (a, b).

    The test runs over blocks of ``a`` so memory stays bounded; more than ``max_pairs`` pairs raise
    ``OverflowError`` before they are all held.
    """
    block = max(1, _BLOCK_CELLS // max(b.n_rules, 1))
    found_a, found_b, total = [], [], 0
    for start in range(0, a.n_rules, block):
        ia, ib = _compatible_block(a.take(np.arange(start, min(start + block, a.n_rules))), b, eps)
        total += ia.size
        if max_pairs is not None and total > max_pairs:
            raise OverflowError(f"more than {max_pairs} compatible rule pairs")
        found_a.append(ia + start), found_b.append(ib)
    if not found_a:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(found_a), np.concatenate(found_b)


def _compatible_block(a: RuleSet, b: RuleSet, eps: float) -> tuple[np.ndarray, np.ndarray]:
    ok = np.ones((a.n_rules, b.n_rules), dtype=bool)
    for j, kind in enumerate(a.feature_kinds):
        sa, sb = a.missing[:, j], b.missing[:, j]
        only_a, only_b = sa == MISSING_ONLY, sb == MISSING_ONLY
        if kind == "categorical":
            ea, eb = a.equals[:, j], b.equals[:, j]
            if (ea >= 0).any() and (eb >= 0).any():
                values = ~((ea[:, None] >= 0) & (eb[None, :] >= 0) & (ea[:, None] != eb[None, :]))
            elif only_a.any() or only_b.any():
                values = np.ones_like(ok)
            else:
                continue
        else:
            la, ua, lb, ub = a.lower[:, j], a.upper[:, j], b.lower[:, j], b.upper[:, j]
            if not (np.isfinite(la).any() or np.isfinite(ua).any() or np.isfinite(lb).any()
                    or np.isfinite(ub).any() or only_a.any() or only_b.any()):
                continue
            with np.errstate(invalid="ignore"):
                overlap = np.minimum(ua[:, None], ub[None, :]) - np.maximum(la[:, None], lb[None, :])
            values = overlap > eps
        if only_a.any() or only_b.any():  # a missing-only rule meets only rules that admit NaN there
            either_only = only_a[:, None] | only_b[None, :]
            nan_meet = (sa[:, None] != MISSING_REFUSED) & (sb[None, :] != MISSING_REFUSED)
            values = np.where(either_only, nan_meet, values)
        ok &= values
    return np.nonzero(ok)


def _merge_pairs(a: RuleSet, b: RuleSet, ia, ib, reference_compat: bool) -> RuleSet:
    sa, sb = a.missing[ia], b.missing[ib]
    only = (sa == MISSING_ONLY) | (sb == MISSING_ONLY)  # only NaN meets both: no value condition left
    missing = np.where(only, MISSING_ONLY, np.where((sa == MISSING_ALLOWED) & (sb == MISSING_ALLOWED),
                                                    MISSING_ALLOWED, MISSING_REFUSED))
    lower = np.where(only, -np.inf, np.maximum(a.lower[ia], b.lower[ib]))
    upper = np.where(only, np.inf, np.minimum(a.upper[ia], b.upper[ib]))
    equals = np.where(only, -1, np.where(a.equals[ia] >= 0, a.equals[ia], b.equals[ib]))
    n_sources = a.n_sources[ia] + b.n_sources[ib]
    if reference_compat:
        mass = (a.dist[ia] + b.dist[ib]) / 2.0
        support = np.round(np.sqrt(a.support[ia] * b.support[ib]))
    else:
        mass = a.mass[ia] + b.mass[ib]
        # geometric mean over all conjoined leaves, associative: exp(sum of logs / k)
        with np.errstate(divide="ignore"):
            logs = (a.n_sources[ia] * np.log(a.support[ia]) + b.n_sources[ib] * np.log(b.support[ib]))
        support = np.exp(logs / n_sources)
    return RuleSet(lower, upper, equals, mass, support, n_sources, a.feature_kinds, missing)


def _cap_pairs(a, b, ia, ib, max_rules, reference_compat, cap_by):
    """Keep max_rules pairs: lowest entropy or highest support; ties broken by pair order."""
    if cap_by == "support":
        with np.errstate(divide="ignore"):
            key = -(a.n_sources[ia] * np.log(a.support[ia]) + b.n_sources[ib] * np.log(b.support[ib]))
    else:
        mass = (a.dist[ia] + b.dist[ib]) / 2.0 if reference_compat else a.mass[ia] + b.mass[ib]
        key = entropy(mass, empty="uniform")
    key = np.round(key, 12)  # rounding: ties must not depend on float noise
    keep = np.sort(np.argsort(key, kind="stable")[:max_rules])
    return ia[keep], ib[keep]


def _refine_within_cap(running: RuleSet, ia: np.ndarray, max_rules: int) -> np.ndarray:
    """Which running rules the next tree refines, so that the result keeps at most max_rules.

    A refined rule is replaced by its compatible intersections with the next tree's rules; the
    others stay as they are (conjunctions of fewer trees), so the rules keep covering the whole
    space that they covered. Rules carrying the most impurity (support x entropy) are refined
    first; ties by canonical order. A rule with no compatible partner is never refined away.
    """
    expansions = np.bincount(ia, minlength=running.n_rules)
    refined = np.zeros(running.n_rules, dtype=bool)
    if ia.size <= max_rules:
        refined[expansions > 0] = True
        return refined
    priority = np.round(running.support * running.entropy(), 12)
    order = np.lexsort((np.arange(running.n_rules), -priority))
    order = order[expansions[order] > 0]
    growth = np.cumsum(expansions[order] - 1)
    refined[order[running.n_rules + growth <= max_rules]] = True
    return refined


def deduplicate(rules: RuleSet) -> RuleSet:
    """Merge rules with identical conditions: supports summed, distributions support-weighted."""
    if rules.n_rules < 2:
        return rules
    key = np.ascontiguousarray(np.hstack([rules.lower, rules.upper, rules.equals.astype(np.float64),
                                          rules.missing.astype(np.float64)]))
    _, first, inverse = np.unique(key.view(np.dtype((np.void, key.dtype.itemsize * key.shape[1]))),
                                  return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if len(first) == rules.n_rules:
        return rules
    R = len(first)
    # distributions weighted by support, so sum(support * dist) over the duplicates is kept
    mass = np.zeros((R, rules.n_classes))
    np.add.at(mass, inverse, rules.support[:, None] * rules.dist)
    support = np.bincount(inverse, weights=rules.support, minlength=R)
    n_sources = np.zeros(R, dtype=np.int64)
    np.maximum.at(n_sources, inverse, rules.n_sources)
    return RuleSet(rules.lower[first], rules.upper[first], rules.equals[first], mass, support,
                   n_sources, rules.feature_kinds, rules.missing[first])


def merge_rule_sets(rule_sets, *, max_rules=DEFAULT_MAX_RULES, eps=None, reference_compat=False,
                    cap_by="refine"):
    """Conjunction set of the given rule sets (one per selected tree).

    Returns ``(rules, stats)``: the merged, de-duplicated, canonically sorted rules and a dict
    with ``order`` (positions of the input sets in merge order), ``skipped`` (positions whose
    merge was empty), ``capped`` (merge steps where the cap removed rules) and ``n_rules``.
    """
    rule_sets = list(rule_sets)
    if not rule_sets:
        raise ValueError("nothing to merge: no rule sets given")
    if eps is None:
        eps = REFERENCE_EPS if reference_compat else 0.0
    if max_rules is None or max_rules < 1:
        raise ValueError("max_rules must be a positive integer")
    if reference_compat:
        order = list(range(len(rule_sets)))
        sets = rule_sets
    else:
        sets = [s.sorted() for s in rule_sets]
        order = sorted(range(len(sets)), key=lambda i: (sets[i].n_rules, _digest(sets[i])))
        sets = [sets[i] for i in order]
    running = sets[0]
    if cap_by not in ("refine", "entropy", "support"):
        raise ValueError(f"cap_by must be 'refine', 'entropy' or 'support', got {cap_by!r}")
    if running.n_rules > max_rules:
        key = running.entropy() if cap_by == "entropy" else -np.log(running.support)
        keep = np.sort(np.argsort(np.round(key, 12), kind="stable")[:max_rules])
        running = running.take(keep)
    skipped, capped = [], []
    for step in range(1, len(sets)):
        other = sets[step]
        if running.n_rules == 0:
            running = other
            continue
        try:
            ia, ib = compatible_pairs(running, other, eps, max_pairs=MAX_MERGE_PAIRS)
        except OverflowError as exc:
            raise UnusableTreeError(order[step], f"merging it is too large ({exc})") from None
        if ia.size == 0:
            log.warning("merging tree %d left no compatible rule pair; tree skipped", order[step])
            skipped.append(order[step])
            continue
        if cap_by == "refine":
            refined = _refine_within_cap(running, ia, max_rules)
            if not refined.all():
                capped.append(order[step])
            pair = refined[ia]
            running = RuleSet.concatenate([
                _merge_pairs(running, other, ia[pair], ib[pair], reference_compat),
                running.take(np.flatnonzero(~refined))])
            continue
        if ia.size > max_rules:
            ia, ib = _cap_pairs(running, other, ia, ib, max_rules, reference_compat, cap_by)
            capped.append(order[step])
        running = _merge_pairs(running, other, ia, ib, reference_compat)
    merged = deduplicate(running)
    if not reference_compat:
        merged = merged.sorted()
    stats = {"order": order, "skipped": skipped, "capped": capped, "n_rules": merged.n_rules}
    return merged, stats
