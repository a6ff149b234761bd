"""The vertical protocol on each arithmetic: the portable C kernel (forced with TREEFLARE_NATIVE=portable, so an
AVX-512 IFMA machine runs it too), the kernel this machine picks, and Python's gmpy2 (TREEFLARE_NATIVE=0) learn
the same models as the plaintext oracle, for both learners and the three boosting objectives, and the report says
which kernel ran.  (The kernels' integers are checked against gmpy2 one by one in tests/crypto/test_crypto_native.py.)"""
from __future__ import annotations

import pytest

from treeflare.crypto import native
from treeflare.vertical import VerticalParams, compare_runs, crypto_report, run_oracle, run_vertical, synthetic


def _use(monkeypatch, value: str) -> str:
    """Select the arithmetic as a fresh process would with TREEFLARE_NATIVE=value; returns the status."""
    monkeypatch.setenv("TREEFLARE_NATIVE", value)
    monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(native, "_STATUS", "not loaded yet")
    return native.status()


CASES = [("tree", dict(model="tree", criterion="gini"), 2, (2,)),
         ("binary", dict(model="gbdt", objective="binary"), 2, (2, 1)),
         ("softmax", dict(model="gbdt", objective="softmax"), 3, (2,)),
         ("squared_error", dict(model="gbdt", objective="squared_error"), 0, (1, 2))]


@pytest.mark.parametrize("name,kw,classes,pf", CASES, ids=[c[0] for c in CASES])
def test_portable_kernel_learns_the_python_paths_model(monkeypatch, name, kw, classes, pf):
    d = synthetic(n=120, n_test=30, passive_features=pf, n_classes=classes, seed=len(name),
                  regression_scale=3.0 if name == "squared_error" else None)
    P = VerticalParams(key_bits=512, allow_insecure_key=True, workers=1, max_depth=3, bins=8, min_rows_node=4,
                       n_trees=1 if name == "tree" else 2, obfuscation="djn" if name == "binary" else "full", **kw)
    orc = run_oracle(d, P)
    runs, said = {}, {}
    for arm in ("portable", "1", "0"):
        st = _use(monkeypatch, arm)
        if arm == "portable" and not st.startswith("on"):
            pytest.skip(f"C kernel not usable here: {st}")
        runs[arm] = run_vertical(d, P)
        said[arm] = crypto_report(runs[arm][0])["native_kernel"]     # the process's kernel, as report.json has it
        assert said[arm] == st
        assert compare_runs(runs[arm], orc)["identical"], (arm, st)
    assert said["portable"].startswith("on (portable") and said["0"] == "off (TREEFLARE_NATIVE=0)"
    assert compare_runs(runs["portable"], runs["0"])["identical"]
    assert runs["portable"][0].trees[0]["nodes"][0]["leaf"] is False          # it learned something


def test_portable_kernel_on_messy_data(monkeypatch):
    """Honest data as sites hold it: missing values in every party, a passive column of a rare category (3 rows of
    300), and imbalanced labels (about 1 in 10 positive): the portable kernel learns the Python path's model and the
    oracle's."""
    import numpy as np
    from dataclasses import replace

    d = synthetic(n=300, n_test=60, passive_features=(3, 2), seed=11)
    rng = np.random.default_rng(11)
    for X in [d.X_active, d.X_active_test] + d.X_passive + d.X_passive_test:
        X[rng.random(X.shape) < 0.05] = np.nan
    for X in (d.X_passive[1], d.X_passive_test[1]):
        X[:, 1] = 0.0                                 # a category column: 0 almost everywhere ...
        X[:3, 1] = 1.0                                # ... and a rare one
    score = np.nan_to_num(d.X_active[:, 0]) + np.nan_to_num(d.X_passive[0][:, 0])
    score_test = np.nan_to_num(d.X_active_test[:, 0]) + np.nan_to_num(d.X_passive_test[0][:, 0])
    cut = np.quantile(score, 0.9)
    d = replace(d, y=(score > cut).astype(np.int64), y_test=(score_test > cut).astype(np.int64))
    assert 0.05 < d.y.mean() < 0.15
    P = VerticalParams(model="gbdt", objective="binary", key_bits=512, allow_insecure_key=True, workers=1, max_depth=3,
                       bins=8, min_rows_node=4, n_trees=2)
    orc = run_oracle(d, P)
    runs = {}
    for arm in ("portable", "0"):
        st = _use(monkeypatch, arm)
        if arm == "portable" and not st.startswith("on (portable"):
            pytest.skip(f"C kernel not usable here: {st}")
        runs[arm] = run_vertical(d, P)
        assert compare_runs(runs[arm], orc)["identical"], (arm, st)
    assert compare_runs(runs["portable"], runs["0"])["identical"]
    assert runs["portable"][0].trees[0]["nodes"][0]["leaf"] is False
