"""Exporters of a global tree, in words and in a picture (as scikit-learn's ``sklearn/tree/_export.py``): they
read a ``GlobalTree`` and the estimator knows nothing of them, so the import goes one way only.

- ``export_text``: the whole tree as indented text (the job's ``rules.txt``);
- ``explain_row``: one row's decision path as conditions in words (``treeflare predict --explain``);
- ``plot_tree``: a PNG drawn with matplotlib (Agg backend, no display needed), at most ``MAX_PICTURE_PX`` pixels
  wide and tall, so a screen shows it whole: a wide tree is drawn at a lower resolution, never cut (its text then
  smaller: readable up to about 32 leaves across). A tree of more than ``max_leaves`` leaves is drawn down to the
  deepest level that keeps at most ``max_leaves`` visible leaves, truncated nodes are marked "...", and a note says
  so.

All three word a split the same way (``condition``): thresholds, categories, one-hot columns, ordinal levels,
and "or missing" on the child a NaN follows.
"""

from __future__ import annotations

import numpy as np

from ..data.schema import split_onehot_name
from ..trees.tree import CATEGORICAL, LEAF, NUMERIC
from .model import GlobalTree

__all__ = ["export_text", "explain_row", "plot_tree", "MAX_PICTURE_PX"]

# the widest and tallest picture plot_tree draws, in pixels: a wide tree gets a lower dpi, not a cut
MAX_PICTURE_PX = 2000
# the picture's inches per visible leaf and per level: room for a box's text at fontsize 7 (and an edge's at 6)
_INCHES_PER_LEAF, _INCHES_PER_LEVEL = 0.9, 1.4


def export_text(model: GlobalTree, max_depth=None, decimals=3) -> str:
    """Indented text of the tree: conditions, then per leaf the class, its share and support (a node below
    ``max_depth`` is shown as a leaf, marked truncated). The job writes it as ``rules.txt``."""
    tree, classes = model.tree_, model.classes_
    feature_names, category_names = model.feature_names_in_, model.category_names
    proba = tree.node_proba()
    support = tree.counts.sum(axis=1)
    depths = tree.node_depths()
    lines = []
    stack = [(0, None)]
    while stack:
        node, label = stack.pop()
        indent = "|   " * (depths[node] - 1) + "|--- " if depths[node] else ""
        if label is not None:
            lines.append(f"{indent}{label}")
        pad = "|   " * depths[node] + "|--- "
        if tree.kind[node] == LEAF or (max_depth is not None and depths[node] >= max_depth):
            c = int(np.argmax(proba[node]))
            more = "" if tree.kind[node] == LEAF else " [subtree truncated]"
            lines.append(f"{pad}class: {classes[c]} (p={proba[node, c]:.2f}, support={support[node]:.1f}){more}")
            continue
        if tree.kind[node] in (NUMERIC, CATEGORICAL):
            c = int(np.argmax(proba[node]))
            stops = ("other or missing value" if tree.missing[node] < 0 else "other value") \
                if tree.kind[node] == CATEGORICAL else ("missing value" if tree.missing[node] < 0 else None)
            if stops:
                lines.append(f"{pad}otherwise ({stops}): class: {classes[c]} "
                             f"(p={proba[node, c]:.2f}, support={support[node]:.1f})")
            for pos in range(len(tree.children[node]) - 1, -1, -1):
                child = int(tree.children[node][pos])
                stack.append((child, condition(tree, node, pos, feature_names, category_names, decimals)))
    return "\n".join(lines) + "\n"


def explain_rows(model: GlobalTree, X) -> list[list[str]]:
    """:func:`explain_row` of every row of the encoded matrix ``X``, routed through the tree once."""
    paths = model.decision_path(X)
    return [explain_row(model, None, paths.indices[paths.indptr[i]:paths.indptr[i + 1]]) for i in range(X.shape[0])]


