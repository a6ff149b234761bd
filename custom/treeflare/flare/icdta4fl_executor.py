"""Site side of ICDTA4FL: train a local tree, score every peer's tree, score the global tree, and (refinement
rounds) send encrypted class counts for the global tree's leaves.

Only trees, scores and ciphertexts leave the site, never rows; the key holder (one site, named by the server)
also sends the decrypted *sum* of a round's counts, and nothing else it decrypts. Data are read against the schema the server sends, from
the site's own binding (``<site kit>/local/treeflare_site.json``, see ``site_config``), else from
``<data_root>/<site>/`` (train.csv, test.csv as written by ``scripts/prepare_data.py``).
"""

from __future__ import annotations

from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

import time

from ..crypto import secure_sum
from ..crypto.paillier import CiphertextError
from ..data import DataError, Schema
from ..data.errors import public_error
from ..icdta4fl import pipeline, refine
from ..icdta4fl.encoding import encode, feature_space
from ..trees.tree import Tree
from ..trees.validate import PayloadError, check_int, check_number
from .site_config import DATA_ROOT_ENV, load_binding

TRAIN, SCORE_TREES, SCORE_GLOBAL = "icdta4fl_train", "icdta4fl_score_trees", "icdta4fl_score_global"
REFINE_COUNTS, REFINE_DECRYPT = "icdta4fl_refine_counts", "icdta4fl_refine_decrypt"
TASKS = [TRAIN, SCORE_TREES, SCORE_GLOBAL, REFINE_COUNTS, REFINE_DECRYPT]
# r^n values a site computes ahead once it knows the refinement key (about 2 s of one core at 2048 bits):
# enough for a first round of ~25k counts
PRECOMPUTED_RN = 256
__all__ = ["ICDTA4FLExecutor", "TRAIN", "SCORE_TREES", "SCORE_GLOBAL", "REFINE_COUNTS", "REFINE_DECRYPT", "TASKS",
           "DATA_ROOT_ENV"]


