"""Crypto workers on a Dask cluster (``--workers dask://HOST:PORT`` / ``dask-local:N``): the same model as
the plaintext oracle and as one in-process worker, bit for bit; the spec validated; a closed pool leaves
no process and no state on the cluster.  Loopback only, no dashboard."""
from __future__ import annotations

import gc
import logging
import os
from dataclasses import replace

import numpy as np
import psutil
import pytest

pytest.importorskip("distributed")

import dask  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402
from distributed.security import Security  # noqa: E402

from treeflare.crypto import PaillierKeyHolder  # noqa: E402
from treeflare.crypto.dask_pool import DaskPool, count_states  # noqa: E402
from treeflare.crypto.workers import WorkerError, make_pool, parse_workers  # noqa: E402
from treeflare.vertical import VerticalParams, compare_runs, run_oracle, run_vertical, synthetic  # noqa: E402
from treeflare.vertical.histo import HistEngine  # noqa: E402

BITS = 512   # test-only keys


def _descendants() -> set:
    """This process's descendants, but multiprocessing's resource tracker (started by the first spawned process,
    it ends with this process; it runs no operation)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "multiprocessing.resource_tracker" not in " ".join(p.cmdline()):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _wait_gone(pids) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One local cluster for the module (two worker processes, one thread each), TLS with its own certificates in
    files: parties connect with dask:// and Dask's configuration naming them (``party_tls``)."""
    before = _descendants()
    sec = Security.temporary()
    d = tmp_path_factory.mktemp("dask_tls")
    for name, text in (("ca.pem", sec.tls_ca_file), ("cert.pem", sec.tls_client_cert), ("key.pem", sec.tls_client_key)):
        (d / name).write_text(text)
    lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                      silence_logs=logging.ERROR, memory_limit=0, security=sec,
                      scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
    lc.party_config = {"distributed.comm.require-encryption": True, "distributed.comm.tls.ca-file": str(d / "ca.pem"),
                       "distributed.comm.tls.client.cert": str(d / "cert.pem"),
                       "distributed.comm.tls.client.key": str(d / "key.pem")}
    try:
        with dask.config.set(lc.party_config):
            yield lc
    finally:
        lc.close()
    _wait_gone(_descendants() - before)
    assert not (_descendants() - before), "the test cluster left processes"


def _spec(lc) -> str:
    return "dask://" + lc.scheduler_address.split("://", 1)[1]


def _states(lc) -> list:
    with Client(lc, set_as_default=False) as c:
        return list(c.run(count_states).values())


def _data():
    """Small, with missing values in both parties' columns and a rare value (one row at an extreme)."""
    d = synthetic(n=700, n_test=60, passive_features=(3,), n_classes=2, seed=11)
    rng = np.random.default_rng(3)
    for X in (d.X_active, d.X_passive[0], d.X_active_test, d.X_passive_test[0]):
        X[rng.random(X.shape) < 0.08] = np.nan
    d.X_passive[0][5, 1] = 1e6
    return d


def test_parse_workers():
    assert parse_workers(0) == 0 and parse_workers("3") == 3 and parse_workers(" 2 ") == 2
    assert parse_workers("dask-local:04") == "dask-local:4"
    assert parse_workers("dask://10.0.0.5:8786") == "dask://10.0.0.5:8786"
    assert parse_workers("dask://sched.example:8786") == "dask://sched.example:8786"
    assert parse_workers("dask://[::1]:8786") == "dask://[::1]:8786"
    for bad in (-1, 257, True, 2.5, None, "", "dask-local:0", "dask-local:x", "dask://", "dask://host",
                "dask://host:0", "dask://host:70000", "dask://u@host:1", "dask://host/x:1", "tcp://host:8786",
                "dask-local:999"):
        with pytest.raises(ValueError, match="^workers must be") as e:
            parse_workers(bad)
        assert "host" not in str(e.value).replace("HOST", "")        # the value itself is not echoed
    with pytest.raises(ValueError, match="--workers must be"):
        parse_workers("dask:/x", "--workers")
    with pytest.raises(ValueError, match="workers must be"):
        VerticalParams(workers="dask-local:").validate()
    assert VerticalParams(workers="dask-local:2").validate().n_workers == "dask-local:2"
    assert VerticalParams(workers=3).validate().n_workers == 3


def test_unreachable_scheduler_is_a_clear_error(cluster, monkeypatch):
    from treeflare.crypto import dask_pool

    monkeypatch.setattr(dask_pool, "_CONNECT_S", 2)
    with pytest.raises(WorkerError, match="cannot reach the Dask cluster"):
        make_pool("dask://127.0.0.1:9", ["treeflare.vertical.histo"])   # port 9 (discard): nothing listens


