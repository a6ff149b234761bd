"""Hostile payloads a misbehaving site (or server) could send, each rejected with a reason that names the field.

Also: the ICDTA4FL reply handling fed such payloads directly (the controller's broadcast, then the one protocol's
``ICDTA4FLServer._ask``): the bad site is dropped with its reason recorded, the good ones are kept, and nothing is
raised into FLARE (the server keeps running; too few valid sites end the job ``failed`` with the reason).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from treeflare.icdta4fl.payloads import MAX_TREE_DEPTH, check_global_reply, check_scores_reply, check_train_reply
from treeflare.icdta4fl.rules import DEFAULT_MAX_RULES_PAYLOAD, RulePayloadError, RuleSet, extract_rules
from treeflare.trees.tree import Tree
from treeflare.trees.validate import PayloadError, TreePayloadError

KINDS = ["numeric", "numeric"]
MAX_TREE_NODES = 20_000
# what the server derives from its schema (encoding.tree_limits), here for two numeric columns
LIMITS = {"n_features": 2, "n_classes": 2, "feature_kinds": KINDS, "n_categories": [None, None],
          "threshold_bounds": [(-1e30, 1e30)] * 2, "max_nodes": MAX_TREE_NODES, "max_depth": MAX_TREE_DEPTH}


def small_tree() -> dict:
    """x0 <= 0.5 -> [3, 1]; else x1 <= 2 -> [0, 4] | [1, 5]."""
    return {
        "schema": "treeflare.tree", "version": 1, "n_features": 2, "n_classes": 2, "feature_kinds": list(KINDS),
        "nodes": [
            {"kind": "numeric", "feature": 0, "thresholds": [0.5], "children": [1, 2], "counts": [4, 10]},
            {"kind": "leaf", "counts": [3, 1]},
            {"kind": "numeric", "feature": 1, "thresholds": [2.0], "children": [3, 4], "counts": [1, 9]},
            {"kind": "leaf", "counts": [0, 4]},
            {"kind": "leaf", "counts": [1, 5]},
        ],
    }


def train_reply(tree=None, **over) -> dict:
    tree = small_tree() if tree is None else tree
    try:  # the root's rows, as the server checks (a malformed tree is refused before that check)
        rows = round(sum(tree["nodes"][0]["counts"]))
    except (TypeError, KeyError, IndexError):
        rows = 14
    reply = {"tree": tree, "n_train": rows, "n_test": 5, "local": {"accuracy": 0.8, "macro_f1": 0.7},
             "tree_signature": {"site": "site-1", "certificate": None, "signature": None}}  # a simulator site's
    reply.update(over)
    return reply


def check(reply):
    return check_train_reply(reply, limits=LIMITS)


def chain(n: int) -> dict:
    """A degenerate tree nested ``n`` levels deep."""
    nodes = []
    for i in range(n):
        nodes.append({"kind": "numeric", "feature": 0, "thresholds": [float(i)], "children": [2 * i + 1, 2 * i + 2],
                      "counts": [n - i, 1]})  # its children's rows: one leaf row, the rest further down
        nodes.append({"kind": "leaf", "counts": [1, 0]})
    nodes.append({"kind": "leaf", "counts": [0, 1]})
    # renumber: node 2i is the split, 2i+1 its left leaf, 2i+2 the next split (or the last leaf)
    t = small_tree()
    t["nodes"] = nodes
    return t


def test_the_valid_reply_passes():
    out = check(train_reply())
    assert isinstance(out["tree"], Tree) and out["n_train"] == 14


def test_oversized_tree_rejected():
    t = small_tree()
    t["nodes"] = t["nodes"][:1] + [{"kind": "leaf", "counts": [1, 1]}] * (MAX_TREE_NODES + 5)
    with pytest.raises(TreePayloadError, match="exceed the limit"):
        check(train_reply(t))


def test_deeply_nested_tree_rejected_without_recursion():
    with pytest.raises(TreePayloadError, match="depth exceeds the limit"):
        check(train_reply(chain(MAX_TREE_DEPTH + 1)))
    # far deeper than Python's recursion limit: still a clean PayloadError, not RecursionError
    with pytest.raises(TreePayloadError, match="exceed the limit|depth exceeds"):
        check(train_reply(chain(5000)))
    assert check(train_reply(chain(10)))["tree"].depth == 10


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_threshold_rejected(bad):
    t = small_tree()
    t["nodes"][2]["thresholds"] = [bad]
    with pytest.raises(TreePayloadError, match=r"nodes\[2\].thresholds\[0\].*not finite"):
        check(train_reply(t))


def test_non_finite_or_negative_counts_rejected():
    t = small_tree()
    t["nodes"][3]["counts"] = [math.nan, 1]
    with pytest.raises(TreePayloadError, match="not finite"):
        check(train_reply(t))
    t["nodes"][3]["counts"] = [-1, 1]
    with pytest.raises(TreePayloadError, match="negative"):
        check(train_reply(t))


def test_unknown_classes_rejected():
    t = small_tree()
    t["n_classes"] = 3
    for node in t["nodes"]:
        node["counts"] = list(node["counts"]) + [1]
    with pytest.raises(PayloadError, match="n_classes: expected 2, got 3"):
        check(train_reply(t))
    t = small_tree()
    t["nodes"][4]["counts"] = [1, 5, 7]  # a class the schema does not have, in one leaf
    with pytest.raises(TreePayloadError, match=r"nodes\[4\].counts.*expected 2 items"):
        check(train_reply(t))


@pytest.mark.parametrize("field, value, match", [
    ("tree", "x0 <= 0.5", "expected a dict"),
    ("tree", [1, 2, 3], "expected a dict"),
    ("n_train", "14", "expected an integer"),
    ("n_train", True, "expected an integer"),
    ("n_train", 0, "below 1"),
    ("n_test", 2.5, "expected an integer"),
    ("local", [0.8, 0.7], "expected a dict"),
])
def test_wrong_types_rejected(field, value, match):
    with pytest.raises(PayloadError, match=match):
        check(train_reply(**{field: value}))


def test_wrong_reply_envelope_rejected():
    with pytest.raises(PayloadError, match="expected a dict"):
        check(["not", "a", "dict"])
    t = small_tree()
    t["nodes"][0]["feature"] = "0"
    with pytest.raises(TreePayloadError, match="feature.*expected an integer"):
        check(train_reply(t))


def test_tree_on_another_schema_rejected():
    t = small_tree()
    t["feature_kinds"] = ["numeric", "categorical"]
    with pytest.raises(PayloadError, match="feature"):
        check(train_reply(t))
    t = small_tree()
    t["nodes"][0]["feature"] = 7  # a feature that does not exist
    with pytest.raises(TreePayloadError, match="above 1"):
        check(train_reply(t))


def test_cycles_and_shared_children_rejected():
    t = small_tree()
    t["nodes"][2]["children"] = [0, 4]  # points back at the root
    with pytest.raises(TreePayloadError, match="below 3"):
        check(train_reply(t))
    t = small_tree()
    t["nodes"][2]["children"] = [1, 4]  # node 1 already has a parent
    with pytest.raises(TreePayloadError):
        check(train_reply(t))


def test_bad_scores_rejected():
    with pytest.raises(PayloadError, match="expected 3 items"):
        check_scores_reply({"accuracy": [0.5, 0.6], "macro_f1": [0.5, 0.6, 0.7]}, 3)
    with pytest.raises(PayloadError, match="outside"):
        check_scores_reply({"accuracy": [0.5, 1.5, 0.1], "macro_f1": [0.5, 0.6, 0.7]}, 3)
    with pytest.raises(PayloadError, match="not finite"):
        check_scores_reply({"accuracy": [0.5, math.nan, 0.1], "macro_f1": [0.5, 0.6, 0.7]}, 3)
    with pytest.raises(PayloadError, match="n_test"):
        check_global_reply({"accuracy": 0.5, "macro_f1": 0.5})
    with pytest.raises(PayloadError, match="local.accuracy"):
        check(train_reply(local={"accuracy": -0.1, "macro_f1": 0.5}))


def test_rule_set_over_the_cap_rejected():
    rules = extract_rules(Tree.from_dict(small_tree())).to_dict()
    assert RuleSet.from_dict(rules).n_rules == 3
    big = copy.deepcopy(rules)
    n = DEFAULT_MAX_RULES_PAYLOAD + 1
    for key in ("lower", "upper", "equals", "mass"):
        big[key] = [big[key][0]] * n
    big["support"] = [1.0] * n
    big["n_sources"] = [1] * n
    with pytest.raises(RulePayloadError, match="exceed the limit"):
        RuleSet.from_dict(big)
    with pytest.raises(RulePayloadError, match="exceed the limit of 2"):
        RuleSet.from_dict(rules, max_rules=2)
    bad = copy.deepcopy(rules)
    bad["lower"][0][0] = math.nan
    with pytest.raises(RulePayloadError, match="not finite"):
        RuleSet.from_dict(bad)


def test_paillier_ciphertext_outside_range_rejected():
    from treeflare.crypto.backend import PaillierPublic
    from treeflare.crypto.paillier import CiphertextError, PaillierPrivateKey

    key = PaillierPrivateKey.generate(256)
    pub = PaillierPublic(key.public)
    w = pub.ct_bytes
    good = pub.serialize([pub.one()])
    assert pub.deserialize(good, count=1) == [1]
    for value in (0, int(pub.nsq), int(pub.nsq) + 5, (1 << (8 * w)) - 1):
        arr = np.frombuffer(int(value).to_bytes(w, "big"), dtype=np.uint8).copy()
        with pytest.raises(CiphertextError, match="outside the Paillier range"):
            pub.deserialize(arr)
    multiple_of_n = np.frombuffer(int(pub.n).to_bytes(w, "big"), dtype=np.uint8).copy()
    with pytest.raises(CiphertextError, match="not invertible"):
        pub.deserialize(multiple_of_n)
    with pytest.raises(CiphertextError, match="not a multiple"):
        pub.deserialize(good[:-1])
    with pytest.raises(CiphertextError, match="uint8"):
        pub.deserialize(good.astype(np.int64))


def test_split_id_that_does_not_exist_rejected():
    from treeflare.vertical import ProtocolError, VerticalParams, make_parties, synthetic
    from treeflare.vertical.messages import check_split_id

    with pytest.raises(ProtocolError, match="malformed split id"):
        check_split_id("../../etc/passwd")
    with pytest.raises(ProtocolError, match="malformed split id"):
        check_split_id(12345)
    d = synthetic(n=60, n_test=10, passive_features=(2,), n_classes=2, seed=3)
    P = VerticalParams(key_bits=512, allow_insecure_key=True, workers=1, max_depth=2, bins=8, model="tree")
    active, passives = make_parties(d, P)
    (name, passive), = passives.items()
    out = active.step(None)
    passive.handle(out[name])
    with pytest.raises(ProtocolError, match="unknown split id"):
        passive.handle({"type": "split", "ids": ["0123456789abcdef"]})


# --------------------------------------------------------------------------------------------- the controller
class _Client:
    def __init__(self, name):
        self.name = name


class _ClientTask:
    def __init__(self, name, result):
        self.client, self.result = _Client(name), result


def _reply(data=None, rc="OK"):
    from nvflare.apis.shareable import Shareable

    s = Shareable(data or {})
    s.set_return_code(rc)
    return s


def _controller():
    from treeflare.data import Feature, Schema
    from treeflare.flare.icdta4fl.controller import ICDTA4FLController

    schema = Schema((Feature("a", "numeric"), Feature("b", "numeric")), "y", ("no", "yes"))
    ctrl = ICDTA4FLController(schema=schema.to_dict(), algorithm="cart", min_clients=2)
    ctrl.logged = []
    ctrl.log_error = lambda fl_ctx, msg, *a, **k: ctrl.logged.append(msg)
    return ctrl


def _ask(ctrl, name, sites, result, check, replies):
    """One task through the job's own path: the controller's broadcast turns what FLARE hands back (a Shareable, an
    error reply, None) into site -> reply or reason, and the protocol's ``_ask`` (a generator) checks the replies."""
    from treeflare.icdta4fl.server import Ask, Note

    gen = ctrl.protocol._ask(result, name, {}, sites, lambda reply, site: check(reply))
    ask = next(gen)
    assert isinstance(ask, Ask) and ask.task == name and list(ask.sites) == sites

    def fake_broadcast(task, fl_ctx, targets=None, min_responses=0, abort_signal=None, **kw):
        task.client_tasks = [_ClientTask(s, r) for s, r in replies.items()]
        task.completion_status = "ok"  # the task has ended: every target answered or timed out

    ctrl.broadcast = fake_broadcast
    answers = ctrl._broadcast(ask, None, None)
    with pytest.raises(StopIteration) as stop:
        message = gen.send(answers)
        while isinstance(message, Note):  # the phase's progress line: how many replies were valid
            message = gen.send(None)
    return stop.value.value


