"""Issue 22: after the PSI phase no id, no hash of an id and no digest of an id list crosses the server.

Training checks the parties' rows with a hash of each passive party's ids encrypted under the active party's key
(one ciphertext on the wire, decrypted and compared by the active party); prediction with an HMAC under the link
key those two parties share since training (``treeflare.vertical.messages``).  In process: every message of a
training and a prediction run is recorded and searched, and misaligned or malformed setups are refused.
"""
from __future__ import annotations

import hashlib
import json
import threading

import numpy as np
import pytest

from treeflare.crypto import PaillierKeyHolder
from treeflare.vertical import (ProtocolError, VerticalParams, close_parties, make_parties, run_protocol,
                                run_vertical, synthetic)
from treeflare.vertical.messages import alignment_pieces, alignment_value, ids_digest, public_encrypt
from treeflare.vertical.prediction import ActivePredictor, PassivePredictor, run_prediction

BITS = 512   # test-only keys
P = VerticalParams(key_bits=BITS, allow_insecure_key=True, workers=1, max_depth=2, bins=8, min_rows_node=4,
                   model="gbdt", n_trees=1)


def _data():
    d = synthetic(n=120, n_test=40, passive_features=(2, 2), n_classes=2, seed=3)
    # ids that cannot turn up by chance (no bare digits): a leak shows as the id itself
    d.ids_train = sorted(f"cust-{hashlib.md5(b'tr%d' % i).hexdigest()[:10]}" for i in range(120))
    d.ids_test = sorted(f"cust-{hashlib.md5(b'te%d' % i).hexdigest()[:10]}" for i in range(40))
    return d


@pytest.fixture(scope="module")
def recorded():
    """A Paillier training run and a prediction run of its model, every message recorded."""
    d = _data()
    train_rec, predict_rec = [], []
    a, ps = run_vertical(d, P, record=train_rec, key_holder=PaillierKeyHolder.generate(BITS))
    rng = np.random.default_rng(0)
    perms = {s: rng.permutation(len(d.ids_test)) for s in ["site-1", *ps]}   # each party's own row order
    ids = np.asarray(d.ids_test, dtype=object)
    active = ActivePredictor("site-1", json.loads(json.dumps(a.model())), d.X_active_test[perms["site-1"]],
                             list(ids[perms["site-1"]]))
    passives = {s: PassivePredictor(s, json.loads(json.dumps(ps[s].model())), Xt[perms[s]], list(ids[perms[s]]))
                for s, Xt in zip(ps, d.X_passive_test)}
    run_prediction(active, passives, predict_rec)
    return d, a, ps, perms, active, train_rec, predict_rec


def _needles(d, perms):
    """(strings, byte strings, ints) that must never be on the wire: every id, its SHA-256/SHA-1/MD5, and the
    digest of every id list a party holds (as sent, sorted, train and test together) and the alignment value."""
    ids = [*d.ids_train, *d.ids_test]
    strs = set(ids)
    for v in ids:
        for alg in (hashlib.sha256, hashlib.sha1, hashlib.md5):
            strs.add(alg(v.encode()).hexdigest())
    lists = [d.ids_train, d.ids_test, ids, sorted(ids)] + [list(np.asarray(d.ids_test, dtype=object)[p])
                                                           for p in perms.values()]
    strs |= {ids_digest(lst) for lst in lists}
    value = alignment_value(d.ids_train, d.ids_test)
    strs.add(f"{value:064x}")
    raw = {s.encode() for s in strs} | {bytes.fromhex(s) for s in strs if s not in ids}
    raw.add(value.to_bytes(32, "big"))
    ints = {value} | {int(s, 16) for s in strs if s not in ids}
    return strs, raw, ints


def _leaks(obj, needles) -> list:
    strs, raw, ints = needles
    found = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, str):
            found.extend(n for n in strs if n in x)
        elif isinstance(x, (bytes, bytearray, np.ndarray)):
            b = x.tobytes() if isinstance(x, np.ndarray) else bytes(x)
            found.extend(n for n in raw if n in b)
        elif isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            found.extend(n for n in ints if int(x) == n)

    walk(obj)
    return found


