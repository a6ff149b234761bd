"""ICDTA4FL's site, written once: train a local tree, score trees, and send masked class counts for refinement.
The FLARE executor and the in-process driver both run it; it imports no NVFlare.

Only trees, scores and masked count vectors leave the site, never rows. A site answers what its own plan allows,
whatever the server asks (a field in a task is the server's word, not a proof):
- scoring: only as many tasks as the plan announced with the training task, at most two trees a task after peer
  scoring (scores are counts over the validation rows);
- refinement counts: once per announced round, with the announced noise; for a tree this site has itself scored in
  this run (a local tree, the one-round tree or a refined tree), never an unseen probe; on the candidate splits it
  computes itself from the trees it scored and the schema; growing from the root (``grow``), for a single leaf on
  the public lattice in round 1, then only for the tree it counted on in the round before with leaves split once as
  growth splits them, within 4 x the announced leaf budget, on lattice thresholds fixed after round 2; masked with a key list it checks itself
  (``crypto.secagg``: client-site certificates from its own ``rootCA.pem``, at least ``MIN_MASKING_SITES`` sites,
  among ``allowed_sites`` when the site knows the job's sites, its own key unchanged, the same list every round).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Callable

import numpy as np

from ..crypto import secagg
from ..data import DataError, Schema
from ..trees.tree import NUMERIC, Tree
from ..trees.validate import PayloadError, check_int, check_number
from . import grow, pipeline, refine
from .encoding import feature_space, threshold_bounds
from .payloads import feature_totals
from .tasks import MIN_MASKING_SITES, REFINE_COUNTS, SCORE_GLOBAL, SCORE_TREES, TRAIN

__all__ = ["SiteProtocol", "ArrayLoader"]


class ArrayLoader:
    """A site's rows already encoded for the run's schema and learner: (X, y, X_test, y_test)."""

    def __init__(self, X, y, X_test, y_test):
        self.arrays = (np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64),
                       np.asarray(X_test, dtype=np.float64), np.asarray(y_test, dtype=np.int64))

    def __call__(self, schema: Schema, algorithm: str):
        return self.arrays


class SiteProtocol:
    """One site's side of one run.

    ``load(schema, algorithm)`` returns the site's encoded (X, y, X_test, y_test); ``identity`` is its
    ``secagg.SiteIdentity`` (None without a startup kit: keys unauthenticated, as in the simulator); ``job_id`` binds
    its keys to the run; ``allowed_sites``: the job's sites as this site knows them from something the server cannot
    rewrite alone (None: any client site of the project; see SECURITY.md).
    """

    def __init__(self, site: str, load: Callable, *, job_id: str, identity=None, allowed_sites=None):
        self.site, self.load, self.job_id, self.identity = str(site), load, str(job_id), identity
        self.allowed_sites = None if allowed_sites is None else frozenset(allowed_sites)
        self._test = None  # (X_test, y_test)
        self._train_data = None  # (X, y, feature kinds)
        self._schema, self._algorithm = None, None
        # announced with the training task, the site's own plan
        self._refine_rounds = 0
        self._refine_epsilon = None
        self._answered_rounds: set = set()
        self._masking = None  # this run's secagg.MaskingKeys
        self._participants = None  # the verified key list of the first round
        self._scorings = 0
        self._scored: set = set()  # digests of every tree this site scored in this run
        self._peer_trees = None  # the trees of peer scoring (their owners' own, signed): the candidates' only source
        self._own_digest = None
        self._refine_max_leaves = None  # the leaf budget announced with training, when a number
        self._grow_from = "one_round"
        self._counted = None  # (tree, candidates) this site counted on in its last round
        self._grid = None  # growth from the root: the grid round's cells (grow.grid_candidates)

    def handle(self, task: str, data) -> dict:
        """The reply (a plain dict) to one task; raises ``PayloadError``/``DataError``/``SecAggError`` to refuse."""
        handler = {TRAIN: self._train, SCORE_TREES: self._score_trees, SCORE_GLOBAL: self._score_global,
                   REFINE_COUNTS: self._refine_counts}.get(task)
        if handler is None:
            raise PayloadError("task", f"unknown task {task!r}")
        if not hasattr(data, "get"):
            raise PayloadError("task", f"expected a dict, got {type(data).__name__}")
        try:
            return handler(data)
        except KeyError as exc:  # a field the task lacks: the server's error, named as such
            raise PayloadError(str(exc.args[0]) if exc.args else "task", "missing from the task") from None

    # -- training ----------------------------------------------------------------------------------
    def _train(self, task) -> dict:
        if self._train_data is not None:
            # a second training task would start this site's plan (its scoring budget, its rounds, its noise) afresh
            raise PayloadError("task", "training was already answered in this run")
        schema = Schema.from_dict(task["schema"])
        algorithm = str(task["algorithm"])
        params = dict(task.get("params") or {})
        X, y, X_test, y_test = self.load(schema, algorithm)
        _, kinds, n_categories = feature_space(schema, algorithm)
        self._schema, self._algorithm = schema, algorithm
        self._test = (X_test, y_test)
        tree = pipeline.train_local_tree(X, y, algorithm=algorithm, n_classes=len(schema.classes),
                                         feature_kinds=kinds, n_categories=n_categories, params=params)
        local = pipeline.score_trees([tree], *self._test)
        self._own_digest = pipeline.tree_digest(Tree.from_dict(tree))
        reply = {"tree": tree, "n_train": len(y), "n_test": len(y_test),
                 "local": {"accuracy": local["accuracy"][0], "macro_f1": local["macro_f1"][0]},
                 # signed, so that peers score (and later count on) only trees their owners sent
                 "tree_signature": secagg.sign_tree(self.identity, self.job_id, self.site, self._own_digest)}
        self._train_data = (X, y, kinds)
        setup = task.get("refine")
        if isinstance(setup, dict):
            self._refine_rounds = check_int(setup.get("rounds"), "refine.rounds", lo=1, hi=refine.MAX_REFINE_ROUNDS)
            eps = setup.get("epsilon")
            self._refine_epsilon = None if eps is None else check_number(eps, "refine.epsilon")
            leaves = setup.get("max_leaves")
            self._refine_max_leaves = None if leaves is None else check_int(leaves, "refine.max_leaves", lo=1)
            grow_from = setup.get("grow_from", "one_round")  # a server before issue 35 refines the one-round tree
            if grow_from not in grow.GROW_FROM:
                raise PayloadError("refine.grow_from", f"must be one of {list(grow.GROW_FROM)}")
            self._grow_from = grow_from
            self._masking = secagg.MaskingKeys(self.site, self.job_id, self.identity)
            reply["refine_key"] = self._masking.record()
        return reply

    # -- scoring -----------------------------------------------------------------------------------
    def _count_scoring(self, n_trees) -> None:
        """Scores are counts over this site's validation rows, so a server sending crafted trees could read the rows
        back region by region: a site scores only what the plan announced with the training task asks for (peer
        scoring, the start check, one check per refinement round (growth from the root: one, of its last round), the
        final tree), and after peer scoring at most two trees a task (the 'auto' objective's pair)."""
        self._require_test()
        checks = 1 if self._grow_from == "root" else self._refine_rounds
        allowed = 2 + (1 + checks if self._refine_rounds else 0)
        if self._scorings >= allowed:
            raise PayloadError("task", f"this run's plan asks for {allowed} scoring tasks; this site answered them all")
        if self._scorings and n_trees > 2:
            raise PayloadError("trees", f"{n_trees} trees to score after peer scoring; the plan scores at most 2")
        self._scorings += 1

    def _require_test(self):
        if self._test is None:
            raise DataError("scoring asked before training in this run")
        return self._test

    def _parse_trees(self, payloads) -> list:
        kinds = self._train_data[2]
        return [Tree.from_dict(t, n_features=len(kinds), feature_kinds=kinds) for t in payloads]

    def _score_trees(self, task) -> dict:
        payloads = task["trees"]
        if not isinstance(payloads, list):
            raise PayloadError("trees", "expected a list of trees")
        peer_scoring = self._scorings == 0
        self._count_scoring(len(payloads))
        trees = self._parse_trees(payloads)
        if peer_scoring:  # the sites' own trees, each signed by its owner for this job: no tree of the server's
            identity = self.identity
            secagg.verify_tree_list(task.get("owners"), [pipeline.tree_digest(t) for t in trees], task.get("signatures"),
                                    site=self.site, own_digest=self._own_digest, job_id=self.job_id,
                                    root_ca=identity.root_ca if identity is not None else None,
                                    server_names=identity.server_names if identity is not None else None)
        scores = pipeline.score_trees(trees, *self._require_test())
        self._scored.update(pipeline.tree_digest(t) for t in trees)
        if peer_scoring:
            self._peer_trees = trees
        return {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"]}

    def _score_global(self, task) -> dict:
        self._count_scoring(1)
        X, y = self._require_test()
        tree = self._parse_trees([task["tree"]])[0]
        scores = pipeline.score_trees([tree], X, y)
        self._scored.add(pipeline.tree_digest(tree))
        return {"accuracy": scores["accuracy"][0], "macro_f1": scores["macro_f1"][0], "n_test": len(y)}

    # -- refinement rounds -------------------------------------------------------------------------
    @property
    def participants(self) -> list:
        """The sites this site's counts are summed with (its verified key list; empty before the first round)."""
        return sorted(self._participants or ())

    def _refine_counts(self, task) -> dict:
        """This site's class counts for the server's tree, masked so that only the sum over the listed sites is
        readable. The vector ends with one more value: this site's rows that stop at an internal node (counted
        nowhere), so that the server can check that the sum holds exactly the declared rows."""
        if self._train_data is None or self._masking is None:
            raise DataError("refinement asked before training in this run")
        round_no = self._check_round(task)
        if round_no in self._answered_rounds:
            # fresh noise or a second look at the same tree would let a curious server average or difference
            raise PayloadError("round", f"round {round_no} was already answered; a site sends its counts once")
        epsilon = task.get("epsilon")
        if (epsilon is None) != (self._refine_epsilon is None) or \
                (epsilon is not None and check_number(epsilon, "epsilon") != self._refine_epsilon):
            raise PayloadError("epsilon", "differs from the noise announced with the training task")
        keys = self._masking
        identity = keys.identity
        # a client site's certificate only: not the server's (its identity from this site's own kit), not an admin's
        peers = secagg.verify_key_list(task["keys"], site=keys.site, own_public=keys.public, job_id=keys.job_id,
                                       root_ca=identity.root_ca if identity is not None else None,
                                       server_names=identity.server_names if identity is not None else None,
                                       min_sites=MIN_MASKING_SITES, allowed_sites=self.allowed_sites)
        if self._participants is not None and peers != self._participants:
            # a sum over another set of sites, differenced with the first, would give one site's counts
            raise PayloadError("keys", "differ from the participants of this run's first round")
        X, y, kinds = self._train_data
        # codes bounded by this site's own schema, not by what the payload declares
        n_categories = feature_space(self._schema, self._algorithm)[2]
        tree = Tree.from_dict(task["tree"], n_features=X.shape[1], feature_kinds=kinds, n_categories=n_categories)
        if self._grow_from == "root":
            candidates = refine.SplitCandidates.from_dict(task["candidates"], feature_kinds=kinds,
                                                          max_thresholds=len(grow.lattice()))
            self._check_growth_tree(tree, candidates, round_no)
        else:
            if pipeline.tree_digest(tree) not in self._scored:
                # a tree nobody scored could be a probe cut around a handful of this site's rows
                raise PayloadError("tree", "is not a tree this site scored in this run")
            candidates = refine.SplitCandidates.from_dict(task["candidates"], feature_kinds=kinds)
            if candidates.to_dict() != self._own_candidates().to_dict():
                # thresholds chosen by the server alone could isolate rows; these come from trees every site was sent
                raise PayloadError("candidates", "differ from those of the trees this site scored and the schema")
            self._check_counted_tree(tree, candidates)
        plan = refine.RefinePlan.from_dict(task["plan"], tree=tree, candidates=candidates)
        counts = self._counts(tree, candidates, plan, X, y)
        if epsilon is not None:
            counts = refine.add_noise(counts, epsilon=epsilon, sensitivity=max(candidates.n_features, 1))
        t = time.perf_counter()
        # the masks are bound to the question: a server that asks sites about different trees or cells (so that one
        # site's counts stand alone in some cells of the sum) gets masks that do not cancel
        question = json.dumps([tree.to_dict(), candidates.to_dict(), plan.to_dict(), epsilon], sort_keys=True)
        masked = keys.mask(counts, peers, round_no, context=hashlib.sha256(question.encode()).digest())
        self._answered_rounds.add(round_no)
        self._participants = peers
        self._counted = (tree, candidates)
        return {"masked": masked, "round": round_no, "mask_s": time.perf_counter() - t,
                "keys_checked": "certificates" if identity is not None else "none"}

    def _counts(self, tree, candidates, plan, X, y) -> np.ndarray:
        """This site's count vector, then its rows counted nowhere (they stop at an internal node)."""
        counts = refine.count_vector(tree, candidates, plan, X, y)
        return np.append(counts, len(y) - int(feature_totals(counts, plan, candidates)[0]))

    def _check_counted_tree(self, tree, candidates) -> None:
        """A tree this site counts on splits only where the sites' own trees or the candidates do, and has at most
        the announced leaves: its leaves are boxes of cells every site has seen, never cut around a few rows."""
        known = {j: set() for j in range(tree.n_features)}
        for t in self._peer_trees:
            for v in np.flatnonzero(t.kind == NUMERIC):
                known[int(t.feature[v])].update(float(x) for x in t.split_points[v])
        for j, points in enumerate(candidates.thresholds):
            if points is not None:
                known[j].update(float(x) for x in points)
        for v in np.flatnonzero(tree.kind == NUMERIC):
            if not {float(x) for x in tree.split_points[v]} <= known[int(tree.feature[v])]:
                raise PayloadError("tree", f"node {int(v)} splits where no site's tree nor candidate does")
        if self._refine_max_leaves is not None and tree.n_leaves > self._refine_max_leaves:
            raise PayloadError("tree", f"{tree.n_leaves} leaves, over the {self._refine_max_leaves} announced")

    def _check_growth_tree(self, tree, candidates, round_no) -> None:
        """Growth from the root (``grow``): round 1 counts a single leaf on the public lattice (this site's own
        ``grow.grid_candidates``); every later round counts the tree this site counted on in the round before, with
        leaves split once on that round's candidates (``grow.extends``), on thresholds that are lattice points, the
        same every round after the first; and never more leaves than the growth allows for the announced budget."""
        if self._grid is None:  # the public lattice's cells for this schema, the same every round
            _, kinds, n_categories = feature_space(self._schema, self._algorithm)
            self._grid = grow.grid_candidates(kinds, n_categories, threshold_bounds(self._schema, self._algorithm))
        grid = self._grid
        if self._counted is None:
            if round_no != 1 or tree.n_nodes != 1:
                raise PayloadError("tree", "growth from the root starts with a single leaf in round 1")
            if candidates.to_dict() != grid.to_dict():
                raise PayloadError("candidates", "the grid round counts on the public lattice only")
            return
        before, before_candidates = self._counted
        most = grow.max_counted_leaves(self._refine_max_leaves)
        if most is None:  # no budget announced: no bound on how finely the boxes could be cut
            raise PayloadError("tree", "growth from the root needs a leaf budget announced with training")
        if tree.n_leaves > most:
            raise PayloadError("tree", f"{tree.n_leaves} leaves, over {grow.GROWN_LEAVES_FACTOR} x the "
                                       f"{min(self._refine_max_leaves, grow.MAX_LEAF_BUDGET)} announced (at most "
                                       f"{grow.MAX_LEAF_BUDGET})")
        if not grow.extends(tree, before, before_candidates):
            # a tree cut anywhere else could be a probe around a handful of this site's rows
            raise PayloadError("tree", "is not the tree of the round before with leaves split once on its candidates")
        for j, (points, allowed) in enumerate(zip(candidates.thresholds, grid.thresholds)):
            if not grow.on_lattice(allowed):  # a code or categorical column: the schema's cells
                same = (points is None and allowed is None) or (points is not None and allowed is not None
                                                                and np.array_equal(points, allowed))
                if not same or candidates.n_codes[j] != grid.n_codes[j]:
                    raise PayloadError(f"candidates[{j}]", "a code column's cells are the schema's")
            elif len(points) > grow.MAX_GRID_THRESHOLDS or not np.all(np.isin(points, allowed)):  # lattice points
                raise PayloadError(f"candidates.thresholds[{j}]", f"at most {grow.MAX_GRID_THRESHOLDS} lattice points")
        if before_candidates.to_dict() != grid.to_dict() and candidates.to_dict() != before_candidates.to_dict():
            raise PayloadError("candidates", "differ from the round before (they are fixed after the grid round)")

    def _own_candidates(self):
        if self._peer_trees is None:
            raise PayloadError("candidates", "refinement asked before peer scoring in this run")
        _, kinds, n_categories = feature_space(self._schema, self._algorithm)
        return refine.candidates_from_trees(self._peer_trees, feature_kinds=kinds, n_categories=n_categories,
                                            bounds=threshold_bounds(self._schema, self._algorithm))

    def _check_round(self, task) -> int:
        """The task's round number, within the rounds announced with the training task."""
        if not self._refine_rounds:
            raise PayloadError("round", "no refinement rounds were announced in this run")
        return check_int(task["round"], "round", lo=1, hi=self._refine_rounds)
