"""``report.html``: one ICDTA4FL run on one self-contained page, beside ``report.json``.

The page shows the run's settings, the metrics table (global / one-round / centralized / local trees), each
site's scores and whether its tree was selected, each site's validation of the final tree, the refinement
rounds, the size budget, the global tree drawn as inline SVG and its rules (``export.export_text``).

Self-contained: no script, no font, no image file, no link; a Content-Security-Policy forbids every fetch, so
the page opens from disk in any browser and nothing is loaded. Every text from the run (site, column, class and
category names, reasons) is HTML-escaped. Pure: reads the report dict and the ``GlobalTree``, imports no NVFlare.
"""

from __future__ import annotations

import html
import textwrap
from pathlib import Path

import numpy as np

from ..files import write_text_atomic
from ..trees.tree import LEAF
from .export import condition, export_text, visible_nodes

__all__ = ["CLASS_COLOURS", "render_report_html", "write_report_html"]

# light fills, one per class (cycled); dark text stays readable on each
CLASS_COLOURS = ("#9ecae1", "#fdae6b", "#a1d99b", "#fc9272", "#bcbddc", "#d9b38c", "#f4b6d2", "#c7c7c7",
                 "#dbdb8d", "#9edae5")
MAX_DRAWN_LEAVES = 64  # as the PNG: past this the tree is drawn down to a shallower depth, cut nodes marked
_FONT_PX = 11
_CHAR_PX = 6.6  # mean glyph width of an 11 px sans-serif: enough to size boxes without measuring text

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0} th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f0f0f0} td.num{text-align:right;font-variant-numeric:tabular-nums} td:first-child{white-space:nowrap}
tr.selected td{background:#eef7ee} .note{color:#555;font-size:13px} .tree{overflow:auto;border:1px solid #ddd}
pre{background:#f7f7f7;padding:10px;overflow:auto;font-size:12px} .legend span{padding:1px 8px;margin-right:6px}
"""


def write_report_html(report: dict, model, path) -> Path:
    """Write the page for ``report`` (the job's report.json dict) and ``model`` (the final ``GlobalTree``, or
    None: no drawing and no rules) to ``path``, atomically."""
    return write_text_atomic(path, render_report_html(report, model))


def render_report_html(report: dict, model) -> str:
    algorithm = str(report.get("algorithm", "")).upper()
    title = f"ICDTA4FL-{algorithm} on {report.get('dataset', '?')}"
    body = [f"<h1>{_e(title)}</h1>", f"<p class='note'>{_e(_headline(report))}</p>",
            _tree(model), _metrics(report), _validation(report), _sites(report), _refinement(report),
            _budget(report), _rules(model), _settings(report), _timings(report)]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>\n"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(b for b in body if b) + "\n</body></html>\n")


# -- small pieces -----------------------------------------------------------------------------------------------
def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _cell(value) -> str:
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, float):  # a count or a setting held as a float reads as the whole number it is
        return f"<td class='num'>{value:.0f}</td>" if value.is_integer() and abs(value) >= 2 else \
            f"<td class='num'>{value:.4f}</td>"
    if isinstance(value, int):
        return f"<td class='num'>{value}</td>"
    return f"<td>{'&ndash;' if value is None or value == '' else _e(value)}</td>"


def _table(headers, rows, row_classes=None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    lines = []
    for i, row in enumerate(rows):
        cls = f" class='{row_classes[i]}'" if row_classes and row_classes[i] else ""
        lines.append(f"<tr{cls}>" + "".join(_cell(v) for v in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def _section(key, heading, *parts) -> str:
    return f"<section id='{key}'><h2>{_e(heading)}</h2>\n" + "\n".join(p for p in parts if p) + "\n</section>"


def _note(text) -> str:
    return f"<p class='note'>{_e(text)}</p>"


def _scalars(d: dict) -> list[list]:
    """``[key, value]`` rows for a dict's plain values (nested lists and dicts left to their own sections)."""
    return [[k, v] for k, v in (d or {}).items() if v is None or isinstance(v, (str, int, float, bool))]


def _headline(report) -> str:
    selected = report.get("selected_sites") or []
    return (f"{report.get('n_sites', '?')} sites ({(report.get('partition') or {}).get('kind', '?')}), "
            f"{len(selected)} selected: {', '.join(map(str, selected)) or 'none'}")


# -- sections ---------------------------------------------------------------------------------------------------
def _settings(report) -> str:
    part = report.get("partition") or {}
    rows = [["data", report.get("dataset")], ["partition", part.get("kind")]]
    rows += [[f"partition {k}", v] for k, v in part.items() if k != "kind"]
    rows += [["sites", report.get("n_sites")], ["algorithm", report.get("algorithm")]]
    rows += [["schema", (report.get("schema_source") or {}).get("schema")]]
    rows += _scalars(report.get("params"))
    return _section("settings", "Settings", _table(["setting", "value"], rows))


def _metric_rows(report) -> list[list]:
    refined = report.get("refinement")
    done = (refined or {}).get("rounds_done", 0)
    g, one = report.get("global") or {}, report.get("one_round")
    name = f"global (ICDTA4FL, refined {done} round{'s' * (done != 1)})" if refined else "global (ICDTA4FL)"
    rows = [[name, g.get("accuracy"), g.get("macro_f1"), g.get("n_leaves"), g.get("depth")]]
    if refined and one:
        rows.append(["one-round tree (the paper's)", one.get("accuracy"), one.get("macro_f1"), one.get("n_leaves"),
                     one.get("depth")])
    for key, label in (("centralized", "centralized (same learner, pooled rows)"), ("mean_local", "mean local tree"),
                       ("best_local", "best local tree")):
        b = (report.get("baselines") or {}).get(key)
        if b:
            site = f" ({b['site']})" if b.get("site") else ""
            rows.append([label + site, b.get("accuracy"), b.get("macro_f1"), b.get("n_leaves"), b.get("depth")])
    return rows


def _metrics(report) -> str:
    g = report.get("global") or {}
    headers = ["model", "accuracy", "macro-F1", "leaves", "depth"]
    if g.get("accuracy") is None:
        return _section("metrics", "Metrics", _note("No global test set (the sites hold the data): the trees' "
                                                    "sizes here, their scores under Validation."),
                        _table(headers, _metric_rows(report)))
    n = g.get("n_test")
    return _section("metrics", "Metrics on the global test set",
                    _note(f"{n} rows held out before partitioning" if n else "rows held out before partitioning"),
                    _table(headers, _metric_rows(report)))


def _validation(report) -> str:
    v = report.get("validation") or {}
    final = v.get("final_tree")
    if not final:
        return ""
    rows = [[s, x.get("n_test"), x.get("accuracy"), x.get("macro_f1")] for s, x in (final.get("sites") or {}).items()]
    mean = final.get("mean") or {}
    rows.append(["mean of the sites", None, mean.get("accuracy"), mean.get("macro_f1")])
    one = (v.get("one_round_tree") or {}).get("mean")
    if one:
        rows.append(["one-round tree, mean of the sites", None, one.get("accuracy"), one.get("macro_f1")])
    return _section("validation", "Validation on each site's rows", _note(f"the final tree on {v.get('rows')}"),
                    _table(["site", "rows", "accuracy", "macro-F1"], rows))


def _sites(report) -> str:
    sites = report.get("sites") or {}
    th = report.get("thresholds") or {}
    selected = set(report.get("selected_sites") or [])
    peer_acc, peer_f1 = th.get("mean_accuracy"), th.get("mean_macro_f1")
    # the peer means are per tree, in the order the server listed the sites (report["sites"] keeps it)
    aligned = isinstance(peer_acc, list) and isinstance(peer_f1, list) and len(peer_acc) == len(peer_f1) == len(sites)
    rows, classes = [], []
    for i, (s, info) in enumerate(sites.items()):
        tree, local, glob = info.get("tree") or {}, info.get("local") or {}, info.get("global") or {}
        rows.append([s, info.get("n_train"), info.get("n_test"), tree.get("n_leaves"), tree.get("depth"),
                     local.get("accuracy"), local.get("macro_f1"), peer_acc[i] if aligned else None,
                     peer_f1[i] if aligned else None, s in selected, glob.get("accuracy"), glob.get("macro_f1")])
        classes.append("selected" if s in selected else "")
    how = f"{th.get('statistic')}" + (f" (q = {th.get('q')})" if th.get("statistic") == "percentile" else "")
    note = (f"A site's tree is kept when its peer scores pass the thresholds ({how}): accuracy "
            f"{_num(th.get('accuracy'))}, macro-F1 {_num(th.get('macro_f1'))}"
            + (f"; rule applied: {th.get('how')}" if th.get("how") else "") + ". Peer scores: "
            + ("the mean of the sites' scores of the site's tree on their validation rows, each first clipped to the "
               "range of the other sites' scores of it" if th.get("score") == "clipped_mean" else
               "the site's tree scored by every site on its validation rows, averaged")
            + ". Selected rows are shaded.")
    headers = ["site", "train rows", "validation rows", "tree leaves", "tree depth", "own accuracy", "own macro-F1",
               "peer accuracy", "peer macro-F1", "selected", "final tree accuracy", "final tree macro-F1"]
    dropped = report.get("dropped_sites") or {}
    return _section("sites", "Sites: local trees, peer scores, selection", _note(note),
                    _table(headers, rows, classes), *_peer_matrices(report, list(sites)),
                    "<p>Dropped sites:</p>" + _table(["site", "why"], [[s, str(w)] for s, w in dropped.items()])
                    if dropped else "")


def _peer_matrices(report, owners) -> list[str]:
    """Each scorer's score of each site's tree, when the report holds the whole matrix (rows: scorers)."""
    scorers = report.get("scorers") or []
    peer = report.get("peer_scores") or {}
    out = []
    for key, label in (("accuracy", "accuracy"), ("macro_f1", "macro-F1")):
        m = peer.get(key)
        if not (isinstance(m, list) and len(m) == len(scorers) > 0
                and all(isinstance(r, list) and len(r) == len(owners) for r in m)):
            continue
        table = _table(["scored by", *(f"tree of {o}" for o in owners)], [[s, *r] for s, r in zip(scorers, m)])
        out.append(f"<p>Peer {label}: the tree of each column's site, scored by each row's site on its validation "
                   f"rows:</p>{table}")
    return out


def _num(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _refinement(report) -> str:
    r = report.get("refinement")
    if not r:
        return _section("refinement", "Refinement", _note("no refinement rounds (--refine-rounds 0): the global tree "
                                                          "is the paper's one-round tree"))
    summary = _table(["field", "value"], [[k, r.get(k)] for k in ("status", "grow_from", "start", "rounds_requested",
                                                          "rounds_done", "max_leaves", "max_depth", "objective",
                                                          "epsilon", "aggregation", "key_authentication")
                                if k in r] + [[f"cost: {k}", v] for k, v in (r.get("cost") or {}).items()])
    keys = ("round", "sites", "n_leaves_before", "n_leaves", "depth", "leaves_split", "n_leaves_grown", "max_leaves",
            "train_errors_before", "train_errors_after", "bytes_per_site", "accuracy", "seconds")
    # every round with its cost (growth from the root: the steps, then the last round's tree), else the adopted ones
    history = r.get("rounds") or r.get("history") or []
    parts = [summary]
    if history:
        parts.append("<p>Rounds (the last round's leaves as the tree is shown, same-class splits collapsed; a round "
                     "grows the uncollapsed tree, whose leaves the budget bounds):</p>"
                     + _table([_ROUND_LABELS.get(k, k.replace("_", " ")) for k in keys],
                              [[h.get(k) for k in keys] for h in history]))
    if r.get("adoption"):
        parts.append("<p>Adoption:</p>" + _table(["round", "adopted", "objective", "why"],
                                                 [[a.get("round"), a.get("adopted"), a.get("objective"), a.get("why")]
                                                  for a in r["adoption"]]))
    return _section("refinement", "Refinement rounds (class counts summed over the sites)", *parts)


_ROUND_LABELS = {"n_leaves_before": "leaves before", "n_leaves": "leaves", "n_leaves_grown": "leaves grown",
                 "max_leaves": "leaf budget"}

_AGGREGATION_LABELS = {
    "capped_steps": "merge steps capped by the budget", "n_rules_merged": "rules after merging",
    "n_rules": "rules kept", "local_max_leaves": "largest selected local tree: leaves",
    "local_max_depth": "largest selected local tree: depth",
    "n_leaves_grown": "leaves rebuilt before pruning to the budget", "n_leaves": "one-round tree: leaves",
    "depth": "one-round tree: depth", "truncated": "truncated to the budget"}


def _budget(report) -> str:
    agg = report.get("aggregation") or {}
    params = report.get("params") or {}
    g = report.get("global") or {}
    given = {"max_leaves": params.get("max_leaves"), "max_depth": params.get("global_max_depth")}
    refined = report.get("refinement") or {}
    grown = refined.get("grow_from") == "root" and refined.get("max_depth") is not None
    # growth from the root has its own depth budget (its rounds, a level each), which the final tree is held to
    limits = {"max_leaves": agg.get("max_leaves"), "max_depth": refined["max_depth"] if grown else agg.get("max_depth")}
    rows = [[f"{what} budget", limits[key], "given (--max-leaves)" if key == "max_leaves" and given[key] is not None
             else "given (--global-max-depth)" if given[key] is not None
             else "default (growth from the root: its rounds)" if key == "max_depth" and grown else "default",
             g.get(got)]
            for key, what, got in (("max_leaves", "leaf", "n_leaves"), ("max_depth", "depth", "depth"))]
    rest = [[_AGGREGATION_LABELS.get(k, k), v] for k, v in _scalars(agg) if k not in ("max_leaves", "max_depth")]
    return _section("budget", "Size budget",
                    _table(["budget", "limit", "from", "final tree"], rows),
                    "<p>Aggregation (the one-round tree):</p>" + _table(["field", "value"], rest) if rest else "")


def _timings(report) -> str:
    t = report.get("timings_s") or {}
    return _section("timings", "Timings (seconds)", _table(["step", "s"], [[k, v] for k, v in t.items()])) if t else ""


def _rules(model) -> str:
    if model is None:
        return ""
    return _section("rules", "Rules", f"<pre>{_e(export_text(model))}</pre>")


# -- the tree as SVG --------------------------------------------------------------------------------------------
def _tree(model) -> str:
    if model is None:
        return _section("tree", "Global tree", _note("no model file: nothing to draw"))
    svg, limit = tree_svg(model)
    tree = model.tree_
    note = f"{tree.n_leaves} leaves, depth {tree.depth}"
    if limit < tree.depth:
        note += f"; drawn to depth {limit} (at most {MAX_DRAWN_LEAVES} boxes wide), cut subtrees marked '...'"
    legend = "".join(f"<span style='background:{CLASS_COLOURS[i % len(CLASS_COLOURS)]}'>{_e(c)}</span>"
                     for i, c in enumerate(model.classes_))
    return _section("tree", "Global tree", _note(note + ". Each box: majority class, its share p, rows n; "
                                                 "before each box, the condition that leads to it."),
                    f"<p class='legend'>classes: {legend}</p>", f"<div class='tree'>{svg}</div>")


def _fit(text: str, width_px: float) -> str:
    n = max(int(width_px / _CHAR_PX), 4)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _edge_lines(text: str) -> list[str]:
    """A condition on at most two lines (split near the middle), so the gap before a column stays narrow."""
    if len(text) <= 16:
        return [text]
    lines = textwrap.wrap(text, width=max(16, (len(text) + 1) // 2 + 2))
    return lines if len(lines) <= 2 else [lines[0], " ".join(lines[1:])]


def tree_svg(model, max_leaves: int = MAX_DRAWN_LEAVES) -> tuple[str, int]:
    """The tree as an ``<svg>`` element and the depth it was drawn to: the root on the left, each level a column,
    the visible leaves top to bottom in depth-first order and each parent level with the middle of its children
    (a page scrolls down more easily than sideways); boxes coloured by majority class, each edge's condition
    written before the box it leads to, the full text in tooltips."""
    tree = model.tree_
    order, limit = visible_nodes(tree, max_leaves)
    depths = tree.node_depths()
    proba = tree.node_proba()
    support = tree.counts.sum(axis=1)
    boxes, edges = {}, {}
    for node in order:
        c = int(np.argmax(proba[node]))
        cut = tree.kind[node] != LEAF and depths[node] >= limit
        boxes[node] = (c, [str(model.classes_[c]), f"p={proba[node, c]:.2f} n={support[node]:.0f}"]
                       + (["..."] if cut else []))
        if tree.kind[node] != LEAF and not cut:
            for pos, child in enumerate(tree.children[node]):
                edges[int(child)] = (node, condition(tree, node, pos, model.feature_names_in_,
                                                      model.category_names, 3))
    box_chars = max(len(t) for _, lines in boxes.values() for t in lines)
    box_w = min(max(box_chars * _CHAR_PX + 16, 80.0), 200.0)
    box_h = 16 + 14 * max(len(lines) for _, lines in boxes.values())
    # the gap before each column holds the conditions of the edges into it
    gap = [0.0] * (limit + 1)
    for child, (_, text) in edges.items():
        d = depths[child]
        gap[d] = max(gap[d], min(max(len(t) for t in _edge_lines(text)) * _CHAR_PX + 24, 220.0))
    left, x_at = [], 8.0
    for d in range(limit + 1):
        x_at += gap[d]
        left.append(x_at)
        x_at += box_w
    row_h = box_h + 14
    y, next_row = {}, 0
    for node in order:
        if tree.kind[node] == LEAF or depths[node] >= limit:
            y[node] = 8 + next_row * row_h + box_h / 2
            next_row += 1
    for node in reversed(order):
        if node not in y:
            y[node] = float(np.mean([y[int(c)] for c in tree.children[node]]))
    width, height = x_at + 8, max(next_row, 1) * row_h + 8
    out = [f"<svg width='{width:.0f}' height='{height:.0f}' viewBox='0 0 {width:.0f} {height:.0f}' role='img' "
           f"font-family='system-ui,Helvetica,Arial,sans-serif' font-size='{_FONT_PX}'>"]
    for child, (parent, text) in edges.items():
        x0, x1 = left[depths[parent]] + box_w, left[depths[child]]
        lines = _edge_lines(text)
        out.append(f"<g class='edge'><title>{_e(text)}</title><path d='M{x0:.1f},{y[parent]:.1f} "
                   f"C{x0 + 24:.1f},{y[parent]:.1f} {x1 - gap[depths[child]] + 8:.1f},{y[child]:.1f} "
                   f"{x1:.1f},{y[child]:.1f}' fill='none' stroke='#888'/>")
        for k, line in enumerate(lines):
            line_y = y[child] - 5 - 13 * (len(lines) - 1 - k)
            out.append(f"<text x='{x1 - 5:.1f}' y='{line_y:.1f}' text-anchor='end' fill='#333' stroke='#fff' "
                       f"stroke-width='3' paint-order='stroke'>{_e(_fit(line, 220.0))}</text>")
        out.append("</g>")
    for node in order:
        c, lines = boxes[node]
        fill = CLASS_COLOURS[c % len(CLASS_COLOURS)]
        top, x0 = y[node] - box_h / 2, left[depths[node]]
        tip = _e(" | ".join(lines) + (f" | {edges[node][1]}" if node in edges else ""))
        out.append(f"<g class='node'><title>{tip}</title><rect x='{x0:.1f}' y='{top:.1f}' width='{box_w:.1f}' "
                   f"height='{box_h}' rx='6' fill='{fill}' stroke='#555'/>")
        for k, line in enumerate(lines):
            weight = " font-weight='bold'" if k == 0 else ""
            out.append(f"<text x='{x0 + box_w / 2:.1f}' y='{top + 18 + 14 * k:.1f}' text-anchor='middle'{weight}>"
                       f"{_e(_fit(line, box_w))}</text>")
        out.append("</g>")
    out.append("</svg>")
    return "".join(out), limit