def test_remote_scheduler_without_tls_is_refused(cluster):
    """dask:// without Dask's configuration requiring encryption (or without its certificates) is refused, saying
    what to set; nothing is sent."""
    with dask.config.set({"distributed.comm.require-encryption": False, "distributed.comm.default-scheme": "tcp"}):
        with pytest.raises(WorkerError, match="distributed.comm.require-encryption: true"):
            make_pool(_spec(cluster), ["treeflare.vertical.histo"])
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        with pytest.raises(WorkerError, match="certificates"):
            make_pool(_spec(cluster), ["treeflare.vertical.histo"])


def test_dask_local_refuses_other_clients():
    """dask-local:N runs TLS with certificates only the party holds: another client (no credentials over tls://,
    its own certificates, plain tcp://) is refused by the scheduler and by a worker; the owner works."""
    pool = DaskPool("dask-local:1", ["treeflare.vertical.histo"])
    try:
        sched = pool._client.scheduler.address
        assert sched.startswith("tls://127.0.0.1:") and pool.addrs[0].startswith("tls://127.0.0.1:")
        assert len(pool._client.run(os.getpid)) == 1                      # the owner
        for addr in (sched, pool.addrs[0]):
            hostport = addr.split("://", 1)[1]
            for target, sec in ((addr, None), (addr, Security.temporary()), ("tcp://" + hostport, None)):
                # the attacker's own configuration asks for no encryption (the module's parties' config does)
                with dask.config.set({"distributed.comm.require-encryption": False}):
                    with pytest.raises((OSError, TypeError, TimeoutError)):
                        Client(target, security=sec, timeout=3, set_as_default=False).close()
                # the refused Client is left half-built in a reference cycle (the exception's frames): collect it
                # here, not when the next Client's constructor happens to trigger the collector, where its
                # __del__ waits on the loop lock that constructor holds (distributed 2026.8: the run hung)
                gc.collect()
    finally:
        pool.close()


def test_a_stuck_worker_fails_the_call_at_its_deadline(cluster, monkeypatch):
    """A worker that is still listed but never answers: the call fails at the pool's deadline naming the operation
    (no hang)."""
    from treeflare.crypto import dask_pool

    monkeypatch.setenv(dask_pool.DEADLINE_ENV, "3")
    kh = PaillierKeyHolder.generate(BITS, "djn")
    eng = HistEngine(kh.public, np.zeros((600, 1), dtype=np.uint8), [2], workers=_spec(cluster))
    pid = eng.pool.pool_id
    try:
        eng.load(kh.encrypt_bytes([1] * 600), 1)
        # hold the pool's lock on one worker: its next operation waits for ever, the worker stays listed
        held = eng.pool._client.run(lambda p: __import__("treeflare.crypto.dask_pool", fromlist=["_"])
                                    ._state_of(p)[1].acquire(blocking=False), pid, workers=[eng.pool.addrs[1]])
        assert list(held.values()) == [True]
        with pytest.raises(WorkerError, match=r"^hist: no reply .* within 3 s"):
            eng.histograms({0: np.arange(600)})
        eng.pool._client.run(lambda p: __import__("treeflare.crypto.dask_pool", fromlist=["_"])
                             ._state_of(p)[1].release(), pid, workers=[eng.pool.addrs[1]])
    finally:
        eng.close()
    monkeypatch.setenv(dask_pool.DEADLINE_ENV, "-1")
    with pytest.raises(ValueError, match=dask_pool.DEADLINE_ENV):
        dask_pool.deadline_s()


def test_a_party_that_crashes_leaves_its_state_until_the_workers_restart(cluster):
    """A party that ends without closing its pool (a crash: no finalizer runs) leaves its state (here a shard's
    ciphertexts) in the remote workers' memory; restarting the workers clears it."""
    kh = PaillierKeyHolder.generate(BITS, "djn")
    eng = HistEngine(kh.public, np.zeros((600, 1), dtype=np.uint8), [2], workers=_spec(cluster))
    eng.load(kh.encrypt_bytes([1] * 600), 1)
    eng.pool._finalizer.detach()
    eng.pool._client.close()
    assert _states(cluster) == [1, 1]
    with Client(cluster, set_as_default=False) as c:
        c.restart()
    assert _states(cluster) == [0, 0]


def test_operations_only_from_the_package(cluster):
    with pytest.raises(ValueError, match="treeflare package"):
        DaskPool(_spec(cluster), ["os"])


