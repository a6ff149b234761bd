"""ICDTA4FL core (no NVFlare imports): rules, peer-score filter, conjunction-set merge, rebuild.

See ``pipeline`` for the steps, ``server`` and ``site`` for the one protocol that runs them (through FLARE or in
process, ``driver``).
"""

from .merge import merge_rule_sets
from .model import GlobalTree, ModelPayloadError
from .pipeline import (DEFAULT_AGGREGATE_PARAMS, DEFAULT_LOCAL_PARAMS, aggregate, macro_f1, score_trees,
                       select_trees, train_local_tree)
from .rebuild import grow_tree
from .rules import RulePayloadError, RuleSet, extract_rules
from .simplify import collapse_same_class, onehot_groups_from_names, simplify_rules

__all__ = [
    "train_local_tree", "score_trees", "select_trees", "aggregate", "macro_f1",
    "DEFAULT_LOCAL_PARAMS", "DEFAULT_AGGREGATE_PARAMS", "GlobalTree", "ModelPayloadError",
    "RuleSet", "RulePayloadError", "extract_rules", "merge_rule_sets", "grow_tree",
    "simplify_rules", "collapse_same_class", "onehot_groups_from_names",
]
