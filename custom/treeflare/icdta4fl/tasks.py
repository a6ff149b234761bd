"""What the ICDTA4FL server and sites both name: the tasks, in the order the protocol sends them.

The server protocol (``server``), the site protocol (``site``) and the FLARE glue import these from here, never
from each other.
"""

TRAIN = "icdta4fl_train"  # schema, algorithm, learner params, refinement plan -> local tree, sizes, scores, key
SCORE_TREES = "icdta4fl_score_trees"  # trees -> accuracy and macro-F1 of each on the site's validation rows
SCORE_GLOBAL = "icdta4fl_score_global"  # the global tree -> its accuracy and macro-F1 there
REFINE_COUNTS = "icdta4fl_refine_counts"  # tree, candidates, plan, key list -> masked class counts
TASKS = [TRAIN, SCORE_TREES, SCORE_GLOBAL, REFINE_COUNTS]
PHASES = {TRAIN: "local training", SCORE_TREES: "peer scoring", SCORE_GLOBAL: "global evaluation",
          REFINE_COUNTS: "masked counts"}
# the fewest client sites a masked sum is over, with or without noise: from 2, either site has the other's counts
MIN_MASKING_SITES = 3