def test_controller_drops_hostile_sites_and_goes_on():
    """Each hostile reply costs only its site: dropped with the reason recorded; the rest of the job goes on."""
    from treeflare.flare.icdta4fl.protocol import TRAIN
    from treeflare.icdta4fl.payloads import check_train_reply as ctr

    nan_tree = small_tree()
    nan_tree["nodes"][0]["thresholds"] = [math.nan]
    replies = {
        "site-1": _reply(train_reply()),
        "site-2": _reply(train_reply()),
        "site-3": _reply(train_reply(nan_tree)),
        "site-4": _reply(train_reply(chain(5000))),
        "site-5": _reply(train_reply(n_train="lots")),
        "site-6": _reply({"error": "ValueError: boom"}, rc="EXECUTION_EXCEPTION"),
        "site-7": None,  # timed out, or its result could not be serialized
        "site-9": _reply(train_reply()),  # a reply from a site that was not asked: ignored
    }
    ctrl = _controller()
    result = {"dropped_sites": {}}
    sites = sorted(s for s in replies if s != "site-9") + ["site-8"]  # site-8 never took the task
    valid = _ask(ctrl, TRAIN, sites, result, lambda r: ctr(r, limits=LIMITS), replies)
    assert sorted(valid) == ["site-1", "site-2"]
    dropped = result["dropped_sites"]
    assert set(dropped) == {"site-3", "site-4", "site-5", "site-6", "site-7", "site-8"}
    assert all(reason.startswith(f"{TRAIN}: ") for reason in dropped.values())
    assert "not finite" in dropped["site-3"] and "invalid payload" in dropped["site-3"]
    assert "exceed the limit" in dropped["site-4"] or "depth" in dropped["site-4"]
    assert "expected an integer" in dropped["site-5"]
    assert "EXECUTION_EXCEPTION" in dropped["site-6"] and "boom" in dropped["site-6"]
    assert "no reply" in dropped["site-7"] and "no reply" in dropped["site-8"]
    # the site that refused is logged by the controller as it happens; every drop is in the result
    assert len(ctrl.logged) == 1 and ctrl.logged[0].startswith("site-6 refused") and "boom" in ctrl.logged[0]
    # a site dropped again in a later phase keeps each phase's reason, in order
    again = _ask(ctrl, "icdta4fl_score_trees", ["site-1", "site-2", "site-3"], result, lambda r: r,
                 {"site-1": _reply({}), "site-2": _reply({})})
    assert sorted(again) == ["site-1", "site-2"]
    assert dropped["site-3"].startswith(f"{TRAIN}: invalid payload") and \
        dropped["site-3"].endswith("; icdta4fl_score_trees: no reply"), dropped["site-3"]