def test_no_id_hash_or_digest_on_the_wire(recorded):
    d, a, ps, perms, active, train_rec, predict_rec = recorded
    needles = _needles(d, perms)
    # the search finds what it looks for (in a str, in bytes, in an array, as an int)
    assert _leaks({"x": [ids_digest(d.ids_train)]}, needles) and _leaks({"x": d.ids_test[3].encode()}, needles)
    assert _leaks(np.frombuffer(hashlib.sha1(d.ids_train[5].encode()).digest(), np.uint8), needles)
    assert _leaks({"v": alignment_value(d.ids_train, d.ids_test)}, needles)
    assert len(train_rec) > 10 and len(predict_rec) > 6
    for src, dst, msg in train_rec + predict_rec:
        assert not _leaks(msg, needles), (src, dst, msg.get("type"))
    # the runs did check alignment, and worked: one alignment value per passive, the model's predictions
    setups = [m for _s, _d, m in train_rec if m["type"] == "setup_ok"]
    assert len(setups) == 2 and all(m["alignment"].size == len(alignment_pieces(0, a.kh.public)) *
                                    a.kh.public.ct_bytes for m in setups)
    assert set(a.links) == set(ps) and all(a.links[s] == ps[s].link for s in ps)
    macs = [m["ids"] for _s, _d, m in predict_rec if m["type"] == "predict_setup"]
    assert len(macs) == 2 and len(set(macs)) == 2                     # one per passive party, each under its link
    assert np.array_equal(active.pred, np.asarray(a.test_pred)[perms["site-1"]])


def _parties(d, kh, **ids_of_site3):
    a, ps = make_parties(d, P, key_holder=kh)
    for k, v in ids_of_site3.items():
        setattr(ps["site-3"], k, v)
    return a, ps


def test_a_passive_party_with_other_ids_is_refused_at_setup():
    """site-3 holds other customers (not restricted to the intersection): the active party refuses at setup,
    naming the site and the row counts, never an id; nothing but the setup was sent."""
    d = _data()
    kh = PaillierKeyHolder.generate(BITS)
    other = sorted([*d.ids_train[:-1], "cust-zz-not-shared"])              # same count, one customer differs
    for ids in (other, list(reversed(d.ids_train))):                        # other rows; the same rows reordered
        a, ps = _parties(d, kh, ids_train=ids)
        rec = []
        with pytest.raises(ProtocolError, match=r"^site-3: its rows are not this party's \(120 training and 40 "
                                                r"test rows on both sides, but different sample ids or order\)") as e:
            run_protocol(a, ps, rec)
        assert "cust-" not in str(e.value)
        assert {m["type"] for _s, _d, m in rec} == {"setup", "setup_ok"}
        close_parties(a, ps)
    # more rows than the active party (all its own customers): it refuses itself, naming both counts
    a, ps = _parties(d, kh, ids_train=[*d.ids_train, "cust-extra"], n=121)
    with pytest.raises(ProtocolError, match="^site-3: 121 training and 40 test rows here, 120 and 40 at the "
                                            "active party: row counts differ"):
        run_protocol(a, ps)
    close_parties(a, ps)


def test_malformed_alignment_values_are_refused():
    d = _data()
    kh = PaillierKeyHolder.generate(BITS)
    pub = kh.public
    n_ct = len(alignment_pieces(0, pub))
    huge = pub.serialize([public_encrypt(pub, (1 << (pub.usable_bits - 1)) - 1)] * n_ct)   # link beyond 256 bits
    for bad, match in [(None, "setup_ok without its alignment ciphertext"),
                       (np.zeros(n_ct * pub.ct_bytes, np.int64), "1-D uint8 array"),
                       (np.zeros((n_ct - 1) * pub.ct_bytes + 3, np.uint8), "not a multiple"),
                       (np.zeros(pub.ct_bytes, np.uint8), f"expected {n_ct} ciphertexts, got 1"),
                       (np.zeros(n_ct * pub.ct_bytes, np.uint8), "outside the Paillier range"),
                       (pub.serialize([public_encrypt(pub, 7)] * n_ct), "different sample ids"),
                       (huge, "different sample ids")]:
        a, ps = _parties(d, kh)
        out = a.step(None)
        replies = {s: ps[s].handle(m) for s, m in out.items()}
        if bad is None:
            del replies["site-2"]["alignment"]
        else:
            replies["site-2"]["alignment"] = bad
        with pytest.raises(ProtocolError, match=f"^site-2: .*{match}"):
            a.step(replies)
        close_parties(a, ps)