class ICDTA4FLExecutor(Executor):
    def __init__(self, data_root: str = "", precompute_rn: int = PRECOMPUTED_RN):
        """``data_root``: folder holding ``<site>/train.csv``; a site's own binding (its
        ``local/treeflare_site.json`` or ``$TREEFLARE_DATA_ROOT``) overrides it. ``precompute_rn``: encryption
        randomness made ahead in the background once the refinement key is known (0: none)."""
        super().__init__()
        self.data_root = data_root
        self.precompute_rn = int(precompute_rn)
        self._test = None  # (X_test, y_test) kept between tasks of one run
        self._train_data = None  # (X_train, y_train, feature kinds): for refinement rounds
        self._key_holder = None  # this site's SumKeyHolder, when the server named it key holder
        self._refine_rounds = 0  # announced with the training task; a round is answered once, none beyond
        self._answered_rounds: set = set()
        self._public_key = None  # the first public key seen in this run: it may not change later
        self._pool = None  # r^n computed ahead for the refinement's encryptions

    def execute(self, task_name: str, shareable: Shareable, fl_ctx, abort_signal) -> Shareable:
        site = fl_ctx.get_identity_name()
        try:
            if task_name == TRAIN:
                return self._train(site, shareable, fl_ctx)
            if task_name == SCORE_TREES:
                return self._score_trees(shareable)
            if task_name == SCORE_GLOBAL:
                return self._score_global(shareable)
            if task_name == REFINE_COUNTS:
                reply = self._refine_counts(shareable)
                self.log_info(fl_ctx, f"{site} sent encrypted counts for refinement round {reply['round']} under the "
                                      f"key with fingerprint {self._public_key.fingerprint()}")
                return reply
            if task_name == REFINE_DECRYPT:
                return self._refine_decrypt(shareable)
            return make_reply(ReturnCode.TASK_UNKNOWN)
        except Exception as exc:  # noqa: BLE001 -- any failure becomes a reply, never a crash of the site
            # The full error (cell values, local paths) stays in this site's log; the server gets the redacted form.
            self.log_error(fl_ctx, f"{task_name} failed at {site}: {type(exc).__name__}: {exc}")
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc, passthrough=(PayloadError, CiphertextError))
            return reply

    def _train(self, site: str, task: Shareable, fl_ctx=None) -> Shareable:
        schema = Schema.from_dict(task["schema"])
        algorithm = str(task["algorithm"])
        params = dict(task.get("params") or {})
        binding = load_binding(site, fl_ctx, self.data_root)
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
        if isinstance(setup, dict) and setup.get("key_holder") == site:
            self._key_holder = secure_sum.SumKeyHolder(check_int(setup.get("key_bits"), "refine.key_bits"))
            reply["refine_public_key"] = self._key_holder.public_array()
            if fl_ctx is not None:
                self.log_info(fl_ctx, f"{site} holds the refinement key; public key fingerprint "
                                      f"{self._key_holder.key.public.fingerprint()}")
        return reply

    def _require_test(self):
        if self._test is None:
            raise DataError("scoring asked before training in this run")
        return self._test

    def _score_trees(self, task: Shareable) -> Shareable:
        if task.get("refine_public_key") is not None and self.precompute_rn > 0:
            try:
                self._use_public_key(task["refine_public_key"], precompute=self.precompute_rn)
            except (PayloadError, ValueError):  # the refinement round will refuse it; scoring goes on
                pass
        trees = [Tree.from_dict(t) for t in task["trees"]]
        scores = pipeline.score_trees(trees, *self._require_test())
        reply = make_reply(ReturnCode.OK)
        reply["accuracy"], reply["macro_f1"] = scores["accuracy"], scores["macro_f1"]
        return reply

    def _score_global(self, task: Shareable) -> Shareable:
        X, y = self._require_test()
        scores = pipeline.score_trees([Tree.from_dict(task["tree"])], X, y)
        reply = make_reply(ReturnCode.OK)
        reply["accuracy"], reply["macro_f1"] = scores["accuracy"][0], scores["macro_f1"][0]
        reply["n_test"] = len(y)
        return reply

    # -- refinement rounds -------------------------------------------------------------------
    def _refine_counts(self, task: Shareable) -> Shareable:
        """This site's class counts for the server's tree, encrypted under the key holder's public key."""
        if self._train_data is None:
            raise DataError("refinement asked before training in this run")
        round_no = self._check_round(task)
        if round_no in self._answered_rounds:
            # fresh noise or a second look at the same tree would let a curious server average or difference
            raise PayloadError("round", f"round {round_no} was already answered; a site sends its counts once")
        X, y, kinds = self._train_data
        tree = Tree.from_dict(task["tree"], n_features=X.shape[1], feature_kinds=kinds)
        candidates = refine.SplitCandidates.from_dict(task["candidates"], feature_kinds=kinds)
        plan = refine.RefinePlan.from_dict(task["plan"], tree=tree, candidates=candidates)
        pk = self._use_public_key(task["public_key"])
        slot_bits = check_int(task["slot_bits"], "slot_bits", lo=2, hi=64)
        counts = refine.count_vector(tree, candidates, plan, X, y)
        epsilon = task.get("epsilon")
        if epsilon is not None:
            epsilon = check_number(epsilon, "epsilon")
            sensitivity = max(candidates.n_features, 1)
            counts = refine.add_noise(counts, epsilon=epsilon, sensitivity=sensitivity) + \
                refine.noise_bound(epsilon, sensitivity)
        if counts.size and int(counts.max()) >= (1 << slot_bits):
            raise PayloadError("slot_bits", f"{slot_bits}-bit slots cannot hold this site's counts")
        t = time.perf_counter()
        cts = secure_sum.encrypt_counts(pk, counts, slot_bits, self._pool)
        reply = make_reply(ReturnCode.OK)
        reply["ciphertexts"] = cts
        reply["round"] = round_no
        reply["encrypt_s"] = time.perf_counter() - t
        self._answered_rounds.add(round_no)
        return reply

    def _check_round(self, task) -> int:
        """The task's round number, within the rounds announced with the training task."""
        if not self._refine_rounds:
            raise PayloadError("round", "no refinement rounds were announced in this run")
        return check_int(task["round"], "round", lo=1, hi=self._refine_rounds)

    def _use_public_key(self, arr, precompute: int = 0):
        """The key holder's public key, the same in every task of this run; ``precompute`` r^n values are
        made in the background while the server works (aggregation, other sites)."""
        pk = secure_sum.public_key_from_array(arr)
        if self._public_key is None:
            self._public_key = pk
            self._pool = secure_sum.RandomnessPool(pk, target=precompute)
        elif pk.n != self._public_key.n:
            raise PayloadError("public_key", "differs from the key this site was sent first in this run")
        return pk

    def _refine_decrypt(self, task: Shareable) -> Shareable:
        """The key holder decrypts the round's summed counts, once per round and only from enough sites."""
        if self._key_holder is None:
            raise PayloadError("task", "this site holds no refinement key")
        contributors = check_int(task["n_contributors"], "n_contributors", lo=0)
        noisy = task.get("epsilon") is not None
        if contributors < (2 if noisy else 3):
            # the key holder knows its own counts: from a sum of two it would learn the other site's
            raise PayloadError("n_contributors", f"will not decrypt a sum of {contributors} sites' counts "
                                                 f"(needs 3, or 2 with --refine-epsilon noise)")
        round_no = self._check_round(task)
        sums = self._key_holder.decrypt_round(round_no, task["ciphertexts"],
                                              check_int(task["n_values"], "n_values", lo=0,
                                                        hi=refine.MAX_REFINE_VALUES),
                                              check_int(task["slot_bits"], "slot_bits", lo=2, hi=64))
        reply = make_reply(ReturnCode.OK)
        reply["sums"] = sums
        reply["round"] = round_no
        return reply
