"""What the ICDTA4FL server and sites both name: the tasks, in the order the workflow sends them.

The controller and the executor import these from here, never from each other. The replies' contents are
checked by the pure ``treeflare.icdta4fl.payloads``.
"""

TRAIN = "icdta4fl_train"  # schema, algorithm, learner params, refinement plan -> local tree, sizes, scores, key
SCORE_TREES = "icdta4fl_score_trees"  # trees -> accuracy and macro-F1 of each on the site's validation rows
SCORE_GLOBAL = "icdta4fl_score_global"  # the global tree -> its accuracy and macro-F1 there
REFINE_COUNTS = "icdta4fl_refine_counts"  # tree, candidates, plan, key list -> masked class counts
TASKS = [TRAIN, SCORE_TREES, SCORE_GLOBAL, REFINE_COUNTS]
