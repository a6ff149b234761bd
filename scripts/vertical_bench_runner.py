"""One benchmark arm of scripts/bench_vertical.py, in its own process: run the vertical protocol on a saved
dataset and print a JSON result on the last line of stdout.

Two ways to run it:

    python scripts/vertical_bench_runner.py DATA PARAMS.json            # in process: every party in this one
    python scripts/vertical_bench_runner.py DATA PARAMS.json --split    # one process per party

In process, it only uses the API that both today's package and the earlier one (the "legacy" arm, imported
from an extracted copy through PYTHONPATH) have: VerticalData, VerticalParams.from_dict, run_vertical,
crypto_report, canonical.

``--split`` measures what each party needs: this process is the active party and starts one process per
passive party (``--passive I``, which loads only that party's columns); the driver's messages cross a pipe
between them, framed as the crypto workers frame theirs (JSON header + raw array bytes, no pickle).  Each party
process samples the resident memory of itself and all its descendants (its crypto workers, or its Dask
cluster) every ``SAMPLE_S`` seconds (and stops, with a message, past ``$TREEFLARE_BENCH_MEMORY_LIMIT_MB``: the
benchmark's guard for a shared machine), and reads each process's own high-water mark (VmHWM), so a party's peak is
reported both as the largest sampled sum and as the sum of high-water marks (an upper bound: those peaks need
not coincide).  RSS counts pages shared between processes (libraries) once per process: an over-count, never
an under-count.

DATA is a ``.npz`` file or a folder of ``.npy`` files (``Xa``, ``y``, ``Xat``, ``yt``, ``Xp0``, ``Xpt0``, ...)
with ``meta.json`` (what scripts/bench_vertical.py writes for large shapes, block by block).
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

SAMPLE_S = 0.2
LIMIT_ENV = "TREEFLARE_BENCH_MEMORY_LIMIT_MB"   # a party over this many MB (it and its workers) is stopped
_PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------- data
class _Source:
    """The arrays of DATA, each read only when asked for (a passive party reads its own columns only)."""

    def __init__(self, path):
        self.path = Path(path)
        if self.path.is_dir():
            self._npz = None
            self.meta = json.loads((self.path / "meta.json").read_text())
        else:
            self._npz = np.load(self.path, allow_pickle=False)
            self.meta = json.loads(str(self._npz["meta"]))

    def __getitem__(self, key):
        if self._npz is not None:
            return self._npz[key]
        return np.load(self.path / f"{key}.npy", allow_pickle=False)


def _ids(meta, n, key):
    ids = meta.get(key)
    return list(ids) if ids is not None else [str(i) for i in range(n)]


def load_data(path):
    from treeflare.vertical import VerticalData

    z = _Source(path)
    meta = z.meta
    k = meta["n_passive"]
    y, yt = z["y"], z["yt"]
    return VerticalData(
        X_active=z["Xa"], y=y, X_passive=[z[f"Xp{i}"] for i in range(k)], X_active_test=z["Xat"],
        y_test=yt, X_passive_test=[z[f"Xpt{i}"] for i in range(k)], names_active=meta["names_active"],
        names_passive=meta["names_passive"], n_classes=meta["n_classes"],
        ids_train=_ids(meta, len(y), "ids_train"), ids_test=_ids(meta, len(yt), "ids_test"))


def party_data(path, role):
    """The VerticalData that one party's process builds its party from: its own columns in full, one placeholder
    column of zeros for every other party (the driver's make_parties builds every party; the others are
    discarded unused, so the party is built exactly as the in-process driver builds it)."""
    from treeflare.vertical import VerticalData

    z = _Source(path)
    meta = z.meta
    k = meta["n_passive"]
    n, n_test = int(meta["n_train"]), int(meta["n_test"])
    blank, blank_t = np.zeros((n, 1)), np.zeros((n_test, 1))
    if role == "active":
        Xa, y, Xat, yt = z["Xa"], z["y"], z["Xat"], z["yt"]
        Xp, Xpt = [blank] * k, [blank_t] * k
        names_p = [["placeholder"]] * k
    else:
        i = int(role)
        Xa, Xat = blank, blank_t
        y, yt = np.zeros(n, dtype=np.int64), np.zeros(n_test, dtype=np.int64)
        Xp, Xpt = [blank] * k, [blank_t] * k
        Xp[i], Xpt[i] = z[f"Xp{i}"], z[f"Xpt{i}"]
        names_p = [["placeholder"]] * k
        names_p[i] = meta["names_passive"][i]
    return VerticalData(
        X_active=Xa, y=y, X_passive=Xp, X_active_test=Xat, y_test=yt, X_passive_test=Xpt,
        names_active=meta["names_active"] if role == "active" else ["placeholder"], names_passive=names_p,
        n_classes=max(2, int(meta["n_classes"])), ids_train=_ids(meta, n, "ids_train"),
        ids_test=_ids(meta, n_test, "ids_test"))


# ---------------------------------------------------------------------------------------- memory
def _descendants(pid: int, exclude=frozenset()) -> list:
    """Every process below ``pid`` (children, their children, ...), skipping the subtrees of ``exclude``."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            try:
                kids = open(f"/proc/{p}/task/{t}/children").read().split()
            except OSError:
                continue
            for c in map(int, kids):
                if c not in exclude:
                    out.append(c)
                    todo.append(c)
    return out


