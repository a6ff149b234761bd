"""report.html (``treeflare.icdta4fl.report_html``): the page of a real ICDTA4FL run -- the controller and the sites'
executors in process on car, the report built by the job script's own ``build_report`` -- checked as HTML (every
section, the numbers of report.json, escaping of hostile names, no external reference), then opened in headless
Chromium: the tree and the tables render, the screenshot is not blank, and the page fetches nothing. No FLARE run.

The browser tests skip, saying why, where Debian's ``chromium`` is not installed (``.ci/run`` installs it)."""

from __future__ import annotations

import importlib

import copy
import html
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest


from icdta4fl_inprocess import InProcessRun
from treeflare.data import load_dataset, prepare_federation, write_federation
from treeflare.flare.icdta4fl.controller import ICDTA4FLController
from treeflare.flare.icdta4fl.protocol import SCORE_TREES
from treeflare.icdta4fl.export import export_text
from treeflare.icdta4fl.model import GlobalTree
from treeflare.icdta4fl.report_html import CLASS_COLOURS, render_report_html, tree_svg, write_report_html
from treeflare.processes import end_tree, processes_with_cmdline

SECTIONS = {"tree", "metrics", "validation", "sites", "refinement", "budget", "rules", "settings", "timings"}
HOSTILE_SITE = "site-<b>&\"x'</td>"
HOSTILE_COLUMN = "safety<script>alert(1)</script>&\"'"
HOSTILE_CLASS = "<img src=x onerror=alert(1)>"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


@pytest.fixture(scope="module")
def job():
    return importlib.import_module("treeflare.jobs.icdta4fl")


def _run(job, tmp, fed, root, *, server_test: bool):
    """One in-process run: the report dict as read back from report.json, the workspace, the peer-score replies."""
    controller = ICDTA4FLController(
        schema=fed.schema.to_dict(), algorithm="cart", local_params={"max_depth": 4}, min_clients=2,
        server_test=str(root / "server" / "test.csv") if server_test else "", refine_params={"rounds": 1, "grow_from": "one_round"},
        job_info={"dataset": "car", "partition": fed.summary["partition"]})
    ws = tmp / ("ws" if server_test else "ws_site_held")
    run = InProcessRun(root, fed.site_names)
    server = run.run(controller, ws / "run")
    score_replies = {}  # each site's row of the peer scores: its first answer (refinement asks again, of its trees)
    for way, site, task, reply in run.messages:
        if way == "to_server" and task == SCORE_TREES:
            score_replies.setdefault(site, reply)
    shutil.copyfile(ws / "run" / "global_tree.json", ws / "global_tree.json")
    args = job.parse_args(["--dataset", "car", "--sites", "3", "--max-depth", "4", "--workspace", str(ws)])
    summary = ({"dataset": "car", "partition": fed.summary["partition"]} if server_test else
               {"dataset": "the sites' own data", "partition": {"kind": "site-held"}})
    centralized = job.centralized_baseline(args, root, fed.schema, fed.site_names) if server_test else None
    report = job.build_report(args, server, summary, centralized, {"flare_run": 1.5})
    (ws / "report.json").write_text(json.dumps(json.loads(json.dumps(report, default=float))))
    job.write_html_report(json.loads((ws / "report.json").read_text()), ws)  # the job's own call
    return json.loads((ws / "report.json").read_text()), ws, score_replies