def explain_row(model: GlobalTree, x, path=None) -> list[str]:
    """Conditions along the decision path of one row (an encoded row, or a one-row DataFrame), in words. ``path``:
    the row's nodes, root first, when the caller has them (``explain_rows`` routes a whole matrix once)."""
    tree = model.tree_
    if path is None:
        rows = x.iloc[:1] if hasattr(x, "iloc") else np.reshape(np.asarray(x, dtype=np.float64), (1, -1))
        path = model.decision_path(rows).indices  # the row's nodes, root first (a child's id exceeds its parent's)
    out = []
    for parent, child in zip(path, path[1:]):
        pos = int(np.flatnonzero(tree.children[parent] == child)[0])
        out.append(condition(tree, parent, pos, model.feature_names_in_, model.category_names, 3))
    return out


def _visible_depth(tree, max_leaves: int) -> int:
    depths = tree.node_depths()
    for limit in range(tree.depth, 0, -1):
        # drawn as boxes without children: leaves down to the limit, and every node at it
        boxes = np.sum(((depths <= limit) & (tree.kind == LEAF)) | (depths == limit))
        if boxes <= max_leaves:
            return limit
    return 0


def visible_nodes(tree, max_leaves: int) -> tuple[list[int], int]:
    """(the nodes drawn, depth-first, left child first; the depth drawn to) when at most ``max_leaves`` leaves are
    drawn: the picture and the report page cut a large tree at the same depth."""
    limit = _visible_depth(tree, max_leaves)
    depths = tree.node_depths()
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        if tree.kind[node] != LEAF and depths[node] < limit:
            stack.extend(int(c) for c in tree.children[node][::-1])
    return order, limit


