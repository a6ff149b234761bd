"""One site's side of the engine: the sketch, then per boosting round its gradients (from the current model, by
XGBoost itself) and per tree level its gradient/hessian histograms, as integers for the masked sum. Imports no
NVFlare: the in-process driver and the FLARE executor both run it (``secure.SecureSite`` masks what it returns).

A site answers what its own plan allows, whatever the server asks (a field of a request is the server's word):
requests come in order (``seq``), each answered once; the plan (parameters, features) is fixed by the setup request;
cuts must be lattice edges, at most ``max_bin`` bins a feature; a level splits only the nodes of the level before,
each once, on a bin of the agreed cuts, and asks histograms only of the children it just made, at most one of each
split, above ``max_depth``; the trees that end a round must be the trees this site grew with the server (its splits
and the last level's, on the agreed cuts: only leaf values are the server's), and are checked as a model file
(``model_file``) before XGBoost reads them; a refused request changes nothing here.
"""

from __future__ import annotations

import numpy as np

from ...data import DataError
from ...trees.validate import PayloadError, check_int, check_number
from . import bins, fixed_point, objectives, site_ops
from .native_model import model_bytes, model_document
from .params import BoostParams

__all__ = ["HistSite"]


class HistSite:
    """A site's rows (X float32 with NaN for missing; y class codes or targets) and its validation rows."""

    def __init__(self, name: str, X, y, X_valid=None, y_valid=None, workers=0):
        """``workers``: where the row work runs (``crypto.workers.parse_workers``: 0/1 this process, N local
        processes, ``dask-local:N`` or the site's own ``dask://HOST:PORT``); the model is the same whichever."""
        self.name = str(name)
        self.workers = workers
        self.pool = None
        self.X = np.ascontiguousarray(X, dtype=np.float32)
        self.y = np.asarray(y)
        F = self.X.shape[1]
        self.X_valid = np.empty((0, F), np.float32) if X_valid is None else np.asarray(X_valid, np.float32)
        self.y_valid = np.empty(0) if y_valid is None else np.asarray(y_valid)
        self.params: BoostParams | None = None
        self._seq = -1
        self._state = "new"
        self.trees: list[dict] = []
        self.tree_info: list[int] = []
        self.round = -1
        self.refined: list = []  # the lattice cells this site counted in parts (bins.check_refine)

    # -- the protocol ------------------------------------------------------------------------------
    def handle(self, req) -> dict:
        """The reply to one request: a plain dict; ``values`` (int64) for the requests whose answers are summed."""
        if not isinstance(req, dict):
            raise PayloadError("request", "expected a dict")
        seq = check_int(req.get("seq"), "seq", lo=0)
        if seq != self._seq + 1:
            raise PayloadError("seq", f"request {seq} out of order: this site answered up to {self._seq}")
        kind = req.get("type")
        handler = {("new", "setup"): self._setup, ("setup", "sketch"): self._sketch,
                   ("sketched", "refine"): self._refine, ("sketched", "round"): self._round,
                   ("refined", "round"): self._round, ("round", "round"): self._round,
                   ("round", "level"): self._level, ("round", "finish"): self._finish}.get((self._state, kind))
        if handler is None:
            raise PayloadError("type", f"{str(kind)[:40]!r} is not a request this site answers now ({self._state})")
        try:
            reply = handler(req)
        except KeyError as exc:
            raise PayloadError(str(exc.args[0]) if exc.args else "request", "missing from the request") from None
        self._seq = seq
        return reply

    def _setup(self, req) -> dict:
        self.params = BoostParams.from_dict(req["params"])
        n_features = check_int(req["n_features"], "n_features", lo=1)
        if n_features != self.X.shape[1]:
            raise PayloadError("n_features", f"{n_features} features asked; this site's rows have {self.X.shape[1]}")
        self._check_labels()
        self._state = "setup"
        return {"n_features": n_features}

    def _check_labels(self) -> None:
        p = self.params
        for what, y in (("training", self.y), ("validation", self.y_valid)):
            y = np.asarray(y, dtype=np.float64)
            if not np.all(np.isfinite(y)):
                raise DataError(f"{self.name}: a {what} label is missing or not a number")
            if p.objective != "reg:squarederror":
                k = 2 if p.objective == "binary:logistic" else p.num_class
                if np.any((y != np.round(y)) | (y < 0) | (y >= k)):
                    raise DataError(f"{self.name}: a {what} label is not a class code 0..{k - 1}")
        if len(self.y) != len(self.X) or len(self.y_valid) != len(self.X_valid):
            raise DataError(f"{self.name}: rows and labels differ in number")
        for what, X in (("training", self.X), ("validation", self.X_valid)):
            bad = np.argwhere(np.isinf(X))
            if len(bad):  # row and column, never the value
                raise DataError(f"{self.name}: {what} row {int(bad[0][0]) + 1}, feature {int(bad[0][1])}: an "
                                "infinite value (missing values are NaN)")

    def _label_part(self, y) -> np.ndarray:
        p = self.params
        if p.objective == "binary:logistic":
            return np.array([int(np.sum(y))], dtype=np.int64)
        if p.objective == "multi:softprob":
            return np.bincount(np.asarray(y, dtype=np.int64), minlength=p.num_class).astype(np.int64)
        if np.max(np.abs(y), initial=0.0) * max(len(y), 1) > 2.0 ** (61 - fixed_point.LABEL_BITS):
            raise DataError(f"{self.name}: labels too large for the label sum (at most 2^41 in all)")
        cells = bins.cell_of(y)
        return np.concatenate([[int(np.sum(fixed_point.encode(y, fixed_point.LABEL_BITS)))],
                               np.bincount(cells, minlength=bins.n_cells())]).astype(np.int64)

    def _sketch(self, req) -> dict:
        self._state = "sketched"
        values = np.concatenate([[len(self.y), len(self.y_valid)], self._label_part(self.y),
                                 bins.sketch_counts(self.X)]).astype(np.int64)
        return {"values": values}

    def _refine(self, req) -> dict:
        self.refined = bins.check_refine(req["cells"], self.X.shape[1], self.params.max_bin, PayloadError)
        self._state = "refined"
        return {"values": bins.refine_counts(self.X, self.refined)}

    # -- boosting rounds ---------------------------------------------------------------------------
    def _start(self, req) -> None:
        """The first round's settings, every one checked before anything is kept or started."""
        from ...crypto.workers import make_pool

        p = self.params
        cuts = bins.check_cuts(req["cuts"], self.X.shape[1], p.max_bin, PayloadError, self.refined)
        base_score = check_number(req["base_score"], "base_score")
        if p.objective == "binary:logistic" and not 0 < base_score < 1:
            raise PayloadError("base_score", "must be in (0, 1) for binary:logistic")
        grad_bits = check_int(req["grad_bits"], "grad_bits", lo=fixed_point.MIN_GRAD_BITS, hi=fixed_point.MAX_GRAD_BITS)
        eval_bits = check_int(req["eval_bits"], "eval_bits", lo=fixed_point.MIN_EVAL_BITS, hi=fixed_point.EVAL_BITS)
        g_bound = check_number(req["g_bound"], "g_bound", nonnegative=True)
        self.cuts, self.base_score, self.grad_bits, self.eval_bits, self.g_bound = \
            cuts, base_score, grad_bits, eval_bits, g_bound
        self.ptr = np.concatenate([[0], np.cumsum([max(len(c) - 1, 0) for c in self.cuts])]).astype(np.int64)
        binned = bins.bin_matrix(self.X, self.cuts)
        self.pool = make_pool(self.workers, site_ops.MODULES)
        self.blocks = np.array_split(np.arange(len(self.y)), self.pool.n)
        self.pool.map("engine_rows", [{"rows": len(b), "features": binned.shape[1]} for b in self.blocks],
                      [[np.ascontiguousarray(binned[b]).tobytes()] for b in self.blocks])
        self._dtrain = self._dvalid = self._dtrain_margin = self._dvalid_margin = None

    def _round(self, req) -> dict:
        p = self.params
        r = check_int(req["round"], "round", lo=0, hi=p.rounds - 1)
        if r != self.round + 1:
            raise PayloadError("round", f"round {r} asked after round {self.round}")
        if self._state in ("sketched", "refined"):
            self._start(req)
        self._end_round(req, required=r > 0)
        self.round = r
        margins = self._margins(self.X)
        g, h = objectives.gradients(p.objective, margins, self.y, p.groups)
        if p.objective == "reg:squarederror" and np.any(np.abs(g) > self.g_bound):
            raise DataError(f"{self.name}: a gradient is larger than the agreed bound {self.g_bound:g} (4 x the "
                            "largest label + 1); labels far from the others' make the bound too small")
        g_int, h_int = fixed_point.encode(g, self.grad_bits), fixed_point.encode(h, self.grad_bits)
        self.pool.map("engine_grads", [{"groups": p.groups}] * self.pool.n,
                      [[np.ascontiguousarray(g_int[b]).tobytes(), np.ascontiguousarray(h_int[b]).tobytes()]
                       for b in self.blocks])
        n = len(self.y)
        self.n_nodes = [1] * p.groups
        self.frontier = [{0} for _ in range(p.groups)]
        self.splits = [{} for _ in range(p.groups)]  # node -> (feature, bin, default_left, left, right)
        self.depth = 0
        self._state = "round"
        eval_int = self._eval_int()
        roots = self._work([], [[k, 0] for k in range(p.groups)])
        totals = [[n, int(g_int[:, k].sum()), int(h_int[:, k].sum())] for k in range(p.groups)]
        return {"values": np.concatenate([[eval_int], np.ravel(totals), roots]).astype(np.int64)}

    def _work(self, splits: list, build: list) -> np.ndarray:
        """The workers apply ``splits`` to their rows and return their blocks' histograms of ``build``, added."""
        args = {"splits": splits, "build": build, "ptr": [int(v) for v in self.ptr]}
        _, blobs = self.pool.map_reduce("engine_level", [args] * self.pool.n, None, "engine_sum", {})
        return np.frombuffer(blobs[0], dtype=np.int64).copy()

    def close(self) -> None:
        """Stop this site's workers (their processes or cluster state)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def _eval_int(self) -> int:
        p = self.params
        if len(self.y_valid) == 0:
            return 0
        # a row's term clipped where the server bounds the pooled loss (a validation label far from the training
        # labels would otherwise pass the fixed-point range)
        row_max = objectives.MAX_ROW_LOGLOSS if p.objective != "reg:squarederror" else self.g_bound ** 2
        total = objectives.eval_sum(p.objective, self._margins(self.X_valid, valid=True), self.y_valid, p.groups,
                                    row_max=row_max)
        return int(fixed_point.encode(total, self.eval_bits))

    def _finish(self, req) -> dict:
        self._end_round(req, required=False)
        self._state = "done"
        out = {"values": np.array([self._eval_int()], dtype=np.int64)}
        self.close()
        return out

    def _last_level(self, req, required: bool) -> None:
        """The round before's last level (its children are leaves: no histogram was asked) and its trees, checked
        against what this site grew."""
        trees = req["trees"]
        if not isinstance(trees, list) or not trees:
            if required:
                raise PayloadError("trees", f"expected the {self.params.groups} tree(s) of the round before")
            return
        if self.round < 0 or len(trees) != self.params.groups:
            raise PayloadError("trees", "no round to end, or not one tree a group")
        applied, _ = self._read_splits(req["last_splits"])
        self._commit(applied)
        self._check_structure(trees)

    def _end_round(self, req, required: bool) -> None:
        """The round before's last level and trees, all or nothing: a refused request changes nothing here."""
        kept = (getattr(self, "splits", None), getattr(self, "n_nodes", None), getattr(self, "frontier", None))
        kept = kept if kept[0] is None else ([dict(t) for t in kept[0]], list(kept[1]), kept[2])
        try:
            self._last_level(req, required)
            self._add_trees(req["trees"], required)
        except (PayloadError, DataError):
            self.splits, self.n_nodes, self.frontier = kept
            raise

    def _add_trees(self, trees, required: bool) -> None:
        """The trees of the round before, as the server built them (``required``: a round after the first; the last
        request may have none left), checked as a model file (``model_document`` runs ``model_file.check_model``)
        before XGBoost reads them; XGBoost then adds them onto this site's margins (``base_margin``: the same float32
        sums, in the same order, as a prediction of the whole model), so each round costs its own trees only."""
        import xgboost as xgb

        p = self.params
        if not isinstance(trees, list) or len(trees) not in ((p.groups,) if required else (0, p.groups)):
            raise PayloadError("trees", f"expected the {p.groups} tree(s) of the round before")
        if not trees:
            return
        try:
            doc = model_document(list(trees), list(range(p.groups)), n_features=self.X.shape[1],
                                 objective=p.objective, num_class=p.num_class, base_score=self.base_score)
        except (ValueError, TypeError, KeyError) as exc:
            raise PayloadError("trees", str(exc)[:300]) from None
        booster = xgb.Booster(model_file=bytearray(model_bytes(doc)))
        # one thread: XGBoost's OpenMP threads spin while they wait, and several sites (or a site beside its own
        # workers) on a few cores then slow each other down many times over
        booster.set_param({"nthread": 1})
        for key, X in (("_dtrain", self.X), ("_dvalid", self.X_valid)):
            margins = self._margin_of(key, X)
            if len(X):
                d = self._dmatrix(key, X)
                d.set_base_margin(margins.ravel())
                out = booster.predict(d, output_margin=True)
                setattr(self, key + "_margin", np.asarray(out, dtype=np.float32).reshape(len(X), p.groups))
        self.trees += list(trees)
        self.tree_info += list(range(p.groups))

    def model(self) -> dict:
        """This site's copy of the model (XGBoost's JSON document)."""
        return model_document(self.trees, self.tree_info, n_features=self.X.shape[1],
                              objective=self.params.objective, num_class=self.params.num_class,
                              base_score=self.base_score)

    def _margin_of(self, key: str, X) -> np.ndarray:
        """The current model's margins for the training (``_dtrain``) or validation rows: n x groups, float32."""
        p = self.params
        if getattr(self, key + "_margin", None) is None:  # no tree yet: every row at the base margin
            setattr(self, key + "_margin", np.full((len(X), p.groups),
                                                   objectives.base_margin_of(p.objective, self.base_score),
                                                   np.float32))
        return getattr(self, key + "_margin")

    def _dmatrix(self, key: str, X):
        import xgboost as xgb

        if getattr(self, key, None) is None:
            setattr(self, key, xgb.DMatrix(X, missing=np.nan, nthread=1))
        return getattr(self, key)

    def _margins(self, X, valid: bool = False) -> np.ndarray:
        return self._margin_of("_dvalid" if valid else "_dtrain", X)

    # -- tree levels -------------------------------------------------------------------------------
    def _level(self, req) -> dict:
        p = self.params
        if check_int(req["round"], "round") != self.round:
            raise PayloadError("round", "is not this round")
        depth = check_int(req["depth"], "depth", lo=1, hi=p.max_depth - 1)
        if depth != self.depth + 1:
            raise PayloadError("depth", f"level {depth} asked after level {self.depth}")
        splits, builds = req["splits"], req["build"]
        if not isinstance(splits, list) or not isinstance(builds, list) or not splits:
            raise PayloadError("splits", "expected a list of splits and a list of nodes to build")
        applied, pairs = self._read_splits(splits)
        asked = set()
        build = []
        for i, b in enumerate(builds):
            if not isinstance(b, dict) or set(b) != {"group", "node"}:
                raise PayloadError(f"build[{i}]", "expected group and node")
            k = check_int(b["group"], f"build[{i}].group", lo=0, hi=p.groups - 1)
            node = check_int(b["node"], f"build[{i}].node", lo=0)
            if (k, node) not in pairs or pairs[(k, node)] in asked:
                raise PayloadError(f"build[{i}]", "is not a child of this level's splits, or its sibling was asked")
            asked.add(pairs[(k, node)])
            build.append([k, node])
        self._commit(applied)  # only a request checked whole changes this site's trees
        self.depth = depth
        return {"values": self._work(applied, build)}

    def _read_splits(self, splits) -> tuple[list, dict]:
        """The level's splits checked (each of a node of the level before, once, on a bin of the agreed cuts), with
        the child ids XGBoost gives them; nothing is changed yet: ([k, node, f, bin, default_left, left, right], {child:
        parent})."""
        p = self.params
        if not isinstance(splits, list):
            raise PayloadError("splits", "expected a list")
        n_nodes, seen, applied, pairs = list(self.n_nodes), set(), [], {}
        for i, s in enumerate(splits):
            if not isinstance(s, dict) or set(s) != {"group", "node", "feature", "bin", "default_left"}:
                raise PayloadError(f"splits[{i}]", "expected group, node, feature, bin, default_left")
            k = check_int(s["group"], f"splits[{i}].group", lo=0, hi=p.groups - 1)
            node = check_int(s["node"], f"splits[{i}].node", lo=0)
            if node not in self.frontier[k] or (k, node) in seen:
                raise PayloadError(f"splits[{i}].node", "is not a node of the level before, or was split already")
            seen.add((k, node))
            f = check_int(s["feature"], f"splits[{i}].feature", lo=0, hi=self.X.shape[1] - 1)
            b = check_int(s["bin"], f"splits[{i}].bin", lo=-1, hi=int(self.ptr[f + 1] - self.ptr[f]) - 1)
            if not isinstance(s["default_left"], bool):
                raise PayloadError(f"splits[{i}].default_left", "expected true or false")
            left, right = n_nodes[k], n_nodes[k] + 1  # XGBoost numbers children as it allocates them
            n_nodes[k] += 2
            applied.append([k, node, f, b, int(s["default_left"]), left, right])
            pairs[(k, left)] = pairs[(k, right)] = (k, node)
        return applied, pairs

    def _commit(self, applied) -> None:
        frontier = [set() for _ in range(self.params.groups)]
        for k, node, f, b, default_left, left, right in applied:
            self.splits[k][node] = (f, b, default_left, left, right)
            self.n_nodes[k] = max(self.n_nodes[k], right + 1)
            frontier[k].update((left, right))
        self.frontier = frontier

    def _check_structure(self, trees) -> None:
        """The server's trees must be the trees this site grew with it: the splits it applied (and the last level's,
        which the request carries), each on its agreed cut, XGBoost's node ids; only leaf values and statistics are
        the server's. A tree of other thresholds would count rows on cuts nobody agreed."""
        for k, tree in enumerate(trees):
            if not isinstance(tree, dict):
                raise PayloadError(f"trees[{k}]", "expected a dict")
            n = self.n_nodes[k]
            left, right, index, cond, dflt = [-1] * n, [-1] * n, [0] * n, [None] * n, [0] * n
            for node, (f, b, d, lo, hi) in self.splits[k].items():
                left[node], right[node], index[node], dflt[node] = lo, hi, f, d
                cond[node] = float(np.float32(self.cuts[f][b + 1]))
            try:
                same = (list(tree["left_children"]) == left and list(tree["right_children"]) == right and
                        [int(v) for v in tree["split_indices"]] == index and
                        [int(v) for v in tree["default_left"]] == dflt and len(tree["split_conditions"]) == n and
                        all(c is None or float(np.float32(v)) == c for v, c in zip(tree["split_conditions"], cond)))
            except (KeyError, TypeError, ValueError):
                same = False
            if not same:
                raise PayloadError(f"trees[{k}]", "is not the tree this site grew with the server (its splits, on "
                                                  "the agreed cuts)")