@pytest.mark.parametrize("scheme, bits", [("paillier", BITS), ("ou", 768)])
def test_same_model_as_oracle_and_one_worker(cluster, monkeypatch, scheme, bits):
    """Both parties' crypto on the cluster (one cluster for the test's economy; each pool's state is its own)."""
    made = []
    init = DaskPool.__init__

    def recording(self, spec, modules):
        init(self, spec, modules)
        made.append((tuple(modules), self.n))

    monkeypatch.setattr(DaskPool, "__init__", recording)
    d = _data()
    P = VerticalParams(model="gbdt", objective="binary", n_trees=2, max_depth=3, bins=8, min_rows_node=4,
                       key_bits=bits, allow_insecure_key=True, workers=1, scheme=scheme,
                       obfuscation="djn" if scheme == "paillier" else "full").validate()
    one = run_vertical(d, P)
    assert made == []
    on_dask = run_vertical(d, replace(P, workers=_spec(cluster)))
    assert compare_runs(on_dask, one)["identical"]
    assert compare_runs(on_dask, run_oracle(d, P))["identical"]
    # both parties ran on the cluster: the active's key holder and the passive's histogram engine, 2 workers each
    mods = {m for m, _n in made}
    assert {n for _m, n in made} == {2}
    assert any("treeflare.vertical.histo" in m for m in mods) and any(
        "treeflare.vertical.histo" not in m for m in mods), made
    assert _states(cluster) == [0, 0], "a closed pool left state on the workers"


def test_histograms_sharded_and_tree_reduced(cluster):
    """HistEngine on the cluster: each worker holds only its rows; the node sums equal one worker's; merges run
    on the cluster and the counts agree."""
    kh = PaillierKeyHolder.generate(BITS, "djn")
    pub = kh.public
    rng = np.random.default_rng(0)
    n = 600
    bins = rng.integers(0, 5, size=(n, 3)).astype(np.uint8)
    raw = kh.encrypt_bytes([int(v) for v in rng.integers(0, 1000, size=n)])
    nodes = {0: np.arange(n), 1: np.sort(rng.choice(n, 250, replace=False)), 2: np.array([3, 599]),
             3: np.array([], dtype=np.int64)}
    ref = HistEngine(pub, bins, [5, 5, 5], workers=1)
    eng = HistEngine(pub, bins, [5, 5, 5], workers=_spec(cluster))
    try:
        assert eng.pool.n == 2 and eng.shards == [(0, 300), (300, 600)]
        ref.load(raw, 1)
        eng.load(raw, 1)
        def sums(e, ns):
            return {k: e.sums(h) for k, h in e.histograms(ns).items()}

        def packed(e):      # bin 0 of each column, three times over in one ciphertext
            h = e.histograms({0: nodes[0]})[0]
            return e.compress([[(u[0], 20)] * 3 for u in e.handles(h, np.arange(3), np.zeros(3, dtype=np.int64))])

        assert sums(eng, nodes) == sums(ref, nodes)
        assert eng.counts["multiplications"] >= ref.counts["multiplications"]
        assert packed(eng) == packed(ref)
        with pytest.raises(ValueError, match="outside the party's rows"):
            eng.histograms({0: np.array([n])})
    finally:
        eng.close()
        ref.close()
    # fewer rows than workers: a worker with no rows contributes neutral partials
    tiny = HistEngine(pub, bins[:1], [5, 5, 5], workers=_spec(cluster))
    tiny_ref = HistEngine(pub, bins[:1], [5, 5, 5], workers=1)
    try:
        assert tiny.shards == [(0, 0), (0, 1)]
        w = pub.ct_bytes
        tiny.load(raw[:w], 1)
        tiny_ref.load(raw[:w], 1)
        assert sums(tiny, {0: np.array([0])}) == sums(tiny_ref, {0: np.array([0])})
    finally:
        tiny.close()
        tiny_ref.close()
    assert _states(cluster) == [0, 0]