def test_prediction_checks_the_ids_by_mac_and_old_parts_by_counts(recorded):
    d, a, ps, _perms, _active, _tr, _pr = recorded
    ids = list(d.ids_test)

    def run(active_model, passive_model, passive_ids=ids):
        active = ActivePredictor("site-1", active_model, d.X_active_test, ids)
        passives = {s: PassivePredictor(s, passive_model if s == "site-2" else ps[s].model(), Xt,
                                        passive_ids if s == "site-2" else ids)
                    for s, Xt in zip(ps, d.X_passive_test)}
        return run_prediction(active, passives)

    wrong = dict(a.model(), links={**a.links, "site-2": "0" * 64})
    with pytest.raises(ProtocolError, match="^site-2: the new rows' ids differ from the active party's \\(40 rows"):
        run(wrong, ps["site-2"].model())
    unlinked = dict(a.model(), links={s: v for s, v in a.links.items() if s != "site-2"})
    with pytest.raises(ProtocolError, match="^site-2: the active party sent no check of the new rows' ids"):
        run(unlinked, ps["site-2"].model())
    # model parts trained before links: the counts are the check (after PSI they suffice; SECURITY.md)
    old_passive = {k: v for k, v in ps["site-2"].model().items() if k != "link"}
    swapped = [*ids[:-1], "cust-zz-other"]
    assert np.array_equal(run(unlinked, old_passive, swapped).pred, np.asarray(a.test_pred))


def test_a_reply_counts_when_it_arrives_not_at_the_communicators_next_check():
    """NVFlare 2.9's server communicator marks a task done every 0.2 s whatever a controller asks; our workflows
    wait themselves (workflow.answered, collect, wait_for_tasks): a task counts as answered once every target's
    reply has been received and handed over (ClientTask.result_received_time), before NVFlare marks it complete.
    It does not count before, nor with one target still silent; a task NVFlare ended (a timeout) counts at once."""
    import time
    from types import SimpleNamespace

    from nvflare.apis.controller_spec import Task, TaskCompletionStatus
    from nvflare.apis.shareable import Shareable

    from treeflare.flare.workflow import answered, collect, wait_for_tasks

    def client_task(site, received):
        return SimpleNamespace(client=SimpleNamespace(name=site), result_received_time=received)

    task = Task(name="t", data=Shareable())
    task.client_tasks = [client_task("site-1", time.time()), client_task("site-2", None)]
    assert not answered(task, ["site-1", "site-2"]) and answered(task, ["site-1"])
    task.client_tasks[1].result_received_time = time.time()
    assert task.completion_status is None and answered(task, ["site-1", "site-2"])
    silent = Task(name="t", data=Shareable())
    silent.client_tasks = [client_task("site-1", None)]
    assert not answered(silent, ["site-1"])
    silent.completion_status = TaskCompletionStatus.TIMEOUT
    assert answered(silent, ["site-1"])

    class Controller:  # replies arrive on another thread, as NVFlare's do; the task is never marked complete
        cancelled = []

        def broadcast(self, task, fl_ctx, targets=None, min_responses=1):
            task.client_tasks = [client_task(s, None) for s in targets]

            def reply():
                for ct in task.client_tasks:
                    ct.result_received_time = time.time()
            threading.Timer(0.05, reply).start()

        def cancel_task(self, task, completion_status=None, fl_ctx=None):
            self.cancelled.append(task)

    ctl, task = Controller(), Task(name="t", data=Shareable())
    collect(ctl, task, None, ["site-1", "site-2"])
    assert answered(task, ["site-1", "site-2"]) and task.completion_status is None and not ctl.cancelled
    done = []
    tasks = {"site-1": Task(name="a", data=Shareable())}
    ctl.broadcast(tasks["site-1"], None, ["site-1"])
    assert wait_for_tasks(tasks, lambda site, t: done.append(site), 60, ctl.cancel_task, lambda: False,
                          lambda site: None)
    assert done == ["site-1"] and not ctl.cancelled
