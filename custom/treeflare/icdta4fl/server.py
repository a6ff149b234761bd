"""ICDTA4FL's server, written once: a generator of tasks that the FLARE controller and the in-process driver both run.

train -> every tree to every site -> peer scores -> filter -> aggregate (the paper's one-round tree)
-> [refinement: the one-round tree scored by the sites (the start: the better of it and the best selected local
    tree); a tree grown from the root a level a round (the default, ``grow``), or the start grown further
    (``refine_from="one_round"``), on class counts summed over all sites, pairwise-masked so that the server learns
    only the sums, and adopted only if the sites' validation rows score it at least as well as the start, one site's
    word counting no more than the others']
-> global tree to every site -> global evaluation.

``ICDTA4FLServer.run`` yields an :class:`Ask` (a task for some sites; it is sent back a dict site -> the reply as
received, or a string saying why there is none) or a :class:`Note` (a progress line; sent back None), and returns
(final model, one-round model). Every reply is checked here, against the server's own schema and plan, so the
checks are the same whoever routes the messages. A site whose reply is missing or invalid is dropped with its reason
(each phase's reason kept), and the protocol goes on while ``min_clients`` sites remain; otherwise
:class:`ProtocolFailed`. A site that says its data is missing or unreadable (its operator's configuration, a reason
made by :func:`failure_reason`) ends the protocol, naming it, unless ``min_clients`` was given: with
``min_clients=None`` (the default) every site must load its data, and a site whose reply is missing or invalid is
still dropped while ``DEFAULT_MIN_CLIENTS`` valid sites remain. A refinement round that cannot complete keeps the tree
of the round before, with the reason.

No number a site declares is taken on its own word alone: its rows are bounded by every site's (``max_rows_ratio``
times their median), a tree's peer score is the mean of the sites' scores each clipped to the others' range, and a
refined tree is adopted only if its pooled change of validation score is not negative with each site's change
clipped to the range of the others' (``refine.adopt_refined``).

(Over 400 lines: one protocol's phases share the reply checks and the drop-a-site bookkeeping; the algorithms
themselves live in ``pipeline``, ``refine``, ``grow`` and ``payloads``.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..crypto import secagg
from ..data import DataError, Schema
from ..data.federation import natural_key
from . import grow, pipeline, refine
from .encoding import category_names, feature_space, threshold_bounds, tree_limits
from .model import GlobalTree
from .payloads import (MAX_SITE_ROWS, check_counts_reply, check_global_reply, check_key_reply, check_scores_reply,
                       check_summed_rows, check_train_reply, feature_totals, histograms_agree)
from .simplify import collapse_same_class
from .tasks import MIN_MASKING_SITES, PHASES, REFINE_COUNTS, SCORE_GLOBAL, SCORE_TREES, TRAIN
from ..trees.validate import PayloadError

__all__ = ["ICDTA4FLServer", "Ask", "Note", "ProtocolFailed", "DEFAULT_REFINE", "DEFAULT_MAX_ROWS_RATIO",
           "DEFAULT_MIN_CLIENTS", "MIN_MASKING_SITES", "SITE_DATA_FAILED", "check_refine_params", "failure_reason",
           "robust_peer_scores"]

DEFAULT_REFINE = {"rounds": None, "epsilon": None, "objective": refine.DEFAULT_OBJECTIVE, "adopt": "robust",
                  "grow_from": grow.DEFAULT_GROW_FROM}
# "robust": each site's change of validation score clipped to the others' range (no one site's word adopts a tree);
# "pooled": the plain change pooled by every site's validation rows, the rule before issue 33, for a federation whose
# sites all trust one another (it takes every site's word: SECURITY.md)
ADOPT_RULES = ("robust", "pooled")
# A site may declare at most this many times the median of every site's training rows: a site that forges its rows
# by orders of magnitude to outweigh the others is refused at training. Honest partitions can be very unequal: the
# benchmarks' quantity skew (Dirichlet 0.5) reaches 25.4 x the median (adult, 10 sites, seed 1: 14,197 rows against a
# median of 558), so the default leaves a margin of 4; the job's --max-rows-ratio sets it. Within it, what a site's
# rows can still buy is bounded by the sum's checks and the adopt rule (SECURITY.md).
DEFAULT_MAX_ROWS_RATIO = 100.0
# the fewest valid sites the protocol goes on with when min_clients is not given (None)
DEFAULT_MIN_CLIENTS = 2
# how a reason starts when the site said its data is missing or unreadable (``failure_reason``)
SITE_DATA_FAILED = "site data missing or unreadable"
# what a valid reply to each task gave, for the phase's progress line
_VALID_REPLY = {TRAIN: "a valid tree", REFINE_COUNTS: "valid masked counts"}


def failure_reason(return_code, error: str = "", site_data: bool = False) -> str:
    """The reason a router hands the protocol for a site's error reply: its return code and its (redacted) error,
    led by ``SITE_DATA_FAILED`` when the site said its data is missing or unreadable (the executor's reply says so
    apart from its text, ``site_executor.FAILURE_KEY``)."""
    if site_data:
        return f"{SITE_DATA_FAILED}: {error or f'return code {return_code}'}"
    return f"return code {return_code}: {error}".strip()


def _site_said(site: str, reason: str) -> str:
    """What a site said of its missing data (the reason after ``SITE_DATA_FAILED``), led by its name."""
    text = reason[len(SITE_DATA_FAILED) + 2:].removeprefix("DataError: ")
    return text if text.startswith(f"{site}:") else f"{site}: {text}"


@dataclass(frozen=True)
class Ask:
    """A task for ``sites``; the driver sends back site -> its reply (a dict) or the reason there is none (a str)."""

    task: str
    data: dict
    sites: tuple
    phase: str


@dataclass(frozen=True)
class Note:
    """A progress line (``phase``: the line is one step of that phase)."""

    text: str
    phase: str | None = None


class ProtocolFailed(RuntimeError):
    """The protocol cannot go on; the message says why (which site, which task)."""


class _RoundFailed(RuntimeError):
    """A refinement round cannot complete; the tree of the round before stays."""


def check_refine_params(params: dict) -> dict:
    unknown = set(params) - set(DEFAULT_REFINE)
    if unknown:
        raise ValueError(f"unknown refinement parameters {sorted(unknown)}; known: {sorted(DEFAULT_REFINE)}")
    p = {**DEFAULT_REFINE, **params}
    if p["grow_from"] not in grow.GROW_FROM:
        raise ValueError(f"refinement grow_from must be one of {list(grow.GROW_FROM)}, got {p['grow_from']!r}")
    if p["rounds"] is None:  # each start's own default (one round on the one-round tree; a level a round from the root)
        p["rounds"] = grow.DEFAULT_ROUNDS[p["grow_from"]]
    rounds = p["rounds"]
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 0 <= rounds <= refine.MAX_REFINE_ROUNDS:
        raise ValueError(f"refinement rounds must be an integer in [0, {refine.MAX_REFINE_ROUNDS}], "
                         f"got {p['rounds']!r}")
    if p["grow_from"] == "root" and rounds == 1:
        raise ValueError("growth from the root takes at least 2 refinement rounds (the grid round and the last "
                         "round), or 0 for none")
    eps = p["epsilon"]
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1e6):
        raise ValueError(f"refinement epsilon must be a positive number, got {eps!r}")
    if p["objective"] not in refine.OBJECTIVES:
        raise ValueError(f"refinement objective must be one of {list(refine.OBJECTIVES)}, got {p['objective']!r}")
    if p["adopt"] not in ADOPT_RULES:
        raise ValueError(f"refinement adopt rule must be one of {list(ADOPT_RULES)}, got {p['adopt']!r}")
    return p


def robust_peer_scores(matrix) -> np.ndarray:
    """Per tree, the mean of the sites' scores of it (``matrix``: scorers x trees; NaN = no score), each score first
    clipped to the range of the other sites' scores of that tree (with at least three scores): one site scoring the
    others' trees 0 and its own 1 moves each mean only as far as the nearest honest score would. The paper's plain
    mean otherwise; on honest data the two differ only where one site's score stands outside all the others'."""
    m = np.asarray(matrix, dtype=np.float64)
    out = np.full(m.shape[1], np.nan)
    for j in range(m.shape[1]):
        values = m[np.isfinite(m[:, j]), j]
        if len(values) >= 3:
            values = np.array([min(max(v, np.delete(values, i).min()), np.delete(values, i).max())
                               for i, v in enumerate(values)])
        if len(values):
            out[j] = float(np.mean(values))
    return out


@dataclass
class ICDTA4FLServer:
    """The server's plan for one run (every option checked here, before any task), and its protocol (``run``).

    schema: the shared data schema; algorithm: "cart" or "id3"; local_params: the learner's parameters;
    selection: the peer-score filter (statistic, q, and ``score``: "clipped_mean" (default) or the paper's
    "mean" over every scorer); aggregation: merge/rebuild options (``pipeline.aggregate``); refine_params: rounds,
    epsilon, objective; min_clients: the fewest valid sites the protocol goes on with, even when some sites' data
    is missing (None, the default: every site must load its data, and ``DEFAULT_MIN_CLIENTS``); max_rows_ratio and
    max_site_rows: the bound on a site's declared rows (see ``DEFAULT_MAX_ROWS_RATIO``); job_info: facts copied into
    the result.
    """

    schema: Schema
    algorithm: str = "cart"
    local_params: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)
    aggregation: dict = field(default_factory=dict)
    refine_params: dict = field(default_factory=dict)
    min_clients: int | None = None
    max_rows_ratio: float = DEFAULT_MAX_ROWS_RATIO
    max_site_rows: int = MAX_SITE_ROWS
    job_info: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.schema, dict):
            self.schema = Schema.from_dict(self.schema)
        self.local_params = dict(self.local_params or {})
        self.selection = dict(self.selection or {})
        self.score_statistic = self.selection.pop("score", "clipped_mean")
        if self.score_statistic not in ("clipped_mean", "mean"):
            raise ValueError(f"selection score must be 'clipped_mean' or 'mean', got {self.score_statistic!r}")
        self.aggregation = dict(self.aggregation or {})
        self.refine = check_refine_params(dict(self.refine_params or {}))
        self.min_clients = None if self.min_clients is None else max(1, int(self.min_clients))
        # the fewest valid sites the protocol goes on with
        self.least_sites = DEFAULT_MIN_CLIENTS if self.min_clients is None else self.min_clients
        if isinstance(self.max_rows_ratio, bool) or not isinstance(self.max_rows_ratio, (int, float)) or \
                not 1 <= self.max_rows_ratio < float("inf"):
            raise ValueError(f"max_rows_ratio must be a number >= 1, got {self.max_rows_ratio!r}")
        self.max_site_rows = int(self.max_site_rows)
        if not 1 <= self.max_site_rows <= MAX_SITE_ROWS:
            raise ValueError(f"max_site_rows must be in [1, {MAX_SITE_ROWS}], got {self.max_site_rows}")
        self.names, self.kinds, self.n_categories = feature_space(self.schema, self.algorithm)
        local = {**pipeline.DEFAULT_LOCAL_PARAMS, **self.local_params}
        # what a site's tree may be: from the server's own schema and the requested depth only
        self.limits = tree_limits(self.schema, self.algorithm, max_depth=int(local["max_depth"]),
                                  n_bins=int(local["n_bins"]))
        # a bad budget fails here, before any task; a numeric leaf budget is announced to the sites with training
        self.leaf_budget = pipeline.check_aggregate_params(self.aggregation)["max_leaves"]
        self.category_names = category_names(self.schema, self.algorithm)
        if self.refine["rounds"] and self.refine["grow_from"] == "root":
            budget = self.leaf_budget
            if isinstance(budget, bool) or not isinstance(budget, int) or budget > grow.MAX_LEAF_BUDGET:
                # the sites count only on trees within 4 x an announced budget of at most MAX_LEAF_BUDGET leaves
                raise ValueError(f"growth from the root needs a leaf budget of at most {grow.MAX_LEAF_BUDGET} leaves "
                                 f"(--max-leaves), got {budget!r}; for a larger tree use --refine-from one_round or "
                                 f"--refine-rounds 0")
            if self.refine["epsilon"] is not None:
                # measured: noise on 3,500 lattice cells a column puts the quantile thresholds and the root split
                # outside the data, and the grown tree is never adopted, its 8 rounds of budget spent for nothing
                raise ValueError("growth from the root does not take --refine-epsilon (the noise drowns the grid "
                                 "round's lattice cells): use --refine-from one_round with it")
            # the grid round's cells, once: checked here, counted on in round 1
            self.grid = grow.grid_candidates(self.kinds, self.n_categories, threshold_bounds(self.schema,
                                                                                            self.algorithm))
            n_values = int(self.grid.offsets[-1]) * len(self.schema.classes)
            if n_values > refine.MAX_REFINE_VALUES:  # the sites would refuse the grid round: say so before any task
                raise ValueError(f"growth from the root: the grid round would ask every site for {n_values} counts "
                                 f"(the limit is {refine.MAX_REFINE_VALUES}: {len(self.names)} columns x "
                                 f"{len(self.schema.classes)} classes); use --refine-from one_round")

    def initial_result(self) -> dict:
        return {"algorithm": self.algorithm, **self.job_info, "dropped_sites": {}}

    # -- the protocol ------------------------------------------------------------------------------
    def run(self, result: dict, sites, server_test=None, verify=None):
        """The whole protocol over ``sites`` (their names), filling ``result``; ``server_test``: the server's own
        encoded test rows (X, y) or None; ``verify``: {job_id, root_ca, server_names} where the server has its kit's
        root CA: it then checks each site's signed tree and key as every site will, and drops a site whose own
        signatures fail at training (else the sites would refuse the list, and an honest site would look at fault).
        Yields ``Ask``/``Note``; returns (final model, one-round model)."""
        result.setdefault("dropped_sites", {})
        timings = result.setdefault("timings_s", {})
        sites = sorted(sites, key=natural_key)
        if len(sites) < self.least_sites:
            raise ProtocolFailed(f"{len(sites)} sites connected, min_clients is {self.least_sites}")
        rounds = self.refine["rounds"]

        t = time.perf_counter()
        task = {"schema": self.schema.to_dict(), "algorithm": self.algorithm, "params": self.local_params}
        if rounds:
            # the rounds, the noise and the leaf budget are announced up front: a site answers each round number
            # once, none beyond them, only with this noise, on trees within the budget; each site answers with its
            # signed masking key
            task["refine"] = {"rounds": rounds, "epsilon": self.refine["epsilon"], "grow_from": self.refine["grow_from"]}
            if isinstance(self.leaf_budget, int):
                task["refine"]["max_leaves"] = self.leaf_budget
        trained = yield from self._ask(result, TRAIN, task, sites, lambda r, s: self._check_train(r, s, verify))
        trained = self._bound_rows(result, trained)
        timings["local_training"] = time.perf_counter() - t
        sites = sorted(trained, key=natural_key)
        trees = [trained[s]["tree"] for s in sites]

        t = time.perf_counter()
        tree_dicts = [tr.to_dict() for tr in trees]
        peer_task = {"trees": tree_dicts, "owners": sites, "signatures": [trained[s]["tree_signature"] for s in sites]}
        scores = yield from self._ask(result, SCORE_TREES, peer_task, sites,
                                      lambda r, s: check_scores_reply(r, len(trees)))
        timings["peer_evaluation"] = time.perf_counter() - t
        scorers = sorted(scores, key=natural_key)
        acc = np.array([scores[s]["accuracy"] for s in scorers], dtype=np.float64)
        f1 = np.array([scores[s]["macro_f1"] for s in scorers], dtype=np.float64)
        # the filter's score per tree (one row): the mean of the sites' scores, each clipped to the others' range
        # (robust to one site's word), or the paper's plain mean
        score = robust_peer_scores if self.score_statistic == "clipped_mean" else _plain_mean
        score_acc, score_f1 = score(acc)[None, :], score(f1)[None, :]

        t = time.perf_counter()
        selected, thresholds = pipeline.select_trees(score_acc, score_f1, **self.selection, trees=tree_dicts)
        thresholds["score"] = self.score_statistic
        model, stats = self._aggregate(result, trees, selected, sites)
        model.set_data_schema(self.schema, self.algorithm)  # so the saved model takes raw rows
        timings["aggregation"] = time.perf_counter() - t
        selected = stats["selected"]
        yield Note(f"aggregation: {len(selected)} of {len(trees)} trees merged into the one-round tree "
                   f"({model.get_n_leaves()} leaves{_of_at_most(stats.get('max_leaves'))}, depth {model.get_depth()})")
        result.update({
            "n_sites": len(sites), "sites_trained": sites, "scorers": scorers,
            "selected_sites": [sites[i] for i in selected], "thresholds": thresholds,
            # the whole matrix too (rows: scorers, columns: trees), so the report page can show who scored whom
            "peer_scores": {"accuracy_mean": np.nanmean(acc, axis=0).tolist(),
                            "macro_f1_mean": np.nanmean(f1, axis=0).tolist(),
                            "accuracy": acc.tolist(), "macro_f1": f1.tolist(),
                            "statistic": self.score_statistic,
                            "accuracy_score": score_acc[0].tolist(), "macro_f1_score": score_f1[0].tolist()},
            "aggregation": stats,
            "sites": {s: {"n_train": trained[s]["n_train"], "n_test": trained[s]["n_test"],
                          "local": trained[s]["local"],
                          "tree": {"n_leaves": trees[i].n_leaves, "depth": trees[i].depth}}
                      for i, s in enumerate(sites)},
        })
        one_round = model
        result["one_round"] = _tree_summary(one_round.tree_, server_test, n_rules=stats.get("n_rules"))
        if rounds:
            model = yield from self._refinement(result, one_round, trees, selected, sites, scorers, acc, f1,
                                                score_acc, score_f1, trained, stats, server_test)

        t = time.perf_counter()
        global_scores = yield from self._ask(result, SCORE_GLOBAL, {"tree": model.tree_.to_dict()}, sites,
                                             lambda r, s: check_global_reply(r), required=1)
        for s, sc in global_scores.items():
            result["sites"][s]["global"] = {"accuracy": sc["accuracy"], "macro_f1": sc["macro_f1"]}
        timings["global_evaluation"] = time.perf_counter() - t
        result["global"] = {"n_leaves": int(model.get_n_leaves()), "depth": int(model.get_depth()),
                            "n_rules": int(stats.get("n_rules", model.get_n_leaves())) if not rounds else None}
        result["local_trees"] = {s: tree_dicts[i] for i, s in enumerate(sites)}
        if server_test is not None:
            _server_metrics(result, model, trees, sites, server_test)
        return model, one_round

    # -- refinement --------------------------------------------------------------------------------
    def _refinement(self, result, one_round, trees, selected, sites, scorers, acc, f1, score_acc, score_f1, trained,
                    stats, server_test):
        """Never worse than the pieces, then grown on masked summed counts; a refined tree is adopted only if the
        sites' validation rows score it at least as well (``refine.adopt_refined``). Returns the final model."""
        timings = result["timings_s"]
        eps, objective = self.refine["epsilon"], self.refine["objective"]
        info = {"rounds_requested": self.refine["rounds"], "epsilon": eps, "objective": objective,
                "aggregation": "pairwise-masked sum mod 2^64 (X25519, HKDF-SHA256, ChaCha20)",
                "key_authentication": None, "history": [], "adoption": []}
        result["refinement"] = info
        # 1. the tree a refinement would grow from (the one-round tree before same-class collapse: the same
        # predictions) scored on the sites' own validation rows; the sites count only on trees they have scored
        t = time.perf_counter()
        start_one_round = pipeline.refine_start(one_round)
        checked = yield from self._ask(result, SCORE_GLOBAL, {"tree": start_one_round.to_dict()}, sites,
                                       lambda r, s: check_global_reply(r), required=1,
                                       phase="one-round tree on the sites' validation rows")
        # the median over the sites: one site's word moves it only between honest scores
        merged = {m: float(np.median([checked[s][m] for s in checked])) for m in ("accuracy", "macro_f1")}
        fits = [j for j in selected if refine.within_budget(trees[j], stats["max_leaves"], stats["max_depth"])]
        best, why = refine.choose_start(merged, score_acc, score_f1, selected, capped=bool(stats["capped_steps"]),
                                        fits=fits)
        info["validation"] = {"one_round": merged}
        if best is None:
            start, info["start"], info["start_site"] = start_one_round, f"one-round tree ({why})", None
            previous = {s: checked[s] for s in checked}
        else:
            start, info["start"] = trees[best], f"best selected local tree, {sites[best]} ({why})"
            info["start_site"] = sites[best]
            # each site's own peer score of that tree, on its validation rows
            previous = {s: {"accuracy": acc[i][best], "macro_f1": f1[i][best]} for i, s in enumerate(scorers)}
        timings["refine_check"] = time.perf_counter() - t
        model = GlobalTree(collapse_same_class(start), list(self.schema.classes), self.names, self.category_names,
                           data_schema=self.schema, encoding=self.algorithm)

        # 2. who masks: the sites that scored, with a well-formed key (every site checks the certificates itself)
        records, excluded = {}, {}
        for s in sites:
            if s not in checked:
                continue
            if s in result["dropped_sites"]:  # it missed a task before masking (its reason is recorded there)
                excluded[s] = "dropped before masking"
                continue
            try:
                record = check_key_reply(trained[s].get("refine_key"), s)
            except PayloadError as exc:
                excluded[s] = str(exc)
                continue
            if record is None:
                excluded[s] = "sent no refinement key"
            else:
                records[s] = record
        # two sites announcing one key: every site would refuse the list, so both are left out before masking (a
        # site copying another's key can keep it out of the sum, never read it)
        announced = {}
        for s, record in records.items():
            announced.setdefault(bytes(np.asarray(record["public_key"], dtype=np.uint8)), []).append(s)
        for shared in (names for names in announced.values() if len(names) > 1):
            for s in shared:
                excluded[s] = f"announces the same public key as {', '.join(n for n in shared if n != s)}"
                records.pop(s, None)
        if excluded:
            info["excluded_sites"] = excluded
        contributors = sorted(records, key=natural_key)
        signed = all(records[s].get("certificate") is not None for s in contributors)
        info["key_authentication"] = (
            "certificates: every key is signed with a client site's certificate, each checked by every site"
            if contributors and signed else
            "none: keys unauthenticated (no startup kits, as in the simulator); a deviating server could substitute "
            "keys and unmask a site")
        if len(contributors) < MIN_MASKING_SITES:
            info["status"] = (f"skipped: {len(contributors)} sites with a refinement key; a site masks only in a sum "
                              f"of at least {MIN_MASKING_SITES} client sites: from fewer, the others' counts follow "
                              f"from the sum and its own")
            return model
        root = self.refine["grow_from"] == "root"
        if root:  # the grid round's public lattice first; the growth rounds' thresholds come from its sum
            candidates = self.grid
            tree = grow.root_tree(self.kinds, len(self.schema.classes), self.n_categories)
            depth = grow.grow_depth(self.refine["rounds"], self.aggregation.get("max_depth"))
        else:
            candidates = refine.candidates_from_trees(trees, feature_kinds=self.kinds, n_categories=self.n_categories,
                                                      bounds=threshold_bounds(self.schema, self.algorithm))
            tree, depth = start, stats["max_depth"]
        budget = {"max_leaves": stats["max_leaves"], "max_depth": depth}
        info.update(grow_from=self.refine["grow_from"], max_leaves=budget["max_leaves"], max_depth=depth, rounds=[])
        weights = self._validation_weights(trained, sites, capped=self.refine["adopt"] == "robust")
        info["status"] = "completed"
        last = self.refine["rounds"]
        for r in range(1, last + 1):
            t = time.perf_counter()
            left = [s for s in contributors if s in result["dropped_sites"]]
            if left:  # sites mask only with the first round's participants (a sum over fewer would be differenced)
                info["status"] = f"stopped at round {r}: {', '.join(left)} left after round {r - 1}"
                break
            try:
                if root:
                    # nothing left to split (the depth budget reached, every leaf pure or too small): the last round
                    final = r == last or (r > 1 and not grow.can_grow(tree, candidates, budget["max_depth"]))
                    tree, candidates, grown, entry = yield from self._growth_round(
                        result, r, final, tree, candidates, budget, contributors, records, trained)
                else:
                    grown, entry = yield from self._refine_round(result, r, tree, candidates, budget, contributors,
                                                                 records, trained)
                if grown is None:  # a growth round: its tree is a step, not a candidate; nothing to score
                    entry["seconds"] = time.perf_counter() - t
                    yield Note(f"refinement round {r}/{last}: grown to {entry['n_leaves']} leaves, depth "
                               f"{entry['depth']} ({entry['seconds']:.1f} s)")
                    continue
                # every candidate tree ("auto": both objectives') scored in one task on the sites' validation rows
                replies = yield from self._ask(
                    result, SCORE_TREES, {"trees": [g.to_dict() for g, _ in grown.values()]}, sites,
                    lambda rep, s: check_scores_reply(rep, len(grown)), required=1,
                    phase=f"refinement round {r}: refined trees on the sites' validation rows")
            except _RoundFailed as exc:
                info["status"] = f"stopped at round {r}: {exc}"
                break
            except ProtocolFailed as exc:
                info["status"] = f"stopped at round {r}: the refined tree could not be scored ({exc})"
                break
            scored = {o: {s: {m: rep[m][k] for m in ("accuracy", "macro_f1")} for s, rep in replies.items()}
                      for k, o in enumerate(grown)}
            won, why = refine.adopt_refined(scored, previous, weights, objective,
                                            robust=self.refine["adopt"] == "robust")
            info["adoption"].append({"round": r, "adopted": won is not None, "objective": won, "why": why})
            entry.update(grown[won or next(iter(grown))][1])
            entry["seconds"] = time.perf_counter() - t
            # the leaves as the tree is shown (the summary, the picture): same-class splits collapsed; the rounds
            # grow from the uncollapsed tree, which is what the budget bounds (``n_leaves_grown``)
            shown = collapse_same_class(grown[won or next(iter(grown))][0])
            entry.update(n_leaves_before=int(collapse_same_class(tree).n_leaves), n_leaves_grown=entry["n_leaves"],
                         n_leaves=int(shown.n_leaves), depth=int(shown.depth), max_leaves=budget["max_leaves"])
            if won is None:  # a worse tree (say, from one site's relabelled counts) never replaces the previous one
                info["status"] = f"stopped at round {r}: the refined tree was not adopted ({why})"
                info["not_adopted"] = entry
                break
            tree, previous = grown[won][0], scored[won]
            if server_test is not None:
                g = pipeline.score_trees([tree], *server_test)
                entry["accuracy"], entry["macro_f1"] = g["accuracy"][0], g["macro_f1"][0]
            info["history"].append(entry)
            acc_text = f", test accuracy {entry['accuracy']:.4f}" if "accuracy" in entry else ""
            yield Note(f"refinement round {r}/{last}: {entry['n_leaves']} leaves"
                       f"{_of_at_most(budget['max_leaves'])}, depth {entry['depth']}{acc_text} "
                       f"({entry['seconds']:.1f} s)")
            if root:  # the last round was run (early, where nothing was left to split)
                break
        adopted = [a for a in info["adoption"] if a["adopted"]]
        # from the root the rounds build one tree, adopted at the last round or not at all
        info["rounds_done"] = (len(info["rounds"]) if adopted else 0) if root else len(info["history"])
        info["cost"] = {"rounds": len(info["rounds"]),
                        "bytes_per_site": int(sum(e["bytes_per_site"] for e in info["rounds"])),
                        "seconds": float(sum(e.get("seconds", 0.0) for e in info["rounds"]))}
        timings["refinement"] = info["cost"]["seconds"]
        if root and not adopted:
            tree = start  # the start (one-round or best local tree) stays; the grown tree was only a step
        # collapsed once, at the end: a split whose children predict alike is what the next round grows from
        return GlobalTree(collapse_same_class(tree), list(self.schema.classes), self.names, self.category_names,
                          info={"refinement_rounds": info["rounds_done"], "start": info["start"]},
                          data_schema=self.schema, encoding=self.algorithm)

    def _count_round(self, result, r, tree, candidates, plan, contributors, records, trained):
        """One round's counts: every listed site's masked count vector for ``tree`` on ``candidates`` as ``plan``
        says, summed; the sum must hold exactly the declared rows, and every value of it must be in range.
        Returns the summed counts (without the last value, the rows that stop at an internal node) and the round's
        entry (its cost)."""
        eps = self.refine["epsilon"]
        n_values = plan.n_values + 1  # and the rows that stop at an internal node
        # from the root a site counts on the splits alone (its check needs no more; the pooled counts stay here)
        sent = grow.structure_only(tree) if self.refine["grow_from"] == "root" else tree
        task = {"tree": sent.to_dict(), "candidates": candidates.to_dict(), "plan": plan.to_dict(), "round": r,
                "epsilon": eps, "keys": [records[s] for s in contributors]}
        entry = {"round": r, "sites": len(contributors), "n_values": n_values, "bytes_per_site": 8 * n_values}
        result["refinement"]["rounds"].append(entry)  # every round asked, its cost too when it fails
        t = time.perf_counter()
        try:
            replies = yield from self._ask(result, REFINE_COUNTS, task, contributors,
                                           lambda rep, s: check_counts_reply(rep, n_values=n_values, round_no=r),
                                           required=len(contributors))
        except ProtocolFailed:
            missing = [s for s in contributors if s in result["dropped_sites"]]
            entry["failed"] = True
            raise _RoundFailed(f"{', '.join(missing)} sent no valid masked counts; the masks cancel only in the sum "
                               f"over every listed site (no secret-sharing recovery, by design), so the sum is "
                               f"unreadable") from None
        checked = {replies[s]["keys_checked"] for s in contributors}
        if checked != {"certificates"}:
            result["refinement"]["key_authentication"] = (
                "none: keys unauthenticated (no startup kits, as in the simulator); a deviating server could "
                "substitute keys and unmask a site")
        values = secagg.sum_masked([replies[s]["masked"] for s in contributors]).astype(np.float64)
        declared = sum(trained[s]["n_train"] for s in contributors)
        per_value = 0.0
        if eps is not None:  # every value of every site carries noise of at most `bound`
            per_value = float(len(contributors) * refine.noise_bound(eps, max(candidates.n_features, 1)))
        entry.update(site_mask_s_max=max(replies[s]["mask_s"] for s in contributors))
        try:
            check_summed_rows(values, plan, candidates, declared_rows=declared, per_value_noise=per_value)
            if eps is None and not histograms_agree(values[:-1], plan, candidates):
                raise PayloadError("sum", "inconsistent (a site sent counts outside its declared range)")
        except PayloadError as exc:
            entry["failed"] = True
            raise _RoundFailed(f"the summed counts are refused: {exc}") from None
        entry.update(counts_s=time.perf_counter() - t,
                     rows=float(feature_totals(values[:-1], plan, candidates)[0] + values[-1]))
        return values[:-1], entry

    def _refine_round(self, result, r, tree, candidates, budget, contributors, records, trained):
        """A round on the one-round tree: the sums, then the best tree one round can reach within the budget.
        Returns objective -> (grown tree, its stats) and the round's entry."""
        plan = refine.plan_round(tree, candidates, budget["max_depth"])
        values, entry = yield from self._count_round(result, r, tree, candidates, plan, contributors, records, trained)
        return self._last_trees(tree, candidates, plan, values, budget), entry

    def _last_trees(self, tree, candidates, plan, values, budget, **growth) -> dict:
        """objective -> (the round's tree within the budget, its stats); "auto": both trees from the one sum (no
        further release)."""
        objective = self.refine["objective"]
        return {o: refine.refine_tree(tree, candidates, plan, values, **budget, objective=o, collapse=False, **growth)
                for o in (refine.GROWN if objective == "auto" else (objective,))}

    def _growth_round(self, result, r, final, tree, candidates, budget, contributors, records, trained):
        """A round of growth from the root (``grow``): round 1 counts the root on the public lattice and fixes the
        thresholds of the rounds after it; every round but the last (``final``) splits the tree's leaves one level;
        the last is ``refine_tree`` within the budget. Returns the tree and candidates the next round counts on,
        objective -> (tree, stats) after the last round (None before), and the round's entry."""
        max_grown = grow.GROWN_LEAVES_FACTOR * budget["max_leaves"]
        if r == 1:
            plan = refine.RefinePlan((0,), (), tree.n_classes, int(candidates.offsets[-1]))
        elif not final:
            plan = grow.plan_growth(tree, candidates, budget["max_depth"], min_rows=2 * grow.GROW_MIN_CHILD_ROWS)
        else:
            plan = refine.plan_round(tree, candidates, budget["max_depth"], max_values=grow.GROWTH_ROUND_VALUES)
        values, entry = yield from self._count_round(result, r, tree, candidates, plan, contributors, records, trained)
        if final:
            grown = self._last_trees(tree, candidates, plan, values, budget, min_child=grow.GROW_MIN_CHILD_ROWS,
                                     min_child_share=0.0)
            return tree, candidates, grown, entry
        next_candidates = candidates
        if r == 1:  # the growth rounds' thresholds: the pooled quantiles of the grid round's sum
            next_candidates = grow.quantile_candidates(candidates, values.reshape(-1, tree.n_classes))
            # a column whose rows fill fewer than two lattice cells cannot be split (say, seconds since 1970)
            flat = [self.names[j] for j, t in enumerate(next_candidates.thresholds)
                    if t is not None and len(t) == 0 and grow.on_lattice(candidates.thresholds[j])]
            if flat:
                entry["columns_without_thresholds"] = flat
        grown_tree, stats = grow.grow_round(tree, candidates, plan, values, max_depth=budget["max_depth"],
                                            max_grown=max_grown)
        entry.update(stats)
        return grown_tree, next_candidates, None, entry

    # -- helpers ------------------------------------------------------------------------------------
    def _ask(self, result, name, data, sites, check, required=None, phase=None):
        """One task to ``sites``; keeps the valid replies, drops the others with their reason."""
        phase = phase or PHASES.get(name, name)
        if data.get("round"):
            phase = f"refinement round {data['round']}: {phase}"
        replies = yield Ask(name, data, tuple(sites), phase)
        valid, no_data = {}, {}
        for site in sites:
            reply = (replies or {}).get(site, "no reply")
            if isinstance(reply, str):
                reason = reply
                if reply.startswith(SITE_DATA_FAILED):
                    no_data[site] = reply
            else:
                try:
                    valid[site] = check(reply, site)
                    continue
                except (PayloadError, DataError, ValueError, TypeError, KeyError, AttributeError) as exc:
                    reason = f"invalid payload: {exc}"
            _drop(result, site, f"{name}: {reason}")
        failed = [s for s in sites if s not in valid]
        yield Note(f"{phase}: {len(valid)}/{len(sites)} sites gave {_VALID_REPLY.get(name, 'valid scores')}"
                   + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else ""), phase)
        if no_data and self.min_clients is None:
            # an operator's configuration error, not a hostile site: stop, naming it, rather than go on without it
            said = "; ".join(_site_said(s, r) for s, r in no_data.items())
            whose = "its" if len(no_data) == 1 else "their"
            raise ProtocolFailed(f"{name}: {', '.join(no_data)} could not load {whose} data ({said}); every site "
                                 f"must load its data: fix the site's data or its binding, or give min_clients "
                                 f"(--min-clients K) to go on with K sites or more")
        needed = self.least_sites if required is None else required
        if len(valid) < needed:
            raise ProtocolFailed(f"{name}: {len(valid)} valid replies, need {needed}; "
                                 f"dropped: {result['dropped_sites']}")
        return valid

    def _check_train(self, reply, site, verify) -> dict:
        """A training reply against the server's own schema, and the site's signed statements (tree and key) as the
        other sites will check them."""
        out = {**check_train_reply(reply, limits=self.limits), "refine_key": reply.get("refine_key")}
        signature = reply.get("tree_signature")
        if not isinstance(signature, dict) or set(signature) != {"site", "certificate", "signature"}:
            raise PayloadError("tree_signature", "expected a dict of site, certificate, signature")
        out["tree_signature"] = signature
        if verify and verify.get("root_ca") is not None:
            try:
                secagg.verify_tree_list([site], [pipeline.tree_digest(out["tree"])], [signature], site=site,
                                        own_digest=pipeline.tree_digest(out["tree"]), job_id=verify["job_id"],
                                        root_ca=verify["root_ca"], server_names=verify.get("server_names"))
                if out["refine_key"] is not None:
                    record = check_key_reply(out["refine_key"], site)
                    secagg.verify_key_list([record], site=site, own_public=np.asarray(record["public_key"]).tobytes(),
                                           job_id=verify["job_id"], root_ca=verify["root_ca"], min_sites=1,
                                           server_names=verify.get("server_names"))
            except secagg.SecAggError as exc:
                raise PayloadError("signatures", str(exc)) from None
        return out

    def _bound_rows(self, result, trained: dict) -> dict:
        """Drop a site whose declared training rows exceed ``max_site_rows`` or ``max_rows_ratio`` times the median of
        every site's (one site moves that median only between the others' values): its rows weigh its tree and bound
        its counts. Validation rows are not dropped for but capped (``_validation_weights``)."""
        declared = {s: v["n_train"] for s, v in trained.items()}
        limit = min(self.max_site_rows, self.max_rows_ratio * float(np.median(list(declared.values()))))
        out = dict(trained)
        for s, n in declared.items():
            if n > limit:
                _drop(result, s, f"{TRAIN}: n_train: {n} declared rows, more than {limit:g} (max_rows_ratio "
                                 f"{self.max_rows_ratio:g} x the sites' median, or max_site_rows {self.max_site_rows})")
                del out[s]
        if len(out) < self.least_sites:
            raise ProtocolFailed(f"{TRAIN}: {len(out)} sites within the row bounds, need {self.least_sites}; "
                                 f"dropped: {result['dropped_sites']}")
        return out

    def _validation_weights(self, trained, sites, capped: bool = True) -> dict:
        """Each site's validation rows as the adopt check weighs them, capped at the median of every site's (so a
        site's declared rows do not outweigh a typical site's); uncapped for the "pooled" rule."""
        declared = {s: trained[s]["n_test"] for s in sites}
        cap = float(np.median(list(declared.values()))) if capped else float("inf")
        return {s: min(float(n), cap) for s, n in declared.items()}

    def _aggregate(self, result, trees, selected, sites):
        """Aggregate the selected trees; a tree that cannot be used drops its site and the rest go on."""
        selected = list(selected)
        while True:
            try:
                return pipeline.aggregate(trees, selected, classes=list(self.schema.classes),
                                          feature_names=self.names, category_names=self.category_names,
                                          params=self.aggregation)
            except pipeline.UnusableTreeError as exc:
                _drop(result, sites[exc.position], f"aggregation: its tree cannot be used: {exc.reason}")
                selected = [i for i in selected if i != exc.position]
                if not selected:
                    raise ProtocolFailed(f"aggregation: no usable tree left; dropped: {result['dropped_sites']}") \
                        from None


