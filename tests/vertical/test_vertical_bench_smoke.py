"""scripts/bench_vertical.py's peers and memory sections at a tiny size: every party in its own process, the
messages between them framed without pickle, the plaintext-oracle identity, the memory per party, and the memory
regression check's non-zero exit.  (A smoke test: no timing is asserted; the figures come from the full run.)"""
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flare_helpers import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


runner = load_script("scripts/vertical_bench_runner.py", "vertical_bench_runner")
bench = load_script("scripts/bench_vertical.py", "bench_vertical")  # scripts/ importable: it imports bench_common


def _run_tree(cmd, timeout: float, **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)`` for a script whose parties and workers
    are processes of their own: on timeout the whole tree is ended, since ``subprocess.run`` kills only the script,
    and then waits for ever on the pipes its children still hold."""
    from treeflare.processes import end_tree

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_tree([proc.pid], grace=2.0)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{Path(cmd[1]).name} did not end within {timeout:.0f} s:\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_party_messages_round_trip_exactly():
    msg = {"type": "layer", "tree": 0, "open": [1, 2], "big": 1 << 4100, "neg": -(1 << 70), "f": 0.1, "nan": None,
           "pk": {"n": b"\x00\xff\x10", "scheme": "paillier"}, "flag": True,
           "gradients": {"cts": np.arange(12, dtype=np.uint8).reshape(3, 4), "pos": np.array([-1, 5], np.int32),
                         "w": np.array([0.5, np.nan, -np.inf])},
           "nodes": [{"nid": 3, "sel": np.zeros(0, np.uint8)}], "ints": {7: "seven"}}
    buf = io.BytesIO()
    runner.send(buf, msg)
    buf.seek(0)
    got = runner.receive(buf)
    assert got["big"] == 1 << 4100 and got["neg"] == -(1 << 70) and got["pk"]["n"] == b"\x00\xff\x10"
    assert got["ints"] == {7: "seven"} and got["flag"] is True and got["f"] == 0.1
    g = got["gradients"]
    assert g["cts"].dtype == np.uint8 and g["cts"].shape == (3, 4) and np.array_equal(g["cts"], msg["gradients"]["cts"])
    assert g["pos"].dtype == np.int32 and list(g["pos"]) == [-1, 5]
    assert np.array_equal(g["w"], msg["gradients"]["w"], equal_nan=True)
    assert got["nodes"][0]["sel"].shape == (0,)


@pytest.mark.parametrize("bad", [np.array([object()], dtype=object), {1, 2}, object()])
def test_party_messages_refuse_what_is_not_plain_data(bad):
    with pytest.raises(TypeError, match="cross between parties"):
        runner.send(io.BytesIO(), {"x": bad})


def test_memory_check_names_the_party_over_budget():
    row = {"section": "memory", "workload": "fate_1000000", "arm": "paillier", "n_train": 1_000_000,
           "runs": [{"memory": {"site-1": {"peak_sampled_mb": 7.9 * 1024, "peak_hwm_sum_mb": 9000.0},
                                "site-2": {"peak_sampled_mb": 8.2 * 1024, "peak_hwm_sum_mb": 9000.0}}}]}
    fails = bench.memory_failures([row], 7.5, 0.5)
    assert len(fails) == 1 and "site-2" in fails[0] and "8.20 GB" in fails[0] and "8.00 GB" in fails[0]
    assert bench.memory_failures([row], 8.0, 0.5) == []


def test_a9a_shape_is_binary_one_hot_over_two_parties():
    d = bench.a9a_shape_data(n_rows=2000)
    X = np.hstack([d.X_active, d.X_passive[0]])
    assert X.shape[1] == 119 and d.X_active.shape[1] == 60 and len(d.y) == 1600
    assert set(np.unique(X)) <= {0.0, 1.0} and 0 < d.y.mean() < 0.5        # imbalanced, as adult is


def test_peers_and_memory_sections_run_and_the_memory_check_fails_loudly(tmp_path):
    readme_before = (REPO / "README.md").read_text()
    cmd = [sys.executable, str(SCRIPTS / "bench_vertical.py"), "--tiny", "--sections", "peers,memory",
           "--key-bits", "1024", "--shapes", "fate", "--arms", "paillier", "--memory-rows", "300", "--code-ref", "worktree",
           "--results-dir", str(tmp_path), "--memory-budget-fixed-gb=0.001", "--memory-guard=0"]
    proc = _run_tree(cmd, 240)
    # a party's resident memory exceeds a 1 MB budget: the script says which and exits non-zero
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "MEMORY REGRESSION: memory fate_300" in proc.stdout and "site-2 peaked at" in proc.stdout
    peers = json.loads((tmp_path / "peers_tiny.json").read_text())
    rows = {(r["workload"], r["arm"]): r for r in peers["rows"]}
    assert set(rows) == {("fate", "paillier")}      # the a9a shape's data: the test above; its run: the same code
    for r in rows.values():
        assert r["identical_to_oracle"] is True, r
        assert r["repeats"] == 1 and r["per_tree_s"] > 0
        assert r["crypto"]["scheme"] == "paillier" and r["crypto"]["encryptions"] > 0
        # each party measured in its own process, its workers included
        assert set(r["peak_mb"]) == {"site-1", "site-2"} and all(v > 10 for v in r["peak_mb"].values())
        assert r["phases_s_per_tree"]["active encryption"] > 0
    mem = json.loads((tmp_path / "memory_tiny.json").read_text())
    assert [r["n_train"] for r in mem["rows"]] == [300] and mem["rows"][0]["budget_mb"] < 5
    page = (tmp_path / "peers_tiny.md").read_text()
    assert "FedTree-Verti+HE" in page and "| fate | Paillier" in page
    assert (REPO / "README.md").read_text() == readme_before      # a tiny run never writes the docs


def test_a_party_past_the_memory_guard_is_stopped_and_named(tmp_path):
    """The benchmark's guard for the shared machine: a party whose memory passes the limit stops (with its
    workers) and says so; the run fails instead of taking the memory other work needs."""
    data = bench.save_data(bench.synthetic_data(300, 1, 2, passive_features=4), tmp_path / "d.npz")
    params = bench.VerticalParams(model="gbdt", max_depth=2, key_bits=1024, allow_insecure_key=True, workers=1)
    (tmp_path / "p.json").write_text(json.dumps(params.to_dict()))
    env = {**__import__("os").environ, runner.LIMIT_ENV: "1"}
    proc = _run_tree([sys.executable, str(SCRIPTS / "vertical_bench_runner.py"), str(data), str(tmp_path / "p.json"),
                      "--split"], 120, env=env)
    assert proc.returncode != 0
    assert "memory limit: site-" in proc.stderr and "over the run's limit of 1 MB; stopped" in proc.stderr


def test_kernels_section_records_cpu_and_kernel_in_every_row(tmp_path):
    """The kernels section (issue 38): each arithmetic forced by TREEFLARE_NATIVE, the kernel each run reported and
    the CPU model in every row, the plaintext-oracle identity, the portable/Python verdict; no docs written."""
    readme_before = (REPO / "README.md").read_text()
    cmd = [sys.executable, str(SCRIPTS / "bench_vertical.py"), "--tiny", "--sections", "kernels", "--key-bits", "1024",
           "--kernel-arms", "portable,python", "--kernel-trees", "2", "--code-ref", "worktree",
           "--results-dir", str(tmp_path)]
    proc = _run_tree(cmd, 240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "kernels_tiny.json").read_text())
    rows = {r["arm"]: r for r in res["rows"]}
    assert set(rows) == {"portable", "python"} and res["settings"]["cpu"] == bench.cpu_model()
    assert rows["python"]["native_kernel"] == "off (TREEFLARE_NATIVE=0)"
    assert rows["portable"]["native_kernel"].startswith("on (portable") or "failed" in rows["portable"]
    for r in rows.values():
        assert r["cpu"] == bench.cpu_model() and "AVX-512 IFMA" in r["cpu"]
        if r.get("runs"):
            assert r["identical_to_oracle"] is True and len(r["tree_s_all"]) == 2 and r["per_tree_s"] > 0
    page = (tmp_path / "kernels_tiny.md").read_text()
    assert "x Python" in page and bench.cpu_model() in page and "0.4x the Python path" in page
    assert (REPO / "README.md").read_text() == readme_before      # a tiny run never writes the docs


def test_noifma_script_pairs_each_scheme_on_both_kernels(tmp_path):
    """scripts/bench_vertical_noifma.py (issue 38): per shape and scheme, the IFMA and the portable arm of one run,
    each forced by TREEFLARE_NATIVE and checked against the kernel the run reported (a CPU without IFMA fails that
    arm with the reason), both compared with the plaintext oracle, the FedTree target on the a9a OU row; no docs."""
    readme_before = (REPO / "README.md").read_text()
    cmd = [sys.executable, str(SCRIPTS / "bench_vertical_noifma.py"), "--tiny", "--key-bits", "1024", "--shapes", "a9a",
           "--schemes", "ou32", "--repeats", "1", "--code-ref", "worktree", "--results-dir", str(tmp_path)]
    proc = _run_tree(cmd, 240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads((tmp_path / "noifma_tiny.json").read_text())
    rows = {r["arm"]: r for r in res["rows"]}
    assert set(rows) == {"ou32_ifma", "ou32_portable"} and res["partial"] is False
    assert rows["ou32_portable"]["native_kernel"].startswith("on (portable")
    if "with AVX-512 IFMA" in bench.cpu_model():
        assert rows["ou32_ifma"]["native_kernel"] == "on (AVX-512 IFMA)"
    else:
        assert "asked TREEFLARE_NATIVE=ifma" in rows["ou32_ifma"]["failed"]
    for r in rows.values():
        assert r["cpu"] == bench.cpu_model() and r["precision"] == 32
        if r.get("runs"):
            assert r["identical_to_oracle"] is True and r["per_tree_s"] > 0
    page = (tmp_path / "noifma_tiny.md").read_text()
    assert "portable <= 5.25 s (FedTree" in page and bench.cpu_model() in page
    assert (REPO / "README.md").read_text() == readme_before      # a tiny run never writes the docs
