"""Server side of ICDTA4FL as an NVFlare workflow: the paper's single round, then refinement rounds.

train -> every tree to every site -> peer scores -> filter -> aggregate (the paper's one-round tree)
-> [refinement: the one-round tree scored by the sites; the better of it and the best selected local tree
    is grown on class counts summed over all sites, pairwise-masked so that the server learns only the sums,
    and adopted only if it scores at least as well on the sites' validation rows]
-> global tree to every site -> global evaluation.

Each reply is validated against the server's own schema; a site whose reply is missing or invalid is dropped
with its reason, and the job goes on while at least ``min_clients`` sites remain. A refinement round that
cannot complete (a listed site gone after masking, a sum that does not hold the declared rows, a refined tree
that scores lower) keeps the tree of the round before, with the reason.

(Over 400 lines: one workflow's phases share the reply checks and the drop-a-site bookkeeping; the
algorithms themselves live in the pure ``icdta4fl`` modules.)
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from nvflare.apis.controller_spec import Task
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable

from ...crypto import secagg
from ...data import DataError, Schema, read_site_csv
from ...data.federation import natural_key
from ...icdta4fl import pipeline, refine
from ...icdta4fl.encoding import category_names, encode, feature_space, threshold_bounds, tree_limits
from ...icdta4fl.export import export_text, plot_tree
from ...icdta4fl.model import GlobalTree
from ...icdta4fl.simplify import collapse_same_class
from ...icdta4fl.payloads import (check_counts_reply, check_global_reply, check_key_reply, check_scores_reply,
                                  check_summed_rows, check_train_reply, feature_totals,
                                  histograms_agree)
from ...reporting import write_text_atomic
from ...trees.validate import PayloadError
from ..progress import PROGRESS_ID
from ..workflow import JobFailed, ResultWorkflow
from .protocol import REFINE_COUNTS, SCORE_GLOBAL, SCORE_TREES, TRAIN

RESULT_FILE = "icdta4fl_result.json"
PHASES = {TRAIN: "local training", SCORE_TREES: "peer scoring", SCORE_GLOBAL: "global evaluation",
          REFINE_COUNTS: "masked counts"}
DEFAULT_REFINE = {"rounds": 1, "epsilon": None, "objective": refine.DEFAULT_OBJECTIVE}


class ICDTA4FLController(ResultWorkflow):
    JOB = "icdta4fl"
    RESULT_FILE = RESULT_FILE

    def __init__(self, schema: dict, algorithm: str = "cart", local_params: dict | None = None,
                 selection: dict | None = None, aggregation: dict | None = None, min_clients: int = 2,
                 task_timeout: int = 600, server_test: str = "", job_info: dict | None = None,
                 refine_params: dict | None = None):
        """
        Args:
            schema: the shared data schema (``Schema.to_dict()``): features, categories, classes.
            algorithm: "cart" or "id3" for the local trees.
            local_params: learner parameters (max_depth, criterion, min_samples_split, ...).
            selection: peer-score filter (statistic "percentile"|"mean"|"median", q).
            aggregation: merge/rebuild options (max_leaves, max_depth, max_rules, ...; see pipeline.aggregate).
            min_clients: fewest valid sites the job goes on with.
            task_timeout: seconds each site has per task.
            server_test: the server's own global test CSV (optional), for global metrics.
            job_info: free-form facts copied into the result (dataset, partition).
            refine_params: refinement rounds (``rounds``, 0 = the paper's one-round method) and optional
                differential-privacy ``epsilon`` per round; ``objective`` "accuracy" (default), "balanced"
                (classes weighted inversely to their pooled totals; see ``refine.refine_tree``) or "auto" (both
                trees grown each round, the sites' validation rows pick one: ``refine.adopt_refined``).
        """
        super().__init__()
        # NVFlare writes the job config from attributes named like the arguments: keep those as given.
        self.schema = schema
        self._schema = Schema.from_dict(schema)
        self.algorithm = algorithm
        self.local_params = dict(local_params or {})
        self.selection = dict(selection or {})
        self.aggregation = dict(aggregation or {})
        self.min_clients = max(1, int(min_clients))
        self.task_timeout = int(task_timeout)
        self.server_test = server_test
        self.job_info = dict(job_info or {})
        self.refine_params = dict(refine_params or {})
        self._refine = _check_refine_params(self.refine_params)
        self.names, self.kinds, self.n_categories = feature_space(self._schema, algorithm)
        local = {**pipeline.DEFAULT_LOCAL_PARAMS, **self.local_params}
        # what a site's tree may be: from the server's own schema and the requested depth only
        self.limits = tree_limits(self._schema, algorithm, max_depth=int(local["max_depth"]),
                                  n_bins=int(local["n_bins"]))
        pipeline.check_aggregate_params(self.aggregation)  # a bad budget fails here, before any task
        # codes (ID3's categories, ordinal columns) are shown by their names in rules text and pictures
        self.category_names = category_names(self._schema, algorithm)

    def initial_result(self) -> dict:
        return {**super().initial_result(), "algorithm": self.algorithm, **self.job_info, "dropped_sites": {}}

    # -- the protocol ----------------------------------------------------------------------
    def run_workflow(self, result, run_dir: Path, abort_signal, fl_ctx):
        timings = result["timings_s"]
        sites = sorted((c.name for c in fl_ctx.get_engine().get_clients()), key=natural_key)
        if len(sites) < self.min_clients:
            raise JobFailed(f"{len(sites)} sites connected, min_clients is {self.min_clients}")
        rounds = self._refine["rounds"]

        t = time.perf_counter()
        task = {"schema": self._schema.to_dict(), "algorithm": self.algorithm, "params": self.local_params}
        if rounds:
            # the rounds and the noise are announced up front: a site answers each round number once, none beyond
            # them, and only with this noise; each site answers with its signed masking key
            task["refine"] = {"rounds": rounds, "epsilon": self._refine["epsilon"]}
        trained = self._ask(TRAIN, task, sites, result, abort_signal, fl_ctx,
                            lambda r: {**check_train_reply(r, limits=self.limits), "refine_key": r.get("refine_key")})
        timings["local_training"] = time.perf_counter() - t
        sites = sorted(trained, key=natural_key)
        trees = [trained[s]["tree"] for s in sites]

        t = time.perf_counter()
        tree_dicts = [tr.to_dict() for tr in trees]
        score_task = {"trees": tree_dicts, "owners": sites}
        scores = self._ask(SCORE_TREES, score_task, sites, result, abort_signal, fl_ctx,
                           lambda r: check_scores_reply(r, len(trees)))
        timings["peer_evaluation"] = time.perf_counter() - t
        scorers = sorted(scores, key=natural_key)
        acc = np.array([scores[s]["accuracy"] for s in scorers])
        f1 = np.array([scores[s]["macro_f1"] for s in scorers])

        t = time.perf_counter()
        selected, thresholds = pipeline.select_trees(acc, f1, **self.selection, trees=tree_dicts)
        model, stats = self._aggregate(trees, selected, sites, result, fl_ctx)
        model.set_data_schema(self._schema, self.algorithm)  # so the saved model takes raw rows
        timings["aggregation"] = time.perf_counter() - t
        selected = stats["selected"]
        self._progress(fl_ctx, f"aggregation: {len(selected)} of {len(trees)} trees merged into the one-round tree "
                               f"({model.get_n_leaves()} leaves, depth {model.get_depth()})")

        result.update({
            "n_sites": len(sites), "sites_trained": sites, "scorers": scorers,
            "selected_sites": [sites[i] for i in selected], "thresholds": thresholds,
            # the whole matrix too (rows: scorers, columns: trees), so the report page can show who scored whom
            "peer_scores": {"accuracy_mean": acc.mean(axis=0).tolist(), "macro_f1_mean": f1.mean(axis=0).tolist(),
                            "accuracy": acc.tolist(), "macro_f1": f1.tolist()},
            "aggregation": stats,
            "sites": {s: {"n_train": trained[s]["n_train"], "n_test": trained[s]["n_test"],
                          "local": trained[s]["local"],
                          "tree": {"n_leaves": trees[i].n_leaves, "depth": trees[i].depth}}
                      for i, s in enumerate(sites)},
        })
        server_test = self._read_server_test()
        one_round = model
        result["one_round"] = self._tree_summary(one_round.tree_, server_test, n_rules=stats.get("n_rules"))
        if rounds:
            model = self._refinement(one_round, trees, selected, sites, scorers, acc, f1, trained, stats,
                                     server_test, result, abort_signal, fl_ctx)
            one_round.save_json(run_dir / "global_tree_one_round.json")
        model.save_json(run_dir / "global_tree.json")
        write_text_atomic(run_dir / "rules.txt", export_text(model))
        try:
            plot_tree(model, run_dir / "global_tree.png")
        except Exception as exc:  # a picture must never cost the model
            self.log_warning(fl_ctx, f"could not draw the global tree: {exc}")

        t = time.perf_counter()
        global_scores = self._ask(SCORE_GLOBAL, {"tree": model.tree_.to_dict()}, sites, result, abort_signal,
                                  fl_ctx, check_global_reply, required=1)
        for s, sc in global_scores.items():
            result["sites"][s]["global"] = {"accuracy": sc["accuracy"], "macro_f1": sc["macro_f1"]}
        timings["global_evaluation"] = time.perf_counter() - t
        result["global"] = {"n_leaves": int(model.get_n_leaves()), "depth": int(model.get_depth()),
                            "n_rules": int(stats.get("n_rules", model.get_n_leaves())) if not rounds else None}
        result["local_trees"] = {s: tree_dicts[i] for i, s in enumerate(sites)}
        if server_test is not None:
            self._server_metrics(result, model, trees, sites, server_test)

    # -- refinement --------------------------------------------------------------------------
    def _refinement(self, one_round, trees, selected, sites, scorers, acc, f1, trained, stats, server_test, result,
                    abort_signal, fl_ctx) -> GlobalTree:
        """Never worse than the pieces, then grown on masked summed counts; a refined tree is adopted only if it
        scores at least as well on the sites' validation rows. Returns the final model."""
        timings = result["timings_s"]
        eps = self._refine["epsilon"]
        objective = self._refine["objective"]
        info = {"rounds_requested": self._refine["rounds"], "epsilon": eps, "objective": objective,
                "aggregation": "pairwise-masked sum mod 2^64 (X25519, HKDF-SHA256, ChaCha20)",
                "key_authentication": None, "history": [], "adoption": []}
        result["refinement"] = info
        # 1. the one-round tree against the selected local trees, on the sites' own validation data
        t = time.perf_counter()
        checked = self._ask(SCORE_GLOBAL, {"tree": one_round.tree_.to_dict()}, sites, result, abort_signal,
                            fl_ctx, check_global_reply, required=1, phase="one-round tree on the sites' validation rows")
        common = [i for i, s in enumerate(scorers) if s in checked]
        merged = {m: float(np.mean([checked[scorers[i]][m] for i in common])) if common else -1.0
                  for m in ("accuracy", "macro_f1")}
        fits = [j for j in selected if refine.within_budget(trees[j], stats["max_leaves"], stats["max_depth"])]
        best, why = refine.choose_start(merged, acc[common], f1[common], selected, capped=bool(stats["capped_steps"]),
                                        fits=fits)
        info["validation"] = {"one_round": merged}
        if best is None:
            start, info["start"] = pipeline.refine_start(one_round), f"one-round tree ({why})"
            previous = {s: checked[s] for s in checked}
        else:
            start, info["start"] = trees[best], f"best selected local tree, {sites[best]} ({why})"
            previous = {s: {"accuracy": acc[i][best], "macro_f1": f1[i][best]} for i, s in enumerate(scorers)}
        timings["refine_check"] = time.perf_counter() - t
        model = GlobalTree(collapse_same_class(start), list(self._schema.classes), self.names, self.category_names,
                           data_schema=self._schema, encoding=self.algorithm)

        # 2. who masks: the sites that scored, with a well-formed key (every site checks the signatures itself)
        records, excluded = {}, {}
        for s in sites:
            if s not in checked:
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
        if excluded:
            info["excluded_sites"] = excluded
        contributors = sorted(records, key=natural_key)
        if len(contributors) < (2 if eps is not None else 3):
            info["status"] = (f"skipped: {len(contributors)} sites with a refinement key; a site masks only in a sum "
                              f"of at least 3 (2 with --refine-epsilon): from fewer, the others' counts follow from "
                              f"the sum and its own")
            return model
        candidates = refine.candidates_from_trees(trees, feature_kinds=self.kinds, n_categories=self.n_categories,
                                                  bounds=threshold_bounds(self._schema, self.algorithm))
        budget = {"max_leaves": stats["max_leaves"], "max_depth": stats["max_depth"]}
        weights = {s: trained[s]["n_test"] for s in sites}
        tree = start
        info["status"] = "completed"
        for r in range(1, self._refine["rounds"] + 1):
            t = time.perf_counter()
            left = [s for s in contributors if s in result["dropped_sites"]]
            if left:  # sites mask only with the first round's participants (a sum over fewer would be differenced)
                info["status"] = f"stopped at round {r}: {', '.join(left)} left after round {r - 1}"
                break
            try:
                grown, entry = self._refine_round(r, tree, candidates, budget, contributors, records, trained, info,
                                                  result, abort_signal, fl_ctx)
                # every candidate tree ("auto": both objectives') scored in one task on the sites' validation rows
                replies = self._ask(SCORE_TREES, {"trees": [g.to_dict() for g, _ in grown.values()]}, sites, result,
                                    abort_signal, fl_ctx, lambda rep: check_scores_reply(rep, len(grown)), required=1,
                                    phase=f"refinement round {r}: refined trees on the sites' validation rows")
            except _RoundFailed as exc:
                info["status"] = f"stopped at round {r}: {exc}"
                break
            except JobFailed as exc:
                info["status"] = f"stopped at round {r}: the refined tree could not be scored ({exc})"
                break
            scored = {o: {s: {m: rep[m][k] for m in ("accuracy", "macro_f1")} for s, rep in replies.items()}
                      for k, o in enumerate(grown)}
            won, why = refine.adopt_refined(scored, previous, weights, objective)
            info["adoption"].append({"round": r, "adopted": won is not None, "objective": won, "why": why})
            entry = {**entry, **grown[won or next(iter(grown))][1], "seconds": time.perf_counter() - t}
            if won is None:  # a worse tree (say, from one site's relabelled counts) never replaces the previous one
                info["status"] = f"stopped at round {r}: the refined tree was not adopted ({why})"
                info["not_adopted"] = entry
                break
            tree, previous = grown[won][0], scored[won]
            if server_test is not None:
                entry["accuracy"] = float(np.mean(tree.predict(server_test[0]) == server_test[1]))
            info["history"].append(entry)
            acc_text = f", test accuracy {entry['accuracy']:.4f}" if "accuracy" in entry else ""
            self._progress(fl_ctx, f"refinement round {r}/{self._refine['rounds']}: {entry['n_leaves']} leaves, "
                                   f"depth {entry['depth']}{acc_text} ({entry['seconds']:.1f} s)")
        info["rounds_done"] = len(info["history"])
        timings["refinement"] = sum(h["seconds"] for h in info["history"])
        # collapsed once, at the end (refine_in_process does the same): a split whose children predict alike is
        # what the next round grows from
        tree = collapse_same_class(tree)
        return GlobalTree(tree, list(self._schema.classes), self.names, self.category_names,
                          info={"refinement_rounds": info["rounds_done"], "start": info["start"]},
                          data_schema=self._schema, encoding=self.algorithm)

    def _refine_round(self, r, tree, candidates, budget, contributors, records, trained, info, result, abort_signal,
                      fl_ctx):
        """One round: every listed site's masked counts, summed; the sum must hold exactly the declared rows.
        Returns objective -> (grown tree, its stats) and the round's entry."""
        plan = refine.plan_round(tree, candidates, budget["max_depth"])
        eps = self._refine["epsilon"]
        n_values = plan.n_values + 1  # and the rows that stop at an internal node
        task = {"tree": tree.to_dict(), "candidates": candidates.to_dict(), "plan": plan.to_dict(), "round": r,
                "epsilon": eps, "keys": [records[s] for s in contributors]}
        t = time.perf_counter()
        try:
            replies = self._ask(REFINE_COUNTS, task, contributors, result, abort_signal, fl_ctx,
                                lambda rep: check_counts_reply(rep, n_values=n_values, round_no=r),
                                required=len(contributors))
        except JobFailed:
            missing = [s for s in contributors if s in result["dropped_sites"]]
            raise _RoundFailed(f"{', '.join(missing)} sent no valid masked counts; the masks cancel only in the sum "
                               f"over every listed site (no secret-sharing recovery, by design), so the sum is "
                               f"unreadable") from None
        checked = {replies[s]["keys_checked"] for s in contributors}
        info["key_authentication"] = (
            "certificates: every site checked every key's certificate against its own rootCA.pem"
            if checked == {"certificates"} else "none: keys unauthenticated (no startup kits, as in the simulator); "
                                                "a deviating server could substitute keys and unmask a site")
        values = secagg.sum_masked([replies[s]["masked"] for s in contributors]).astype(np.float64)
        declared = sum(trained[s]["n_train"] for s in contributors)
        tolerance = 0.0
        if eps is not None:  # every value of every site carries noise of at most `bound`
            bound = refine.noise_bound(eps, max(candidates.n_features, 1))
            widest = max([candidates.n_cells(j) for j in range(candidates.n_features)] or [0])
            per_total = (len(plan.split_leaves) * widest + len(plan.count_leaves)) * plan.n_classes + 1
            tolerance = float(len(contributors) * bound * per_total)
        try:
            check_summed_rows(values, plan, candidates, declared_rows=declared, tolerance=tolerance)
        except PayloadError as exc:
            raise _RoundFailed(f"the summed counts are refused: {exc}") from None
        if eps is None and not histograms_agree(values[:-1], plan, candidates):
            raise _RoundFailed("the summed counts are inconsistent (a site sent counts outside its declared range)")
        t_counts = time.perf_counter() - t
        objective = self._refine["objective"]  # "auto": both trees from the one sum (no further release)
        grown = {o: refine.refine_tree(tree, candidates, plan, values[:-1], **budget, objective=o, collapse=False)
                 for o in (refine.GROWN if objective == "auto" else (objective,))}
        entry = {"round": r, "sites": len(contributors), "n_values": n_values, "bytes_per_site": 8 * n_values,
                 "site_mask_s_max": max(replies[s]["mask_s"] for s in contributors), "counts_s": t_counts,
                 "rows": float(feature_totals(values[:-1], plan, candidates)[0] + values[-1])}
        return grown, entry

    # -- helpers -----------------------------------------------------------------------------
    def _aggregate(self, trees, selected, sites, result, fl_ctx):
        """Aggregate the selected trees; a tree that cannot be used drops its site and the rest go on."""
        selected = list(selected)
        while True:
            try:
                return pipeline.aggregate(trees, selected, classes=list(self._schema.classes),
                                          feature_names=self.names, category_names=self.category_names,
                                          params=self.aggregation)
            except pipeline.UnusableTreeError as exc:
                site = sites[exc.position]
                result["dropped_sites"][site] = f"aggregation: its tree cannot be used: {exc.reason}"
                self.log_error(fl_ctx, f"dropped {site} at aggregation: {exc.reason}")
                selected = [i for i in selected if i != exc.position]
                if not selected:
                    raise JobFailed(f"aggregation: no usable tree left; dropped: {result['dropped_sites']}") from None

    def _read_server_test(self):
        if not self.server_test:
            return None
        test = read_site_csv(self.server_test, self._schema, site="server")
        return encode(test, self.algorithm), test.y_codes()

    def _tree_summary(self, tree, server_test, n_rules=None) -> dict:
        out = {"n_leaves": int(tree.n_leaves), "depth": int(tree.depth)}
        if n_rules is not None:
            out["n_rules"] = int(n_rules)
        if server_test is not None:
            g = pipeline.score_trees([tree], *server_test)
            out.update({"accuracy": g["accuracy"][0], "macro_f1": g["macro_f1"][0]})
        return out

    def _server_metrics(self, result, model, trees, sites, server_test):
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

    def _progress(self, fl_ctx, text: str, phase: str | None = None) -> None:
        """A progress line for the job script (when the job has a progress reporter); ``phase``: the line is one
        step of that phase (a log shows only the phase's last)."""
        engine = fl_ctx.get_engine() if fl_ctx is not None else None
        reporter = getattr(engine, "get_component", lambda _id: None)(PROGRESS_ID)
        if reporter is not None:
            reporter.emit(text, **({"phase": phase} if phase else {}))

    def _ask(self, name, data, sites, result, abort_signal, fl_ctx, check, required=None, phase=None) -> dict:
        """Broadcast one task, keep the valid replies, record why the others were dropped."""
        replies = []
        phase = phase or PHASES.get(name, name)
        if data.get("round"):
            phase = f"refinement round {data['round']}: {phase}"

        def received(client_task, fl_ctx):  # NVFlare calls it with these keywords; it must never raise
            try:
                replies.append(client_task.client.name)
                self._progress(fl_ctx, f"{phase}: {len(replies)}/{len(sites)} sites replied", phase=phase)
            except Exception as exc:  # noqa: BLE001 - progress is never worth a result
                self.log_warning(fl_ctx, f"progress line not written: {exc}")

        task = Task(name=name, data=Shareable(data), timeout=self.task_timeout, result_received_cb=received)
        self.broadcast_and_wait(task, fl_ctx, targets=sites, min_responses=len(sites), abort_signal=abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed(f"aborted during {name}")
        valid, replied = {}, set()
        for ct in task.client_tasks:
            site, reply = ct.client.name, ct.result
            replied.add(site)
            reason = None
            if reply is None:
                reason = "no reply (timed out, or its result could not be serialized)"
            elif reply.get_return_code() != ReturnCode.OK:
                reason = f"return code {reply.get_return_code()}: {reply.get('error', '')}".strip()
            else:
                try:
                    valid[site] = check(reply)
                except (PayloadError, DataError, ValueError, TypeError, KeyError) as exc:
                    reason = f"invalid payload: {exc}"
            if reason:
                result["dropped_sites"][site] = f"{name}: {reason}"
                self.log_error(fl_ctx, f"dropped {site} at {name}: {reason}")
        for site in set(sites) - replied:
            result["dropped_sites"][site] = f"{name}: no reply"
        needed = self.min_clients if required is None else required
        if len(valid) < needed:
            raise JobFailed(f"{name}: {len(valid)} valid replies, need {needed}; dropped: {result['dropped_sites']}")
        return valid


class _RoundFailed(RuntimeError):
    """A refinement round cannot complete; the tree of the round before stays."""


def _check_refine_params(params: dict) -> dict:
    unknown = set(params) - set(DEFAULT_REFINE)
    if unknown:
        raise ValueError(f"unknown refinement parameters {sorted(unknown)}; known: {sorted(DEFAULT_REFINE)}")
    p = {**DEFAULT_REFINE, **params}
    rounds = p["rounds"]
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 0 <= rounds <= refine.MAX_REFINE_ROUNDS:
        raise ValueError(f"refinement rounds must be an integer in [0, {refine.MAX_REFINE_ROUNDS}], "
                         f"got {p['rounds']!r}")
    eps = p["epsilon"]
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1e6):
        raise ValueError(f"refinement epsilon must be a positive number, got {eps!r}")
    if p["objective"] not in refine.OBJECTIVES:
        raise ValueError(f"refinement objective must be one of {list(refine.OBJECTIVES)}, got {p['objective']!r}")
    return p