def _of_at_most(max_leaves) -> str:
    """" of at most N" after a tree's leaves, for a leaf budget N (none without one)."""
    return f" of at most {max_leaves}" if isinstance(max_leaves, int) and not isinstance(max_leaves, bool) else ""


def _plain_mean(matrix) -> np.ndarray:
    """Per tree, the mean of the sites' scores (NaN: no score; a tree nobody scored stays NaN)."""
    m = np.asarray(matrix, dtype=np.float64)
    seen = np.isfinite(m).sum(axis=0)
    return np.where(seen > 0, np.nansum(m, axis=0) / np.maximum(seen, 1), np.nan)


def _drop(result: dict, site: str, reason: str) -> None:
    """Record why ``site`` was dropped; a site dropped in several phases keeps each phase's reason, in order."""
    dropped = result.setdefault("dropped_sites", {})
    dropped[site] = f"{dropped[site]}; {reason}" if site in dropped else reason


def _tree_summary(tree, server_test, n_rules=None) -> dict:
    out = {"n_leaves": int(tree.n_leaves), "depth": int(tree.depth)}
    if n_rules is not None:
        out["n_rules"] = int(n_rules)
    if server_test is not None:
        g = pipeline.score_trees([tree], *server_test)
        out.update({"accuracy": g["accuracy"][0], "macro_f1": g["macro_f1"][0]})
    return out


def _server_metrics(result, model, trees, sites, server_test):
    X, y = server_test
    g = pipeline.score_trees([model.tree_], X, y)
    result["global"].update({"accuracy": g["accuracy"][0], "macro_f1": g["macro_f1"][0], "n_test": len(y)})
    local = pipeline.score_trees(trees, X, y)
    acc, f1 = np.array(local["accuracy"]), np.array(local["macro_f1"])
    best = int(np.argmax(f1))
    result["baselines"] = {
        "mean_local": {"accuracy": float(acc.mean()), "macro_f1": float(f1.mean())},
        "best_local": {"accuracy": float(acc[best]), "macro_f1": float(f1[best]), "site": sites[best]},
        "local_on_global_test": {s: {"accuracy": float(acc[i]), "macro_f1": float(f1[i])}
                                 for i, s in enumerate(sites)},
    }
