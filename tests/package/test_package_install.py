"""`pip install .` as a user does it: the wheel builds, installs into a fresh environment with its dependencies
declared, and brings the `treeflare` command, which answers at once and runs the main job (issue 34).

The fresh venv reuses this environment's packages (a .pth line) and installs with --no-index, so nothing is
downloaded: pip still checks every declared dependency against what it finds, and fails if one is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv's bin folder, the wheel) after `pip install --no-index treeflare` from a built wheel."""
    tmp = tmp_path_factory.mktemp("install")
    # a copy of what the build reads: setuptools writes build/ and egg-info beside the sources, never in ours
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(REPO / name, source / name)
    shutil.copytree(REPO / "custom", source / "custom",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so"))
    dist = tmp / "dist"
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, source])
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(dist.glob("treeflare-*.whl"))
    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", venv])
    assert made.returncode == 0, made.stderr
    site = next((venv / "lib").glob("python*/site-packages"))
    # this environment's packages, behind the fresh venv's own (an editable treeflare here is skipped below)
    (site / "reuse_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    python = venv / "bin" / "python"
    done = run([python, "-m", "pip", "install", "--no-index", "--force-reinstall", "--no-deps", wheel], env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    # the dependencies it declares are all there (pip reads them from the installed wheel's metadata)
    check = run([python, "-m", "pip", "check"], env=env)
    assert "treeflare" not in check.stdout, check.stdout
    return venv / "bin", wheel, env


def test_the_wheel_declares_its_dependencies_and_the_command(installed):
    _, wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    for dep in ("nvflare", "xgboost", "numpy", "pandas", "scikit-learn", "gmpy2", "psutil", "matplotlib"):
        assert f"Requires-Dist: {dep}" in meta, dep
    assert "treeflare = treeflare.command:main" in entry
    assert "treeflare/py.typed" in names and "treeflare/crypto/native/" in "".join(names)
    assert not any("/tests/" in n or n.startswith("scripts/") for n in names)
    assert "treeflare/data/datasets/car/car.data.gz" in names  # the embedded datasets the jobs run on


def test_the_installed_command_answers_at_once_and_says_what_is_wrong(installed):
    bin_dir, _, env = installed
    cmd = bin_dir / "treeflare"
    took = []
    for _ in range(3):
        t = time.perf_counter()
        help_ = run([cmd, "--help"], env=env, cwd=bin_dir)
        took.append(time.perf_counter() - t)
        assert help_.returncode == 0 and "icdta4fl" in help_.stdout and "predict" in help_.stdout
    # not a timing test (benchmarks time things): a help that imports NVFlare would take seconds, not a fraction
    assert sorted(took)[1] < 1.0, took
    typo = run([cmd, "icdtafl"], env=env, cwd=bin_dir)
    assert typo.returncode == 2 and "did you mean 'icdta4fl'" in typo.stderr
    # the command runs the installed copy, not this checkout
    where = run([bin_dir / "python", "-c", "import treeflare; print(treeflare.__file__)"], env=env, cwd=bin_dir)
    assert str(bin_dir.parent) in where.stdout, where.stdout


@pytest.mark.flare
def test_the_installed_command_runs_the_main_job(installed, tmp_path):
    from flare_helpers import isolated_env, kill_token

    bin_dir, _, env = installed
    token = "install-" + tmp_path.name
    env = {**isolated_env(tmp_path, token), "PIP_NO_INDEX": "1"}
    try:
        done = run([bin_dir / "treeflare", "icdta4fl", "--dataset", "car", "--sites", "3", "--refine-rounds", "0",
                    "--workspace", tmp_path / "ws"], env=env, cwd=tmp_path)
    finally:
        kill_token(token)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import json

    report = json.loads((tmp_path / "ws" / "report.json").read_text())
    assert report["job"] == "icdta4fl" and report["n_sites"] == 3 and report["global"]["n_leaves"] >= 2
    assert (tmp_path / "ws" / "global_tree.json").is_file()