@pytest.fixture(scope="module")
def car(job, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report_html")
    fed = prepare_federation(load_dataset("car"), n_sites=3, kind="iid", seed=0)
    root = write_federation(fed, tmp / "data")
    report, ws, score_replies = _run(job, tmp, fed, root, server_test=True)
    return report, GlobalTree.load_json(ws / "global_tree.json"), ws, (job, tmp, fed, root), score_replies


class Page(HTMLParser):
    """Tags with their attributes, section ids, each table's rows of cell texts per section, and all text."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.tags, self.sections, self.rows, self.text = [], [], {}, []
        self._row, self._cell, self._section = None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "section":
            self._section = attrs.get("id")
            self.sections.append(self._section)
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self.rows.setdefault(self._section, []).append(self._row)
            self._row = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def row(self, section, first):
        return next(r for r in self.rows[section] if r and r[0] == first)


def test_every_section_holds_the_numbers_of_report_json(car):
    report, model, ws = car[:3]
    text = (ws / "report.html").read_text()
    page = Page(text)
    assert set(page.sections) == SECTIONS and len(page.sections) == len(SECTIONS)
    g = report["global"]
    assert page.row("metrics", "global (ICDTA4FL, refined 1 round)") == [
        "global (ICDTA4FL, refined 1 round)", f"{g['accuracy']:.4f}", f"{g['macro_f1']:.4f}", str(g["n_leaves"]),
        str(g["depth"])]
    one, central = report["one_round"], report["baselines"]["centralized"]
    assert page.row("metrics", "one-round tree (the paper's)")[1:3] == [f"{one['accuracy']:.4f}",
                                                                         f"{one['macro_f1']:.4f}"]
    assert page.row("metrics", "centralized (same learner, pooled rows)")[1] == f"{central['accuracy']:.4f}"
    best = report["baselines"]["best_local"]
    assert page.row("metrics", f"best local tree ({best['site']})")[1] == f"{best['accuracy']:.4f}"
    # each site: its sizes, own score, the peer means of its tree, whether it was selected, the final tree's score
    peer = report["thresholds"]["mean_accuracy"]
    for i, (site, info) in enumerate(report["sites"].items()):
        row = page.row("sites", site)
        assert row[1:3] == [str(info["n_train"]), str(info["n_test"])]
        assert row[5] == f"{info['local']['accuracy']:.4f}" and row[7] == f"{peer[i]:.4f}"
        assert row[9] == ("yes" if site in report["selected_sites"] else "no")
        assert row[10] == f"{info['global']['accuracy']:.4f}"
        v = report["validation"]["final_tree"]["sites"][site]
        assert page.row("validation", site)[1:3] == [str(v["n_test"]), f"{v['accuracy']:.4f}"]
    h = report["refinement"]["history"][0]
    assert page.row("refinement", str(h["round"]))[3] == str(h["n_leaves"])
    agg = report["aggregation"]
    assert page.row("budget", "leaf budget")[1:] == [str(agg["max_leaves"]), "default", str(g["n_leaves"])]
    assert page.row("settings", "data")[1] == "car" and page.row("settings", "partition seed")[1] == "0"
    assert page.row("settings", "sites")[1] == "3"
    # the tree: one box per node (small enough to be drawn whole), the rules as export_text writes them
    assert sum(1 for tag, a in page.tags if tag == "g" and a.get("class") == "node") == len(model.tree_.kind)
    rules = text[text.index("<section id='rules'>"):]
    assert html.unescape(rules[rules.index("<pre>") + 5:rules.index("</pre>")]) == export_text(model)


def test_the_peer_score_matrix_when_the_report_holds_it(car):
    report = copy.deepcopy(car[0])
    # the controller reports the matrix the sites sent (rows: scorers, columns: the trees in the report's site order)
    replies = car[4]
    scorers = report["scorers"]
    assert sorted(scorers) == sorted(replies)
    for key in ("accuracy", "macro_f1"):
        assert report["peer_scores"][key] == [[float(v) for v in replies[s][key]] for s in scorers]
    bare = copy.deepcopy(report)  # an older report, means only: the sites table alone
    for key in ("accuracy", "macro_f1"):
        del bare["peer_scores"][key]
    assert Page(render_report_html(bare, car[1])).rows["sites"][0][0] == "site"
    assert len(Page(render_report_html(bare, car[1])).rows["sites"]) == 1 + len(report["sites"])
    # the filter's score per tree: the mean of the sites' scores, each clipped to the others' range
    from treeflare.icdta4fl.server import robust_peer_scores

    np.testing.assert_allclose(robust_peer_scores(report["peer_scores"]["accuracy"]),
                               report["thresholds"]["mean_accuracy"])
    assert report["thresholds"]["score"] == "clipped_mean"
    assert "each first clipped to the range of the other sites" in " ".join(Page(render_report_html(report, car[1])).text)
    page = Page(render_report_html(report, car[1]))
    owners = list(report["sites"])
    heads = [r for r in page.rows["sites"] if r and r[0] == "scored by"]
    assert heads == [["scored by", *(f"tree of {o}" for o in owners)]] * 2
    for i, s in enumerate(scorers):
        rows = [r for r in page.rows["sites"] if r and r[0] == s and len(r) == 1 + len(owners)]
        assert [r[1:] for r in rows] == [[f"{v:.4f}" for v in report["peer_scores"][k][i]]
                                         for k in ("accuracy", "macro_f1")]


def test_the_page_references_nothing_outside_itself(car):
    text = (car[2] / "report.html").read_text()
    page = Page(text)
    assert not {t for t, _ in page.tags} & {"script", "link", "img", "iframe", "object", "embed", "image", "use"}
    assert not [(t, a) for t, a in page.tags if {"src", "href", "xlink:href", "srcset", "action"} & set(a)]
    lowered = text.lower()
    for needle in ("http:", "https:", "//", "url(", "@import", "@font-face"):
        assert needle not in lowered, needle
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert csp.startswith("default-src 'none'")


def _hostile(report, model):
    """The run's report and tree with a site, a column and a class named to break unescaped HTML."""
    report = copy.deepcopy(report)
    old = report["selected_sites"][0]
    report["sites"] = {(HOSTILE_SITE if s == old else s): v for s, v in report["sites"].items()}
    report["selected_sites"] = [HOSTILE_SITE if s == old else s for s in report["selected_sites"]]
    report["dropped_sites"] = {"site-9\"><b>": "its tree's <thresholds> & 'counts' were not numbers"}
    report["dataset"] = "</title><h1>car</h1>"
    root_column = str(model.feature_names_in_[int(model.tree_.feature[0])]).split("=")[0]  # drawn and in the rules
    names = [str(n).replace(root_column, HOSTILE_COLUMN) if str(n).split("=")[0] == root_column else n
             for n in model.feature_names_in_]
    classes = [HOSTILE_CLASS if c == model.classes_[0] else c for c in model.classes_]
    return report, GlobalTree(model.tree_, classes, names, model.category_names)


def test_names_with_markup_are_escaped_everywhere(car):
    report, model = _hostile(*car[:2])
    text = render_report_html(report, model)
    page = Page(text)
    # no tag or attribute came from a name: the same element kinds as the run's own page, no handler attribute
    assert {t for t, _ in page.tags} == {t for t, _ in Page((car[2] / "report.html").read_text()).tags}
    assert not [a for _, a in page.tags if any(k.startswith("on") for k in a)]
    assert set(page.sections) == SECTIONS
    words = "".join(page.text)
    for name in (HOSTILE_SITE, HOSTILE_CLASS, HOSTILE_COLUMN, "</title><h1>car</h1>", "site-9\"><b>"):
        assert name in words, name
    assert export_text(model) in words  # the rules, with the column's name, read as they are
    assert page.row("sites", HOSTILE_SITE)[9] == "yes"
    assert sum(1 for t, a in page.tags if t == "g" and a.get("class") == "node") == len(model.tree_.kind)


def test_without_a_global_test_set_the_sites_validation_is_the_table(car):
    job, tmp, fed, root = car[3]
    report, ws, _ = _run(job, tmp, fed, root, server_test=False)
    page = Page((ws / "report.html").read_text())
    assert "No global test set" in "".join(page.text) and set(page.sections) == SECTIONS
    assert page.row("metrics", "global (ICDTA4FL, refined 1 round)")[1:3] == ["\u2013", "\u2013"]
    final = report["validation"]["final_tree"]
    assert page.row("validation", "mean of the sites")[2] == f"{final['mean']['accuracy']:.4f}"
    for site, v in final["sites"].items():
        assert page.row("validation", site)[2:] == [f"{v['accuracy']:.4f}", f"{v['macro_f1']:.4f}"]
    assert page.row("settings", "partition")[1] == "site-held"
    assert not [r for r in page.rows["settings"] if r[0].startswith("partition ")]  # no seed that did not apply


def test_a_large_tree_is_drawn_to_a_depth_that_fits_and_says_so(car):
    model = car[1]
    svg, limit = tree_svg(model, max_leaves=4)
    assert limit < model.get_depth() and svg.count("class='node'") < len(model.tree_.kind)
    assert svg.count(">...</text>") >= 1  # the cut subtrees are marked
    page = render_report_html(car[0], model)
    assert f"{model.get_n_leaves()} leaves, depth {model.get_depth()}" in page and "drawn to depth" not in page


def test_script_writes_the_page_again_and_refuses_other_reports(car, tmp_path, capsys):
    report, model, ws = car[:3]
    script = importlib.import_module("treeflare.tools.report_html")
    expected = (ws / "report.html").read_text()
    out = tmp_path / "again.html"
    assert script.main(["--workspace", str(ws), "--out", str(out)]) == 0
    assert out.read_text() == expected and str(out) in capsys.readouterr().out
    other = tmp_path / "xgb"
    other.mkdir()
    (other / "report.json").write_text(json.dumps({"job": "xgb_histogram"}))
    with pytest.raises(SystemExit) as exc:
        script.main(["--workspace", str(other)])
    assert exc.value.code == 2 and "not an ICDTA4FL report" in capsys.readouterr().err
    assert not (other / "report.html").exists()


def test_the_job_warns_and_leaves_no_stale_page_when_the_model_is_unreadable(car, job, tmp_path, capsys):
    report, _, ws = car[:3]
    (tmp_path / "global_tree.json").write_text("{\"schema\": \"something else\"}")
    (tmp_path / "report.html").write_text("a previous run's page")
    job.write_html_report(report, tmp_path)
    assert not (tmp_path / "report.html").exists()
    err = capsys.readouterr().err
    assert "report.html not written" in err and "treeflare report --workspace" in err


# -- in the browser ----------------------------------------------------------------------------------------------
def _chromium(page: Path, tmp: Path, *extra: str) -> tuple[str, list[dict]]:
    """Open ``page`` in headless Chromium: the DOM it built (stdout) and the URL requests the page started (from
    Chromium's net log; Chromium's own background requests have no origin and are left out)."""
    profile = tmp / f"profile-{page.stem}"
    netlog = tmp / f"netlog-{page.stem}.json"
    # --disable-dev-shm-usage: a container's small /dev/shm must not crash the screenshot
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
           "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--log-net-log={netlog}", *extra, page.as_uri()]
    env = {**os.environ, "HOME": str(tmp)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        end_tree([proc.pid, *processes_with_cmdline(str(profile))], grace=2.0)
    assert proc.returncode == 0, err[-2000:]
    log = json.loads(netlog.read_text())
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    requests = [e["params"] for e in log["events"] if kinds.get(e["type"]) == "URL_REQUEST_START_JOB"
                and "url" in e.get("params", {}) and e["params"].get("initiator") != "not an origin"]
    return out, requests


@pytest.fixture(scope="module")
def browser(car, tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it as root)")
    tmp = tmp_path_factory.mktemp("chromium")
    shot = tmp / "shot.png"
    dom, requests = _chromium(car[2] / "report.html", tmp, "--window-size=1400,2200", f"--screenshot={shot}",
                              "--dump-dom")
    return dom, requests, shot, tmp


def test_in_chromium_the_tree_and_the_tables_render(car, browser):
    report, model = car[:2]
    dom, _, shot, _ = browser
    page = Page(dom)
    assert set(page.sections) == SECTIONS
    boxes = [a for t, a in page.tags if t == "g" and a.get("class") == "node"]
    assert len(boxes) == len(model.tree_.kind)
    site_rows = [r for r in page.rows["sites"] if r and r[0] in report["sites"] and len(r) > 1 + len(report["sites"])]
    assert len(site_rows) == len(report["sites"]) and len(page.rows["metrics"]) >= 5
    assert sum(1 for r in page.rows["sites"] if r and r[0] == "scored by") == 2  # both peer matrices rendered
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (2200, 1400, 3)
    assert pixels[::4, ::4].reshape(-1, 3).std(axis=0).min() > 10  # not blank
    # painted: the root box's fill (the colour of its majority class), and the shading of the selected sites' rows
    root_fill = next(a["fill"] for t, a in page.tags if t == "rect")
    assert root_fill == CLASS_COLOURS[int(np.argmax(model.tree_.counts[0]))]
    for colour, least in ((root_fill, 2000), ("#eef7ee", 2000)):
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.uint8)
        assert 255 - int(rgb.min()) > 12, f"{colour} is too close to the white page to tell it was painted"
        assert np.count_nonzero((pixels == rgb).all(axis=-1)) >= least, colour  # flat fills render exactly


def test_in_chromium_the_page_fetches_nothing_and_a_page_that_would_is_caught(browser):
    _, requests, _, tmp = browser
    assert requests == []
    # the same check sees a page that fetches: an image from a local port nothing listens on
    control = tmp / "control.html"
    control.write_text("<!DOCTYPE html><html><body><img src='http://127.0.0.1:9/x.png'></body></html>")
    _, caught = _chromium(control, tmp, "--dump-dom")
    assert [r["url"] for r in caught] == ["http://127.0.0.1:9/x.png"]


def test_in_chromium_names_with_markup_stay_text(car, browser, tmp_path):
    report, model = _hostile(*car[:2])
    page_file = write_report_html(report, model, tmp_path / "hostile.html")
    dom, requests = _chromium(page_file, browser[3], "--dump-dom")
    page = Page(dom)
    assert requests == [] and set(page.sections) == SECTIONS
    assert not [a for _, a in page.tags if any(k.startswith("on") for k in a)]
    assert page.row("sites", HOSTILE_SITE)[9] == "yes"
    assert HOSTILE_CLASS in "".join(page.text) and "</title><h1>car</h1>" in "".join(page.text)