def _rss(pid: int) -> int:
    try:
        return int(open(f"/proc/{pid}/statm").read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _hwm(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class MemorySampler:
    """Peak resident memory of this process and its descendants, sampled in a thread."""

    def __init__(self, party: str, interval: float = SAMPLE_S, exclude=()):
        self.interval = interval
        self.exclude = frozenset(exclude)    # processes of other parties started from this one
        self.party = party
        self.limit = int(float(os.environ.get(LIMIT_ENV) or 0) * 2**20)
        self.pid = os.getpid()
        self.peak_sum = 0
        self.hwm: dict = {}          # pid -> its own high-water mark, last read while it lived
        self.max_processes = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self):
        pids = [self.pid] + _descendants(self.pid, self.exclude)
        self.max_processes = max(self.max_processes, len(pids))
        now = sum(_rss(p) for p in pids)
        self.peak_sum = max(self.peak_sum, now)
        if self.limit and now > self.limit:
            # the benchmark's guard for the shared machine: stop this party (and its workers) before it takes the
            # memory other work needs; the benchmark reports the run as over its memory budget
            sys.stderr.write(f"memory limit: {self.party} reached {now / 2**20:,.0f} MB, over the run's limit of "
                             f"{self.limit / 2**20:,.0f} MB; stopped\n")
            sys.stderr.flush()
            for p in reversed(pids[1:]):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            os._exit(3)
        for p in pids:
            h = _hwm(p)
            if h:
                self.hwm[p] = max(self.hwm.get(p, 0), h)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.sample()

    def report(self) -> dict:
        own = max(self.hwm.get(self.pid, 0), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        others = sum(v for p, v in self.hwm.items() if p != self.pid)
        mb = 1024.0 * 1024.0
        return {"peak_sampled_mb": self.peak_sum / mb, "peak_hwm_sum_mb": (own + others) / mb,
                "party_process_hwm_mb": own / mb, "helpers_hwm_sum_mb": others / mb,
                "helper_processes_seen": len([p for p in self.hwm if p != self.pid]),
                "sample_interval_s": self.interval}


# ---------------------------------------------------------------------------------------- messages
_SCALARS = (str, int, float, bool, type(None))


def _encode(obj, blobs):
    if isinstance(obj, dict):
        if any(not isinstance(k, str) for k in obj):
            return {"__dict__": [[_encode(k, blobs), _encode(v, blobs)] for k, v in obj.items()]}
        return {k: _encode(v, blobs) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if all(type(v) in _SCALARS for v in obj):          # a layer's split ids: hundreds of thousands of strings
            return list(obj)
        return [_encode(v, blobs) for v in obj]
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"message array of dtype {obj.dtype}: only numeric arrays cross between parties")
        a = np.ascontiguousarray(obj)
        blobs.append(memoryview(a).cast("B"))
        return {"__nd__": len(blobs) - 1, "dtype": a.dtype.str, "shape": list(a.shape)}
    if isinstance(obj, (bytes, bytearray)):
        blobs.append(memoryview(bytes(obj)))
        return {"__bytes__": len(blobs) - 1}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"message value of type {type(obj).__name__} cannot cross between parties")


def _decode(obj, blobs):
    if isinstance(obj, dict):
        if "__nd__" in obj:
            return np.frombuffer(blobs[obj["__nd__"]], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"])
        if "__bytes__" in obj:
            return bytes(blobs[obj["__bytes__"]])
        if "__dict__" in obj:
            return {_decode(k, blobs): _decode(v, blobs) for k, v in obj["__dict__"]}
        return {k: _decode(v, blobs) for k, v in obj.items()}
    if isinstance(obj, list):
        if all(type(v) in _SCALARS for v in obj):
            return obj
        return [_decode(v, blobs) for v in obj]
    return obj


def send(fh, obj) -> int:
    """Write one message; returns its size in bytes."""
    blobs: list = []
    header = json.dumps(_encode(obj, blobs), separators=(",", ":")).encode()
    fh.write(len(header).to_bytes(8, "little"))
    fh.write(header)
    fh.write(len(blobs).to_bytes(8, "little"))
    for b in blobs:
        fh.write(b.nbytes.to_bytes(8, "little"))
        fh.write(b)
    fh.flush()
    return len(header) + sum(b.nbytes for b in blobs)


def _read_into(fh, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = fh.readinto(view[got:])
        if not k:
            raise EOFError("party pipe closed")
        got += k
    return buf


def receive(fh):
    header = json.loads(bytes(_read_into(fh, int.from_bytes(_read_into(fh, 8), "little"))))
    count = int.from_bytes(_read_into(fh, 8), "little")
    blobs = [_read_into(fh, int.from_bytes(_read_into(fh, 8), "little")) for _ in range(count)]
    return _decode(header, blobs)


# ---------------------------------------------------------------------------------------- runs
def _result(a, passive_models, passive_timings, wall, c0, extra=None):
    import treeflare
    from treeflare.vertical import crypto_report

    canon = None
    if passive_models is not None:                   # split runs (today's package only)
        from treeflare.vertical.driver import joint_model
        canon = json.dumps(joint_model(a.model(), passive_models), sort_keys=True)
    trees = [float(v) for k, v in sorted(a.timings.items(), key=lambda kv: kv[0]) if k.startswith("tree_")]
    pred = np.asarray(a.test_pred, dtype=np.float64)
    score = np.asarray(a.test_score, dtype=np.float64)
    out = {
        "package": os.path.dirname(treeflare.__file__),
        "wall_s": wall, "main_cpu_s": time.process_time() - c0, "tree_s": trees,
        "per_tree_s": sum(trees) / max(1, len(trees)),
        "keygen_s": float(a.timings.get("keygen", 0.0)),
        "active_phases_s": {k: float(v) for k, v in a.timings.items() if not k.startswith("tree_")},
        "passive_phases_s": passive_timings,
        "crypto": crypto_report(a),
        "layout": a.layout_info,
        "hist_nodes": int(a.comm.get("hist_nodes", 0)),
        "pred_sha256": hashlib.sha256(pred.tobytes() + score.tobytes()).hexdigest(),
        "pred": pred.tolist(), "score": score.tolist(),
        "peak_rss_mb_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    if canon is not None:
        out["model_sha256"] = hashlib.sha256(canon.encode()).hexdigest()
    out.update(extra or {})
    try:
        from treeflare.crypto import native          # absent in the earlier code
        out["native_kernel"] = native.status()
    except ImportError:
        out["native_kernel"] = "absent (earlier code)"
    return out


def run_in_process(data_path, params_path):
    from treeflare.vertical import VerticalParams, canonical, run_vertical

    data = load_data(data_path)
    params = VerticalParams.from_dict(json.loads(open(params_path).read()))
    t0 = time.perf_counter()
    c0 = time.process_time()
    a, ps = run_vertical(data, params)
    wall = time.perf_counter() - t0
    passive_t = {}
    for p in ps.values():
        for k, v in p.timings.items():
            passive_t[k] = passive_t.get(k, 0.0) + float(v)
    out = _result(a, None, passive_t, wall, c0)
    out["model_sha256"] = hashlib.sha256(canonical(a, ps).encode()).hexdigest()
    return out


def run_split(data_path, params_path):
    """This process is the active party; one process per passive party, messages over pipes."""
    from treeflare.vertical import VerticalParams
    from treeflare.vertical.driver import make_parties

    params = VerticalParams.from_dict(json.loads(open(params_path).read()))
    meta = _Source(data_path).meta
    procs = {}
    try:
        names = [f"site-{i + 2}" for i in range(int(meta["n_passive"]))]
        for i, nm in enumerate(names):
            procs[nm] = subprocess.Popen([sys.executable, __file__, str(data_path), str(params_path), "--passive",
                                          str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with MemorySampler("site-1", exclude={p.pid for p in procs.values()}) as mem_active:
            for nm in names:                          # each passive party loaded and built
                try:
                    ready = receive(procs[nm].stdout)
                except EOFError:
                    ready = None
                if ready != {"type": "ready"}:
                    raise RuntimeError(f"{nm}: did not start")
            t0 = time.perf_counter()
            c0 = time.process_time()
            active, placeholders = make_parties(party_data(data_path, "active"), params)
            placeholders.clear()                      # never started: the real ones are the processes
            out = active.step(None)
            while out is not None:
                replies = {}
                for nm, msg in out.items():
                    send(procs[nm].stdin, {"op": "handle", "msg": msg})
                for nm in out:
                    try:
                        r = receive(procs[nm].stdout)
                    except EOFError:
                        raise RuntimeError(f"{nm}: its process ended (exit code {procs[nm].wait()})") from None
                    if "error" in r:
                        raise RuntimeError(f"{nm}: {r['error']}")
                    replies[nm] = r["reply"]
                out = active.step(replies)
            wall = time.perf_counter() - t0
            active.close()
        models, timings, mem = {}, {}, {"site-1": mem_active.report()}
        for nm in names:
            send(procs[nm].stdin, {"op": "report"})
            r = receive(procs[nm].stdout)
            models[nm] = r["model"]
            mem[nm] = r["memory"]
            for k, v in r["timings"].items():
                timings[k] = timings.get(k, 0.0) + float(v)
        return _result(active, models, timings, wall, c0, {"memory": mem, "split_parties": True})
    finally:
        for p in procs.values():
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def serve_passive(data_path, params_path, index: int):
    """A passive party in its own process: answers the messages the active party's process sends."""
    from treeflare.vertical import VerticalParams
    from treeflare.vertical.driver import make_parties

    inp, outp = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr                          # nothing but frames on the pipe
    params = VerticalParams.from_dict(json.loads(open(params_path).read()))
    name = f"site-{index + 2}"
    with MemorySampler(name) as mem:
        placeholder, passives = make_parties(party_data(data_path, str(index)), params)
        placeholder.close()
        del placeholder
        party = passives.pop(name)
        for other in passives.values():
            other.close()
        passives.clear()
        send(outp, {"type": "ready"})
        while True:
            try:
                req = receive(inp)
            except EOFError:
                party.close()
                return
            if req["op"] == "report":
                break
            try:
                reply = party.handle(req["msg"])
            except Exception as e:                   # the active side reports it, naming this party
                send(outp, {"error": f"{type(e).__name__}: {e}"})
                party.close()
                return
            send(outp, {"reply": reply})
        party.close()
    send(outp, {"model": party.model(), "timings": {k: float(v) for k, v in party.timings.items()},
                "memory": mem.report()})


def main(argv):
    if "--passive" in argv:
        i = argv.index("--passive")
        serve_passive(argv[0], argv[1], int(argv[i + 1]))
        return
    res = run_split(argv[0], argv[1]) if "--split" in argv else run_in_process(argv[0], argv[1])
    print(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1:])