def test_controller_fails_cleanly_when_too_few_valid(tmp_path):
    from types import SimpleNamespace

    from treeflare.flare.icdta4fl.protocol import TRAIN
    from treeflare.icdta4fl.server import ProtocolFailed

    ctrl = _controller()
    result = {"dropped_sites": {}}
    with pytest.raises(ProtocolFailed, match="1 valid replies, need 2.*site-2"):
        _ask(ctrl, TRAIN, ["site-1", "site-2"], result, check, {"site-1": _reply(train_reply()), "site-2": None})
    # through the whole workflow: the job ends failed with that reason, and its result file is written
    ctrl = _controller()
    ctrl.system_panic = lambda reason, fl_ctx: ctrl.logged.append(reason)
    def ended(task, *a, **k):  # site-2 timed out: NVFlare's monitor ends the task
        task.client_tasks = [_ClientTask("site-1", _reply(train_reply())), _ClientTask("site-2", None)]
        task.completion_status = "timeout"

    ctrl.broadcast = ended
    engine = SimpleNamespace(get_clients=lambda: [SimpleNamespace(name="site-1"), SimpleNamespace(name="site-2")],
                             get_workspace=lambda: SimpleNamespace(get_run_dir=lambda job_id: str(tmp_path)),
                             get_component=lambda _id: None)
    ctrl.control_flow(None, SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job"))
    import json

    saved = json.loads((tmp_path / ctrl.RESULT_FILE).read_text())
    assert saved["status"] == "failed" and "1 valid replies, need 2" in saved["error"], saved
    assert "no reply" in saved["dropped_sites"]["site-2"]
