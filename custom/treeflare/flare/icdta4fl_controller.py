"""Server side of ICDTA4FL: the single-round protocol of the paper, as an NVFlare workflow.

train -> every tree to every site -> peer scores -> filter -> aggregate -> global tree to every
site -> global evaluation. Each reply is validated; a site whose reply is missing or invalid is
dropped with a logged reason, and the job goes on while at least ``min_clients`` sites remain.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from nvflare.apis.controller_spec import Task
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable

from ..data import DataError, Schema, read_site_csv
from ..icdta4fl import pipeline
from ..icdta4fl.encoding import encode, feature_space, tree_limits
from ..icdta4fl.payloads import check_global_reply, check_scores_reply, check_train_reply
from ..reporting import write_text_atomic
from ..trees.validate import PayloadError
from .icdta4fl_executor import SCORE_GLOBAL, SCORE_TREES, TRAIN
from .workflow import JobFailed, ResultWorkflow

RESULT_FILE = "icdta4fl_result.json"


class ICDTA4FLController(ResultWorkflow):
    JOB = "icdta4fl"
    RESULT_FILE = RESULT_FILE

    def __init__(self, schema: dict, algorithm: str = "cart", local_params: dict | None = None,
                 selection: dict | None = None, aggregation: dict | None = None, min_clients: int = 2,
                 task_timeout: int = 600, server_test: str = "", job_info: dict | None = None):
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
        self.names, self.kinds, self.n_categories = feature_space(self._schema, algorithm)
        local = {**pipeline.DEFAULT_LOCAL_PARAMS, **self.local_params}
        # what a site's tree may be: from the server's own schema and the requested depth only
        self.limits = tree_limits(self._schema, algorithm, max_depth=int(local["max_depth"]),
                                  n_bins=int(local["n_bins"]))
        pipeline.check_aggregate_params(self.aggregation)  # a bad budget fails here, before any task
        # ID3 splits on category codes; the rules text shows their names
        self.category_names = ([list(f.categories) if f.kind == "categorical" else None for f in self._schema.features]
                               if algorithm == "id3" else None)

    def initial_result(self) -> dict:
        return {**super().initial_result(), "algorithm": self.algorithm, **self.job_info, "dropped_sites": {}}

    # -- the protocol ----------------------------------------------------------------------
    def run_workflow(self, result, run_dir: Path, abort_signal, fl_ctx):
        timings = result["timings_s"]
        sites = sorted(c.name for c in fl_ctx.get_engine().get_clients())
        if len(sites) < self.min_clients:
            raise JobFailed(f"{len(sites)} sites connected, min_clients is {self.min_clients}")

        t = time.perf_counter()
        task = {"schema": self._schema.to_dict(), "algorithm": self.algorithm, "params": self.local_params}
        trained = self._ask(TRAIN, task, sites, result, abort_signal, fl_ctx,
                            lambda r: check_train_reply(r, limits=self.limits))
        timings["local_training"] = time.perf_counter() - t
        sites = sorted(trained)
        trees = [trained[s]["tree"] for s in sites]

        t = time.perf_counter()
        tree_dicts = [tr.to_dict() for tr in trees]
        scores = self._ask(SCORE_TREES, {"trees": tree_dicts, "owners": sites}, sites, result, abort_signal, fl_ctx,
                           lambda r: check_scores_reply(r, len(trees)))
        timings["peer_evaluation"] = time.perf_counter() - t
        scorers = sorted(scores)
        acc = np.array([scores[s]["accuracy"] for s in scorers])
        f1 = np.array([scores[s]["macro_f1"] for s in scorers])

        t = time.perf_counter()
        selected, thresholds = pipeline.select_trees(acc, f1, **self.selection)
        model, stats = self._aggregate(trees, selected, sites, result, fl_ctx)
        timings["aggregation"] = time.perf_counter() - t

        result.update({
            "n_sites": len(sites), "sites_trained": sites, "scorers": scorers,
            "selected_sites": [sites[i] for i in selected], "thresholds": thresholds,
            "peer_scores": {"accuracy_mean": acc.mean(axis=0).tolist(), "macro_f1_mean": f1.mean(axis=0).tolist()},
            "aggregation": stats,
            "sites": {s: {"n_train": trained[s]["n_train"], "n_test": trained[s]["n_test"],
                          "local": trained[s]["local"],
                          "tree": {"n_leaves": trees[i].n_leaves, "depth": trees[i].depth}}
                      for i, s in enumerate(sites)},
        })
        model.save_json(run_dir / "global_tree.json")
        write_text_atomic(run_dir / "rules.txt", model.export_text())
        try:
            model.plot(run_dir / "global_tree.png")
        except Exception as exc:  # a picture must never cost the model
            self.log_warning(fl_ctx, f"could not draw the global tree: {exc}")

        t = time.perf_counter()
        global_scores = self._ask(SCORE_GLOBAL, {"tree": model.tree_.to_dict()}, sites, result, abort_signal,
                                  fl_ctx, check_global_reply, required=1)
        for s, sc in global_scores.items():
            result["sites"][s]["global"] = {"accuracy": sc["accuracy"], "macro_f1": sc["macro_f1"]}
        timings["global_evaluation"] = time.perf_counter() - t
        result["global"] = {"n_leaves": int(model.get_n_leaves()), "depth": int(model.get_depth()),
                            "n_rules": int(stats.get("n_rules", model.get_n_leaves()))}
        result["local_trees"] = {s: tree_dicts[i] for i, s in enumerate(sites)}
        if self.server_test:
            self._server_metrics(result, model, trees, sites)

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

    def _server_metrics(self, result, model, trees, sites):
        test = read_site_csv(self.server_test, self._schema, site="server")
        X, y = encode(test, self.algorithm), test.y_codes()
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

    def _ask(self, name, data, sites, result, abort_signal, fl_ctx, check, required=None) -> dict:
        """Broadcast one task, keep the valid replies, record why the others were dropped."""
        task = Task(name=name, data=Shareable(data), timeout=self.task_timeout)
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
