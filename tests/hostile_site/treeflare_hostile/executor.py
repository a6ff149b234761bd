"""A site that trains normally, then sends the server a corrupted tree, forged refinement counts, or never answers
(test only)."""

from __future__ import annotations

import math

import numpy as np

from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor
from treeflare.flare.icdta4fl.protocol import TRAIN
from treeflare.icdta4fl.site import SiteProtocol


class _ForgingSite(SiteProtocol):
    """The forged-counts attack: every row relabelled to class 0, then x 43."""

    def _counts(self, tree, candidates, plan, X, y):
        return super()._counts(tree, candidates, plan, X, np.zeros_like(y)) * 43


class HostileExecutor(ICDTA4FLExecutor):
    def __init__(self, data_root: str = "", mode: str = "nan_threshold"):
        super().__init__(data_root=data_root)
        self.mode = mode
        if mode == "forged_counts":
            self.PROTOCOL = _ForgingSite

    def _handle(self, name, site, task, fl_ctx):
        reply = super()._handle(name, site, task, fl_ctx)
        if name != TRAIN:
            return reply
        tree = reply["tree"]
        if self.mode == "nan_threshold":
            for node in tree["nodes"]:
                if node["kind"] == "numeric":
                    node["thresholds"] = [math.nan] + node["thresholds"][1:]
                    break
            else:
                tree["nodes"][0]["counts"] = [math.nan] * len(tree["nodes"][0]["counts"])
        elif self.mode == "wrong_type":
            reply["tree"] = "DROP TABLE trees;"
        elif self.mode == "huge_code":  # a categorical code of 2**63 and no declared category counts
            tree["n_categories"] = None
            node = next(n for n in tree["nodes"] if n["kind"] == "categorical")
            node["values"][-1] = 2 ** 63
        elif self.mode == "many_categories":  # declares 10,000 categories per column: 1000s of fallback rules
            tree["n_categories"] = [None if k is None else 10_000 for k in tree["n_categories"]]
        elif self.mode == "sleep":  # a site that never answers (the job must still end on a signal)
            import time

            time.sleep(3600)
        return reply
