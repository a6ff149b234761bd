"""Site side of ICDTA4FL: train a local tree, score every peer's tree, score the global tree.

Only trees and scores leave the site, never rows. Data are read against the schema the server sends, from
the site's own binding (``<site kit>/local/treeflare_site.json``, see ``site_config``), else from
``<data_root>/<site>/`` (train.csv, test.csv as written by ``scripts/prepare_data.py``).
"""

from __future__ import annotations

from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ..data import DataError, Schema
from ..data.errors import public_error
from ..icdta4fl import pipeline
from ..icdta4fl.encoding import encode, feature_space
from ..trees.tree import Tree
from ..trees.validate import PayloadError
from .site_config import DATA_ROOT_ENV, load_binding

TRAIN, SCORE_TREES, SCORE_GLOBAL = "icdta4fl_train", "icdta4fl_score_trees", "icdta4fl_score_global"
__all__ = ["ICDTA4FLExecutor", "TRAIN", "SCORE_TREES", "SCORE_GLOBAL", "DATA_ROOT_ENV"]


class ICDTA4FLExecutor(Executor):
    def __init__(self, data_root: str = ""):
        """``data_root``: folder holding ``<site>/train.csv``; a site's own binding (its
        ``local/treeflare_site.json`` or ``$TREEFLARE_DATA_ROOT``) overrides it."""
        super().__init__()
        self.data_root = data_root
        self._test = None  # (X_test, y_test) kept between tasks of one run

    def execute(self, task_name: str, shareable: Shareable, fl_ctx, abort_signal) -> Shareable:
        site = fl_ctx.get_identity_name()
        try:
            if task_name == TRAIN:
                return self._train(site, shareable, fl_ctx)
            if task_name == SCORE_TREES:
                return self._score_trees(shareable)
            if task_name == SCORE_GLOBAL:
                return self._score_global(shareable)
            return make_reply(ReturnCode.TASK_UNKNOWN)
        except Exception as exc:  # noqa: BLE001 -- any failure becomes a reply, never a crash of the site
            # The full error (cell values, local paths) stays in this site's log; the server gets the redacted form.
            self.log_error(fl_ctx, f"{task_name} failed at {site}: {type(exc).__name__}: {exc}")
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc, passthrough=(PayloadError,))
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
        return reply

    def _require_test(self):
        if self._test is None:
            raise DataError("scoring asked before training in this run")
        return self._test

    def _score_trees(self, task: Shareable) -> Shareable:
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
