"""The ICDTA4FL task names, for the FLARE glue (the job's ``tasks=``); defined with the pure protocol in
``treeflare.icdta4fl.tasks``."""

from ...icdta4fl.tasks import REFINE_COUNTS, SCORE_GLOBAL, SCORE_TREES, TASKS, TRAIN

__all__ = ["TRAIN", "SCORE_TREES", "SCORE_GLOBAL", "REFINE_COUNTS", "TASKS"]