def plot_tree(model: GlobalTree, path, *, max_leaves=64, title=None, dpi=110) -> None:
    """A PNG of the tree at ``path``: a box per node (majority class, its share, support), the condition on
    each edge; at ``dpi``, or less where the picture would be wider or taller than ``MAX_PICTURE_PX`` pixels; see
    the module docstring for large trees."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    tree = model.tree_
    order, limit = visible_nodes(tree, max_leaves)
    depths = tree.node_depths()
    proba = tree.node_proba()
    support = tree.counts.sum(axis=1)

    # layout: visible leaves left to right in depth-first order, parents centred over children
    x = {}
    next_x = 0
    for node in order:
        if tree.kind[node] == LEAF or depths[node] >= limit:
            x[node] = next_x
            next_x += 1
    for node in reversed(order):
        if node not in x:
            x[node] = float(np.mean([x[int(c)] for c in tree.children[node]]))
    n_shown = max(next_x, 1)
    width = max(6.0, _INCHES_PER_LEAF * n_shown)
    height = max(3.0, _INCHES_PER_LEVEL * (limit + 1))
    dpi = min(float(dpi), MAX_PICTURE_PX / width, MAX_PICTURE_PX / height)  # the text shrinks with it, nothing is cut
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_axis_off()
    colours = plt.get_cmap("tab10")
    for node in order:
        cx, cy = x[node], -depths[node]
        c = int(np.argmax(proba[node]))
        truncated = tree.kind[node] != LEAF and depths[node] >= limit
        label = f"{model.classes_[c]}\np={proba[node, c]:.2f} n={support[node]:.0f}"
        if truncated:
            label += "\n..."
        ax.text(cx, cy, label, ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round", fc=colours(c % 10), alpha=0.35))
        if tree.kind[node] != LEAF and not truncated:
            for pos, child in enumerate(tree.children[node]):
                child = int(child)
                ax.plot([cx, x[child]], [cy - 0.15, -depths[child] + 0.15], color="0.5", lw=0.7)
                text = _edge_text(condition(tree, node, pos, model.feature_names_in_, model.category_names, 2))
                # near the edge's child end: siblings' conditions are most of a leaf column apart there,
                # not half of one as at the edge's middle
                ax.text(cx + (x[child] - cx) * 0.7, cy - (depths[child] - depths[node]) * 0.7, text,
                        ha="center", va="center", fontsize=6, color="0.2",
                        bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.8))
    ax.set_xlim(-0.8, n_shown - 0.2)
    ax.set_ylim(-limit - 0.6, 0.6)
    heading = title or f"global tree: {tree.n_leaves} leaves, depth {tree.depth}"
    if limit < tree.depth:
        heading += f" (drawn to depth {limit}; deeper subtrees marked '...')"
    ax.set_title(heading, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _edge_text(text: str, width: int = 18) -> str:
    """A condition on lines of about ``width`` characters (at most a leaf column wide), " or missing" on its own."""
    import textwrap

    head, sep, tail = text.partition(" or missing")
    lines = textwrap.wrap(head, width=width, break_long_words=False) or [head]
    return "\n".join(lines + (["or missing" + tail] if sep else []))


def _fmt(value, decimals):
    if value == int(value):
        return str(int(value))
    if abs(value) < 1:  # keep significant digits of small thresholds
        return f"{value:.{max(decimals, 3)}g}"
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def condition(tree, node, pos, names, category_names, decimals) -> str:
    """Words for 'child ``pos`` of ``node``', with "or missing" on the child a NaN follows."""
    j = int(tree.feature[node])
    name = str(names[j])
    if pos >= tree.n_branches(node):
        return f"{name} is missing"
    if tree.kind[node] == NUMERIC and len(tree.split_points[node]) == 0:
        return f"{name} is not missing"
    text = _value_condition(tree, node, pos, name, j, category_names, decimals)
    points = tree.split_points[node]
    onehot = (tree.kind[node] == NUMERIC and split_onehot_name(name)[1] is not None and len(points) == 1
              and 0.0 <= points[0] < 1.0)
    # a one-hot column holds no NaN (a missing category is all zeros): its default side would only clutter
    return f"{text} or missing" if pos == tree.missing[node] and not onehot else text


def _value_condition(tree, node, pos, name, j, category_names, decimals) -> str:
    points = tree.split_points[node]
    if tree.kind[node] == CATEGORICAL:
        code = int(points[pos])
        cats = category_names[j] if category_names and category_names[j] else None
        label = cats[code] if cats and code < len(cats) else str(code)
        return f"{name} = {label}"
    attr, value = split_onehot_name(name)  # a one-hot column "attribute=value" (an "=" in attribute is escaped)
    if value is not None and len(points) == 1 and 0.0 <= points[0] < 1.0:
        return f"{attr} {'!=' if pos == 0 else '='} {value}"
    cats = category_names[j] if category_names and category_names[j] else None
    if cats is not None:  # an ordinal column: thresholds fall between the codes of ordered categories
        return _ordinal_condition(name, cats, points, pos)
    if len(points) == 1:
        return f"{name} {'<=' if pos == 0 else '>'} {_fmt(points[0], decimals)}"
    if pos == 0:
        return f"{name} <= {_fmt(points[0], decimals)}"
    if pos == len(points):
        return f"{name} > {_fmt(points[-1], decimals)}"
    return f"{_fmt(points[pos - 1], decimals)} < {name} <= {_fmt(points[pos], decimals)}"


def _ordinal_condition(name, cats, points, pos) -> str:
    """'size <= med', 'size = med', 'size >= big', 'med <= size <= big' for codes 0..k-1 of ordered levels."""
    k = len(cats)
    clip = lambda c: int(min(max(c, 0), k - 1))  # noqa: E731
    lo = 0 if pos == 0 else clip(np.floor(points[pos - 1]) + 1)
    hi = k - 1 if pos == len(points) else clip(np.floor(points[pos]))
    if lo == hi:
        return f"{name} = {cats[lo]}"
    if lo == 0:
        return f"{name} <= {cats[hi]}"
    if hi == k - 1:
        return f"{name} >= {cats[lo]}"
    return f"{cats[lo]} <= {name} <= {cats[hi]}"
