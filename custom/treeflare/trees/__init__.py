"""Decision trees shared by the tree-based jobs: one JSON-able representation, ID3 and CART."""

from .cart import default_min_samples_split, fit_cart, tree_from_sklearn
from .id3 import fit_id3, quantile_bin_edges
from .tree import CATEGORICAL, LEAF, NUMERIC, Tree, leaf_tree
from .validate import TREE_SCHEMA, TREE_SCHEMA_VERSION, PayloadError, TreePayloadError, validate_tree_dict

__all__ = [
    "Tree", "leaf_tree", "LEAF", "NUMERIC", "CATEGORICAL", "TREE_SCHEMA", "TREE_SCHEMA_VERSION",
    "fit_id3", "quantile_bin_edges", "fit_cart", "tree_from_sklearn", "default_min_samples_split",
    "PayloadError", "TreePayloadError", "validate_tree_dict",
]