def test_dask_local_closes_its_processes():
    """dask-local:N starts its own cluster, on loopback only and without a dashboard, and closes it: no process
    of it is left."""
    before = _descendants()
    kh = PaillierKeyHolder.generate(BITS, "djn")
    vals = list(range(-100, 300))
    kh_dask = PaillierKeyHolder(kh.key)
    try:
        raw = kh_dask.encrypt_bytes(vals, "dask-local:2")     # the key holder's own cluster, started here
        (pool,) = kh_dask._pools.values()
        assert pool.n == 2 and len(_descendants() - before) >= 2
        # loopback only, no dashboard
        assert all(a.startswith("tls://127.0.0.1:") for a in pool.addrs)
        procs = [psutil.Process()] + psutil.Process().children(recursive=True)
        listening = [c.laddr for p in procs for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        assert 8787 not in {addr.port for addr in listening}      # Dask's dashboard port
        assert kh.decrypt_bytes(raw) == vals
        assert kh_dask.decrypt_bytes(raw, "dask-local:2") == vals
    finally:
        kh_dask.close()
    _wait_gone(_descendants() - before)
    assert not (_descendants() - before)


def test_site_environment_names_its_own_cluster(monkeypatch):
    """A site's $TREEFLARE_VERTICAL_WORKERS overrides the job's workers (a site runs its own cluster); a bad one
    is refused naming the variable."""
    from treeflare.flare.vertical.executor import WORKERS_ENV, VerticalExecutor

    ex = VerticalExecutor(workers="dask-local:2")
    assert ex._site_workers() == "dask-local:2"
    monkeypatch.setenv(WORKERS_ENV, "dask://10.1.2.3:8786")
    assert ex._site_workers() == "dask://10.1.2.3:8786"
    monkeypatch.setenv(WORKERS_ENV, "dask://10.1.2.3")
    with pytest.raises(ValueError, match=f"^{WORKERS_ENV} must be"):
        ex._site_workers()
    with pytest.raises(ValueError, match="^VerticalExecutor workers must be"):
        VerticalExecutor(workers="lots")
    # the job's executor config and the server's task never name a scheduler; the site's environment wins
    with pytest.raises(ValueError, match="^VerticalExecutor workers: a Dask scheduler address"):
        VerticalExecutor(workers="dask://203.0.113.5:8786")
    from treeflare.vertical import ProtocolError
    task = VerticalParams(key_bits=BITS, allow_insecure_key=True).to_dict()
    with pytest.raises(ProtocolError, match="^params.workers: a Dask scheduler address"):
        ex._active_params({**task, "workers": "dask://203.0.113.5:8786"})
    monkeypatch.setenv(WORKERS_ENV, "dask://10.1.2.3:8786")
    got = ex._active_params({**task, "workers": 3})
    assert got.workers == "dask://10.1.2.3:8786" and got.to_record()["workers"] == "site"
    monkeypatch.delenv(WORKERS_ENV)
    assert VerticalExecutor()._active_params({**task, "workers": "dask-local:2"}).workers == "dask-local:2"


def test_a_worker_that_dies_fails_the_call(monkeypatch):
    """A Dask worker that leaves takes its shard with it: the next call fails with a clear error (no hang, no
    partial sums)."""
    from treeflare.crypto import dask_pool

    monkeypatch.setattr(dask_pool, "_POLL_S", 0.5)
    kh = PaillierKeyHolder.generate(BITS, "djn")
    bins = np.zeros((600, 1), dtype=np.uint8)
    eng = HistEngine(kh.public, bins, [2], workers="dask-local:2")
    try:
        eng.load(kh.encrypt_bytes([1] * 600), 1)
        pids = eng.pool._client.run(os.getpid)
        psutil.Process(pids[eng.pool.addrs[1]]).kill()
        with pytest.raises(WorkerError, match="left the cluster"):
            eng.histograms({0: np.arange(600)})
    finally:
        eng.close()


def test_local_shards_with_and_without_the_kernel(monkeypatch):
    """Local worker processes: partials in the C kernel's form (merged in it) and as plain ciphertexts (workers
    without the kernel, merged with gmpy2) give the same sums as one in-process worker."""
    from treeflare.crypto import native

    kh = PaillierKeyHolder.generate(BITS, "djn")
    rng = np.random.default_rng(1)
    n = 700
    bins = rng.integers(0, 4, size=(n, 3)).astype(np.uint8)
    raw = kh.encrypt_bytes([int(v) for v in rng.integers(0, 50, size=n)])
    nodes = {0: np.arange(n), 1: np.sort(rng.choice(n, 300, replace=False)), 2: np.array([0, 1, 699])}
    engines = [HistEngine(kh.public, bins, [4, 4, 4], workers=1), HistEngine(kh.public, bins, [4, 4, 4], workers=2)]
    monkeypatch.setenv("TREEFLARE_NATIVE", "0")          # worker processes started now run gmpy2 only
    engines.append(HistEngine(kh.public, bins, [4, 4, 4], workers=2))
    try:
        assert [e.pool.n for e in engines] == [1, 2, 2]
        assert engines[2].mont is False and engines[1].mont == (native.status().startswith("on"))
        for e in engines:
            e.load(raw, 1)
        got = [{k: e.sums(h) for k, h in e.histograms(nodes).items()} for e in engines]
        assert got[0] == got[1] == got[2]
        # packing from the kernel's form (engines 0 and 1) and from ciphertexts (engine 2): the same ciphertexts
        packed = []
        for e in engines:
            h = e.histograms({0: nodes[0]})[0]
            fields = e.handles(h, np.arange(3), np.full(3, 2, dtype=np.int64))
            packed.append(e.compress([[(f[0], 25) for f in fields], [(fields[0][0], 7)]]))
        assert packed[0] == packed[1] == packed[2]
        assert len({e.counts["multiplications"] for e in engines[1:]}) == 1
    finally:
        for e in engines:
            e.close()
