"""The server's side of the engine, as a generator of requests: it sees only the sums over the sites (the router
masks and adds), agrees the bins, grows every tree depth-wise with XGBoost's formulas, and writes the model.

    server = HistServer(params, n_features)
    gen = server.run()           # yields requests; send it the router's answer to each
    request = next(gen)          # "setup": answered with {site: reply}; every other: the sum of the sites' vectors

Per tree level one aggregation: the sites send histograms of one child of each split (the one with fewer pooled
rows), the server takes the other from the parent's (XGBoost's subtraction trick on exact integers). Every pooled sum
is checked against what the pooled rows allow (counts never negative, each bin's |G| and H within the objective's
per-row bounds times its rows, each feature's bins plus its missing values equal to the node): a site that sends
values its rows cannot give ends the job (a masked sum cannot say which site; see SECURITY.md).
"""

from __future__ import annotations

import math

import numpy as np

from . import bins, fixed_point, formulas, objectives
from .native_model import model_document
from .params import BoostParams

__all__ = ["HistServer", "EngineError"]


MAX_ROWS = 1 << 40  # pooled rows (training or validation): far past any federation, and no count sum can wrap


class EngineError(RuntimeError):
    """The pooled sums are not what honest sites can send, or the sketch leaves nothing to train on."""


class HistServer:
    def __init__(self, params: BoostParams, n_features: int, feature_names=None):
        self.params, self.n_features = params, int(n_features)
        self.feature_names = list(feature_names) if feature_names else None
        self.reg = formulas.Regularization.of(params)
        self.trees: list[dict] = []
        self.tree_info: list[int] = []
        self.history: list[float] = []  # the pooled validation metric after each round (early stopping)
        self.best_iteration: int | None = None
        self.stats = {"requests": 0, "values_summed": 0, "rounds": 0}
        self._last_splits: list = []  # the splits of the last level grown (no histograms asked)

    # -- the protocol ------------------------------------------------------------------------------
    def run(self):
        p = self.params
        replies = yield {"type": "setup", "params": p.to_dict(), "n_features": self.n_features}
        self.sites = sorted(replies)
        total = yield {"type": "sketch"}
        counts = self._read_sketch(np.asarray(total, dtype=np.int64))
        heavy = bins.heavy_cells(counts, self.n_features, p.max_bin)
        refined = {}
        if heavy:  # cells holding more than a bin's share: counted once more, in equal parts
            parts = np.asarray((yield {"type": "refine", "cells": heavy}), dtype=np.int64)
            refined = self._read_refined(parts, heavy, counts)
        self.cuts = [np.asarray(c) for c in bins.cuts_from_counts(counts, self.n_features, p.max_bin, refined)]
        self.ptr = np.concatenate([[0], np.cumsum([max(len(c) - 1, 0) for c in self.cuts])]).astype(np.int64)
        self._order = formulas.scan_order(self.ptr)
        pending: list[dict] = []
        for r in range(p.rounds):
            req = {"type": "round", "round": r, "trees": pending, "last_splits": self._last_splits}
            if r == 0:
                req.update(cuts=[[float(v) for v in c] for c in self.cuts], base_score=self.base_score,
                           grad_bits=self.grad_bits, eval_bits=self.eval_bits, g_bound=self.g_bound)
            summed = yield req
            if self._evaluated(summed[0], r) and self._stops():
                pending = []  # the last round's trees (and its last level) went out with this request
                break
            roots = [self._root(k, summed) for k in range(p.groups)]
            pending = yield from self._levels(r, roots)
            self.trees += pending
            self.tree_info += list(range(p.groups))
            self.stats["rounds"] = r + 1
        final = yield {"type": "finish", "trees": pending, "last_splits": self._last_splits if pending else []}
        if pending:
            self._evaluated(final[0], self.stats["rounds"])
            self._stops()
        return self.model()

    # -- the sketch: rows, labels, bins, scales -----------------------------------------------------
    def _read_sketch(self, v: np.ndarray) -> None:
        p, m = self.params, bins.n_cells()
        n, n_valid = int(v[0]), int(v[1])
        if n < 1 or n_valid < 0:
            raise EngineError(f"the sites hold {n} training rows in all: nothing to train on")
        if n > MAX_ROWS or n_valid > MAX_ROWS:
            raise EngineError(f"the pooled rows ({n}, {n_valid} for validation) pass {MAX_ROWS}: a site sent values "
                              "its rows cannot give (a masked sum cannot say which)")
        k = {"binary:logistic": 1, "multi:softprob": p.num_class}.get(p.objective, 1 + m)
        label, counts = v[2:2 + k], v[2 + k:]
        # every count within the rows first: then no sum below can wrap around int64 (rows <= 2^40, cells < 2^14)
        cells_ok = counts.size == self.n_features * m and not np.any((counts < 0) | (counts > n))
        label_cells = label[1:] if p.objective == "reg:squarederror" else label
        if not cells_ok or np.any((label_cells < 0) | (label_cells > n)):
            raise EngineError("the pooled sketch is not what the sites' rows can give (sizes or counts)")
        per_feature = counts.reshape(self.n_features, m).sum(axis=1)
        if np.any(per_feature > n):
            raise EngineError("the pooled sketch counts more values in a feature than the sites hold rows")
        self.n_train, self.n_valid = n, n_valid
        self.label_bound = 1.0
        if p.objective == "binary:logistic":
            if not 0 <= int(label[0]) <= n:
                raise EngineError("the pooled count of positive labels is not within the pooled rows")
            mean = min(max(int(label[0]) / n, 1e-6), 1 - 1e-6)
        elif p.objective == "multi:softprob":
            if np.any(label < 0) or int(label.sum()) != n:
                raise EngineError("the pooled class counts do not add up to the pooled rows")
            mean = 0.5
        else:
            cells = np.flatnonzero(label[1:] > 0)
            edges = bins.lattice()
            if int(label[1:].sum()) != n or cells[0] == 0 or cells[-1] >= len(edges):
                raise EngineError("the pooled label cells do not add up to the pooled rows, or a label is beyond "
                                  "1e12 in size")
            self.label_bound = float(max(abs(edges[cells[0] - 1]), abs(edges[cells[-1]])))
            total = float(fixed_point.decode(label[0], fixed_point.LABEL_BITS))
            lows = np.concatenate([[-np.inf], edges])[cells]  # each occupied cell's edges bound its labels' sum
            highs = np.concatenate([edges, [np.inf]])[cells]
            counts_y = label[1:][cells].astype(np.float64)
            if not (counts_y @ lows) - 1 <= total <= (counts_y @ highs) + 1:
                raise EngineError("the pooled label sum is not within the pooled label cells: a site sent values its "
                                  "rows cannot give (a masked sum cannot say which)")
            mean = total / n
        self.base_score = float(np.float32(p.base_score if p.base_score is not None else mean))
        self.g_bound, self.h_bound = objectives.bounds(p.objective, self.label_bound)
        # the most one validation row adds to the pooled loss (a site clips its rows' terms there)
        self.row_eval = objectives.MAX_ROW_LOGLOSS if p.objective != "reg:squarederror" else self.g_bound ** 2
        try:
            self.grad_bits = fixed_point.bits_for(n, max(self.g_bound, self.h_bound))
            # the loss only compares rounds: a coarse scale (even fewer than 0 bits) does for huge labels
            self.eval_bits = fixed_point.bits_for(max(n_valid, 1), self.row_eval, cap=fixed_point.EVAL_BITS,
                                                  floor=fixed_point.MIN_EVAL_BITS)
        except ValueError as exc:
            raise EngineError(f"the pooled rows and labels leave no fixed-point scale: {exc}") from None
        self.g_max_int = int(math.ceil(self.g_bound * 2 ** self.grad_bits))
        self.h_max_int = int(math.ceil(self.h_bound * 2 ** self.grad_bits))
        return counts

    def _read_refined(self, parts: np.ndarray, heavy: list, counts: np.ndarray) -> dict:
        """{(feature, cell): pooled counts of its parts}, each cell's parts adding up to the cell's pooled count."""
        R, m = bins.REFINE_SPLITS, bins.n_cells()
        if parts.size != R * len(heavy) or np.any((parts < 0) | (parts > self.n_train)):
            raise EngineError("the pooled refinement counts are not what the sites' rows can give (sizes or signs)")
        table = counts.reshape(self.n_features, m)
        out = {}
        for i, (f, c) in enumerate(heavy):
            mine = parts[i * R:(i + 1) * R]
            if int(mine.sum()) != int(table[f, c]):
                raise EngineError(f"the pooled parts of feature {f}'s cell {c} do not add up to its pooled count: a "
                                  "site sent values its rows cannot give (a masked sum cannot say which)")
            out[(f, c)] = mine
        return out

    # -- early stopping ----------------------------------------------------------------------------
    def _evaluated(self, value, r: int) -> bool:
        """Record the pooled validation metric of the model after ``r`` rounds (nothing before round 1)."""
        if r == 0 or self.n_valid == 0:
            return False
        total = float(fixed_point.decode(value, self.eval_bits))
        # each site clips a row's term at row_eval before it encodes: a pooled loss outside [0, rows x that] is no
        # loss its rows can give (within it, a site can still move early stopping: SECURITY.md)
        if not 0 <= total <= self.n_valid * self.row_eval * (1 + 1e-9) + self.n_valid * 2.0 ** -self.eval_bits:
            raise EngineError("the pooled validation loss is outside what the pooled validation rows can give: a "
                              "site sent values its rows cannot give (a masked sum cannot say which)")
        self.history.append(objectives.metric(self.params.objective, total, self.n_valid))
        return True

    def _stops(self) -> bool:
        """XGBoost's rule: stop when the best of the rounds so far is ``early_stopping_rounds`` rounds old (the
        model keeps every round built, and names the best as XGBoost does)."""
        es = self.params.early_stopping_rounds
        if not es:
            return False
        self.best_iteration = int(np.argmin(self.history))  # the first of equal bests, as XGBoost keeps it
        return len(self.history) - 1 - self.best_iteration >= es

    # -- trees -------------------------------------------------------------------------------------
    def _root(self, k: int, summed) -> dict:
        """Group ``k``'s root from the round's sum: its totals and histogram, checked."""
        G = self.params.groups
        B = int(self.ptr[-1])
        v = np.asarray(summed, dtype=np.int64)
        if v.size != 1 + 3 * G + 3 * B * G:
            raise EngineError(f"the round's sum holds {v.size} values, not {1 + 3 * G + 3 * B * G}")
        total = tuple(int(x) for x in v[1 + 3 * k:4 + 3 * k])
        if total[0] != self.n_train:
            raise EngineError(f"the round's pooled rows ({total[0]}) are not the sketch's ({self.n_train}): a site sent "
                              "values its rows cannot give (a masked sum cannot say which)")
        hist = v[1 + 3 * G + 3 * B * k:1 + 3 * G + 3 * B * (k + 1)].reshape(3, B)
        self._check_node(hist, total, "the root")
        tree = {"nodes": {0: {"total": total, "hist": hist, "depth": 0}}, "n": 1}
        return tree

    def _levels(self, r: int, trees: list[dict]):
        """Grow every group's tree level by level (one aggregation a level); returns the finished trees."""
        p = self.params
        frontier = [[0] for _ in trees]
        for depth in range(p.max_depth):
            splits, build, children = [], [], []
            for k, tree in enumerate(trees):
                nxt = []
                for nid in sorted(frontier[k]):
                    node = tree["nodes"][nid]
                    split = formulas.best_split(*node["hist"], node["total"], self.ptr, self.reg, self.grad_bits,
                                                self._order)
                    if not formulas.expands(split, depth, p.max_depth, self.reg):
                        continue
                    left, right = tree["n"], tree["n"] + 1
                    tree["n"] += 2
                    lt, rt = split.left, split.right  # exact pooled (count, G, H) of each side
                    node.update(split=split, left=left, right=right)
                    tree["nodes"][left] = {"total": lt, "depth": depth + 1}
                    tree["nodes"][right] = {"total": rt, "depth": depth + 1}
                    splits.append({"group": k, "node": nid, "feature": split.feature, "bin": split.bin,
                                   "default_left": bool(split.default_left)})
                    small = left if lt[0] <= rt[0] else right
                    build.append({"group": k, "node": small})
                    children.append((k, nid, small, right if small == left else left))
                    nxt += [left, right]
                frontier[k] = nxt
            if not splits or depth + 1 >= p.max_depth:
                # the sites learn the last level's splits with the next request, to check the trees against
                self._last_splits = splits
                break
            summed = yield {"type": "level", "round": r, "depth": depth + 1, "splits": splits, "build": build}
            v = np.asarray(summed, dtype=np.int64)
            B = int(self.ptr[-1])
            if v.size != 3 * B * len(build):
                raise EngineError(f"the level's sum holds {v.size} values, not {3 * B * len(build)}")
            for j, (k, parent, small, other) in enumerate(children):
                nodes = trees[k]["nodes"]
                hist = v[3 * B * j:3 * B * (j + 1)].reshape(3, B)
                self._check_node(hist, nodes[small]["total"], f"round {r}, tree {k}, node {small}")
                sibling = nodes[parent]["hist"] - hist
                self._check_node(sibling, nodes[other]["total"], f"round {r}, tree {k}, node {other}")
                nodes[small]["hist"], nodes[other]["hist"] = hist, sibling
                nodes[parent].pop("hist")
        return [self._finish_tree(t) for t in trees]

    def _decoded_total(self, total):
        return total[0], float(fixed_point.decode(total[1], self.grad_bits)), \
            float(fixed_point.decode(total[2], self.grad_bits))

    def _check_node(self, hist, total, where: str) -> None:
        """The pooled histogram of a node against what its pooled rows allow (see the module's note). Counts are
        checked within the node's rows first (int64), the rest in float64, which cannot wrap around as int64 sums
        of a hostile site's values would (its slack, 2^-40 of a value, is far below one row's smallest step)."""
        C, G, H = hist
        c, g, h = (int(t) for t in total)
        bad = None
        if not 0 <= c <= self.n_train or np.any((C < 0) | (C > c)):
            bad = "a count beyond the node's rows"
        else:
            Cf, Gf, Hf = (np.asarray(x, dtype=np.float64) for x in (C, G, H))
            gmax, hmax = float(self.g_max_int) + 1.0, float(self.h_max_int) + 1.0
            if np.any(np.abs(Gf) > gmax * Cf * (1 + 1e-12)) or np.any(Hf < 0) or np.any(Hf > hmax * Cf * (1 + 1e-12)):
                bad = "a bin's gradient or hessian sum beyond its rows"
            else:
                ends = self.ptr
                csum = [np.concatenate([[0.0], np.cumsum(x)]) for x in (Cf, Gf, Hf)]
                mc, mg, mh = ((float(t) - (cs[ends[1:]] - cs[ends[:-1]])) for t, cs in zip((c, g, h), csum))
                slack = 1e-9 * (abs(float(g)) + abs(float(h)) + 1.0)
                if np.any(mc < 0) or np.any(np.abs(mg) > gmax * mc + slack) or np.any(mh < -slack) or \
                        np.any(mh > hmax * mc + slack):
                    bad = "a feature's bins that do not add up to the node"
        if bad:
            raise EngineError(f"the pooled histogram of {where} holds {bad}: a site sent values its rows cannot "
                              "give (a masked sum cannot say which)")

    def _finish_tree(self, tree: dict) -> dict:
        """XGBoost's arrays for one tree (node ids as XGBoost allocates them)."""
        n = tree["n"]
        arrays = {k: [0] * n for k in ("left_children", "right_children", "parents", "split_indices",
                                       "default_left")}
        arrays["left_children"] = [-1] * n
        arrays["right_children"] = [-1] * n
        arrays["parents"][0] = 2147483647
        floats = {k: [0.0] * n for k in ("split_conditions", "base_weights", "loss_changes", "sum_hessian")}
        for nid, node in tree["nodes"].items():
            _, G, H = self._decoded_total(node["total"])
            floats["sum_hessian"][nid] = float(np.float32(H))
            split = node.get("split")
            if split is None:  # a leaf: its value, eta included (XGBoost stores it as the leaf's base weight too)
                value = formulas.leaf_value(G, H, self.reg)
                floats["split_conditions"][nid] = value
                # an unsplit root keeps its unscaled weight as base weight (XGBoost's InitRoot)
                floats["base_weights"][nid] = float(formulas.calc_weight(G, H, self.reg)) if nid == 0 else value
                continue
            arrays["left_children"][nid], arrays["right_children"][nid] = node["left"], node["right"]
            arrays["parents"][node["left"]] = arrays["parents"][node["right"]] = nid
            arrays["split_indices"][nid] = split.feature
            arrays["default_left"][nid] = int(split.default_left)
            floats["split_conditions"][nid] = float(np.float32(self.cuts[split.feature][split.bin + 1]))
            floats["base_weights"][nid] = float(formulas.calc_weight(G, H, self.reg))
            floats["loss_changes"][nid] = float(split.loss_chg)
        return {**arrays, **floats}

    def model(self) -> dict:
        """The model as XGBoost's JSON document."""
        p = self.params
        doc = model_document(self.trees, self.tree_info, n_features=self.n_features, objective=p.objective,
                             num_class=p.num_class, base_score=self.base_score, feature_names=self.feature_names)
        if self.best_iteration is not None:
            doc["learner"].setdefault("attributes", {}).update(
                best_iteration=str(self.best_iteration), best_score=repr(float(self.history[self.best_iteration])))
        return doc
