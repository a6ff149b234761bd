"""PNG drawing of a global tree with matplotlib (Agg backend, no display needed).

Readable up to about 64 leaves; a larger tree is drawn down to the deepest level that keeps at
most ``max_leaves`` visible leaves, truncated nodes are marked "...", and a note says so.
"""

from __future__ import annotations

import numpy as np

from ..trees.tree import LEAF

__all__ = ["plot_tree"]


def _visible_depth(tree, max_leaves: int) -> int:
    depths = tree.node_depths()
    for limit in range(tree.depth, 0, -1):
        # drawn as boxes without children: leaves down to the limit, and every node at it
        boxes = np.sum(((depths <= limit) & (tree.kind == LEAF)) | (depths == limit))
        if boxes <= max_leaves:
            return limit
    return 0


def plot_tree(model, path, *, max_leaves=64, title=None, dpi=110) -> None:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from .model import _condition

    tree = model.tree_
    limit = _visible_depth(tree, max_leaves)
    depths = tree.node_depths()
    proba = tree.node_proba()
    support = tree.counts.sum(axis=1)

    # layout: visible leaves left to right in depth-first order, parents centred over children
    x = {}
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        if tree.kind[node] != LEAF and depths[node] < limit:
            stack.extend(int(c) for c in tree.children[node][::-1])
    next_x = 0
    for node in order:
        if tree.kind[node] == LEAF or depths[node] >= limit:
            x[node] = next_x
            next_x += 1
    for node in reversed(order):
        if node not in x:
            x[node] = float(np.mean([x[int(c)] for c in tree.children[node]]))
    n_shown = max(next_x, 1)
    width = min(max(6.0, 1.6 * n_shown), 80.0)
    height = max(3.0, 1.4 * (limit + 1))
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
                text = _condition(tree, node, pos, model.feature_names_in_, model.category_names, 2)
                ax.text((cx + x[child]) / 2, (cy - depths[child]) / 2, text, ha="center",
                        va="center", fontsize=6, color="0.2",
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
