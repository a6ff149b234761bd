"""Site side of ICDTA4FL: train a local tree, score every peer's tree, score the global tree, and (refinement
rounds) send masked class counts for the global tree's leaves.

Only trees, scores and masked count vectors leave the site, never rows. For the refinement a site makes a fresh
X25519 key pair per run, announces it signed with its startup kit's identity, checks the key list the server
forwards (``crypto.secagg``: certificates against its own ``rootCA.pem``, the minimum number of sites, its own key
unchanged, the same list in every round) and masks its counts so that only the sum over every listed site is
readable. Data are read against the schema the server sends, from
the site's own binding (``<site kit>/local/treeflare_site.json``, see ``site_config``), else from
``<data_root>/<site>/`` (train.csv, test.csv as written by ``scripts/prepare_data.py``).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ...crypto import secagg
from ...data import DataError, Schema
from ...icdta4fl import pipeline, refine
from ...icdta4fl.encoding import encode, feature_space
from ...icdta4fl.payloads import feature_totals
from ...trees.tree import Tree
from ...trees.validate import PayloadError, check_int, check_number
from ..site_config import load_binding
from ..site_executor import SiteExecutor
from .protocol import REFINE_COUNTS, SCORE_GLOBAL, SCORE_TREES, TRAIN

__all__ = ["ICDTA4FLExecutor", "site_identity"]


def site_identity(fl_ctx, site: str):
    """This site's provisioned identity from its startup kit (``client.key``, ``client.crt``, ``rootCA.pem``), or
    None in the simulator, which has no kits (keys are then unauthenticated). Outside the simulator a kit without
    them is an error: a site never announces an unsigned key there."""
    engine = fl_ctx.get_engine() if fl_ctx is not None else None
    startup = None
    if engine is not None:
        try:
            startup = Path(engine.get_workspace().get_startup_kit_dir())
        except Exception:  # noqa: BLE001 - no workspace: no kit
            startup = None
    if startup is not None and all((startup / n).is_file() for n in secagg.KIT_FILES.values()):
        return secagg.SiteIdentity.from_kit(startup, site)
    if engine is not None and not fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False):
        raise DataError(f"{site}: the startup kit has no {', '.join(secagg.KIT_FILES.values())}: the refinement's "
                        "keys cannot be signed", site=site, problem="startup kit certificates missing")
    return None


class ICDTA4FLExecutor(SiteExecutor):
    PUBLIC_ERRORS = (PayloadError, secagg.SecAggError)

    def __init__(self, data_root: str = "", binding: str = ""):
        """``data_root``: folder holding ``<site>/train.csv``; a site's own binding (its
        ``local/treeflare_site.json`` or ``$TREEFLARE_DATA_ROOT``) overrides it. ``binding``: the name of the
        site binding to read instead ("" the default one; see site_config)."""
        super().__init__()
        self.data_root = data_root
        self.binding = binding
        self._test = None  # (X_test, y_test) kept between tasks of one run
        self._train_data = None  # (X_train, y_train, feature kinds): for refinement rounds
        # announced with the training task, the site's own plan: a round is answered once, none beyond, with
        # the announced noise, and always with the same participant list
        self._refine_rounds = 0
        self._refine_epsilon = None
        self._answered_rounds: set = set()
        self._masking = None  # this run's secagg.MaskingKeys
        self._participants = None  # the verified key list of the first round
        self._scorings = 0  # scoring tasks answered: every score is a count over this site's validation rows

    def handlers(self) -> dict:
        return {TRAIN: self._train, SCORE_TREES: lambda site, task, fl_ctx: self._score_trees(task),
                SCORE_GLOBAL: lambda site, task, fl_ctx: self._score_global(task), REFINE_COUNTS: self._send_counts}

    def _train(self, site: str, task: Shareable, fl_ctx=None) -> Shareable:
        schema = Schema.from_dict(task["schema"])
        algorithm = str(task["algorithm"])
        params = dict(task.get("params") or {})
        binding = load_binding(site, fl_ctx, self.data_root, name=self.binding)
        if fl_ctx is not None:
            self.log_info(fl_ctx, f"{site} reads {binding.path('train')} and {binding.path('test')} ({binding.source})")
        train = binding.read("train", schema, site)
        test = binding.read("test", schema, site)
        _, kinds, n_categories = feature_space(schema, algorithm)
        X, y = encode(train, algorithm), train.y_codes()
        self._test = (encode(test, algorithm), test.y_codes())
        tree = pipeline.train_local_tree(X, y, algorithm=algorithm, n_classes=len(schema.classes),
                                         feature_kinds=kinds, n_categories=n_categories, params=params)
        local = pipeline.score_trees([tree], *self._test)
        reply = make_reply(ReturnCode.OK)
        reply["tree"] = tree  # already a plain dict
        reply["n_train"], reply["n_test"] = len(train), len(test)
        reply["local"] = {"accuracy": local["accuracy"][0], "macro_f1": local["macro_f1"][0]}
        self._train_data = (X, y, kinds)
        setup = task.get("refine")
        if isinstance(setup, dict):
            self._refine_rounds = check_int(setup.get("rounds"), "refine.rounds", lo=1, hi=refine.MAX_REFINE_ROUNDS)
            eps = setup.get("epsilon")
            self._refine_epsilon = None if eps is None else check_number(eps, "refine.epsilon")
            self._masking = secagg.MaskingKeys(site, _job_id(fl_ctx), site_identity(fl_ctx, site))
            reply["refine_key"] = self._masking.record()
        return reply

    def _count_scoring(self, n_trees) -> None:
        """Scores are counts over this site's validation rows, so a server sending crafted trees could read the rows
        back region by region: a site scores only what the plan announced with the training task asks for (peer
        scoring, the start check, one check per refinement round, the final tree), and after peer scoring at most
        two trees a task (the 'auto' objective's pair)."""
        self._require_test()
        allowed = 2 + (1 + self._refine_rounds if self._refine_rounds else 0)
        if self._scorings >= allowed:
            raise PayloadError("task", f"this run's plan asks for {allowed} scoring tasks; this site answered them all")
        if self._scorings and n_trees > 2:
            raise PayloadError("trees", f"{n_trees} trees to score after peer scoring; the plan scores at most 2")
        self._scorings += 1

    def _require_test(self):
        if self._test is None:
            raise DataError("scoring asked before training in this run")
        return self._test

    def _score_trees(self, task: Shareable) -> Shareable:
        self._count_scoring(len(task["trees"]))
        trees = [Tree.from_dict(t) for t in task["trees"]]
        scores = pipeline.score_trees(trees, *self._require_test())
        reply = make_reply(ReturnCode.OK)
        reply["accuracy"], reply["macro_f1"] = scores["accuracy"], scores["macro_f1"]
        return reply

    def _score_global(self, task: Shareable) -> Shareable:
        self._count_scoring(1)
        X, y = self._require_test()
        scores = pipeline.score_trees([Tree.from_dict(task["tree"])], X, y)
        reply = make_reply(ReturnCode.OK)
        reply["accuracy"], reply["macro_f1"] = scores["accuracy"][0], scores["macro_f1"][0]
        reply["n_test"] = len(y)
        return reply

    # -- refinement rounds -------------------------------------------------------------------
    def _send_counts(self, site: str, task: Shareable, fl_ctx) -> Shareable:
        reply = self._refine_counts(task)
        self.log_info(fl_ctx, f"{site} sent masked counts for refinement round {reply['round']} to be summed with "
                              f"{', '.join(sorted(self._participants))} (keys checked: {reply['keys_checked']})")
        return reply

    def _refine_counts(self, task: Shareable) -> Shareable:
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
        peers = secagg.verify_key_list(task["keys"], site=keys.site, own_public=keys.public, job_id=keys.job_id,
                                       root_ca=identity.root_ca if identity is not None else None,
                                       min_sites=2 if epsilon is not None else 3)
        if self._participants is not None and peers != self._participants:
            # a sum over another set of sites, differenced with the first, would give one site's counts
            raise PayloadError("keys", "differ from the participants of this run's first round")
        X, y, kinds = self._train_data
        tree = Tree.from_dict(task["tree"], n_features=X.shape[1], feature_kinds=kinds)
        candidates = refine.SplitCandidates.from_dict(task["candidates"], feature_kinds=kinds)
        plan = refine.RefinePlan.from_dict(task["plan"], tree=tree, candidates=candidates)
        counts = self._counts(tree, candidates, plan, X, y)
        if epsilon is not None:
            counts = refine.add_noise(counts, epsilon=epsilon, sensitivity=max(candidates.n_features, 1))
        t = time.perf_counter()
        # the masks are bound to the question: a server that asks sites about different trees or cells (so that one
        # site's counts stand alone in some cells of the sum) gets masks that do not cancel
        question = json.dumps([tree.to_dict(), candidates.to_dict(), plan.to_dict(), epsilon], sort_keys=True)
        masked = keys.mask(counts, peers, round_no, context=hashlib.sha256(question.encode()).digest())
        reply = make_reply(ReturnCode.OK)
        reply["masked"] = masked
        reply["round"] = round_no
        reply["mask_s"] = time.perf_counter() - t
        reply["keys_checked"] = "certificates" if identity is not None else "none"
        self._answered_rounds.add(round_no)
        self._participants = peers
        return reply

    def _counts(self, tree, candidates, plan, X, y) -> np.ndarray:
        """This site's count vector, then the rows counted nowhere (they stop at an internal node)."""
        counts = refine.count_vector(tree, candidates, plan, X, y)
        return np.append(counts, len(y) - int(feature_totals(counts, plan, candidates)[0]))

    def _check_round(self, task) -> int:
        """The task's round number, within the rounds announced with the training task."""
        if not self._refine_rounds:
            raise PayloadError("round", "no refinement rounds were announced in this run")
        return check_int(task["round"], "round", lo=1, hi=self._refine_rounds)


def _job_id(fl_ctx) -> str:
    """The run's job id, from the site's own context (never from a task): it binds the keys to this run."""
    job_id = fl_ctx.get_job_id() if fl_ctx is not None else None
    if not job_id:
        raise DataError("no job id in this site's context: the refinement's keys cannot be bound to the run")
    return str(job_id)
