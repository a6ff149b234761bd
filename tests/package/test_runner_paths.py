"""NVFlare's simulator splits its command lines on spaces, so the runner hands it paths
without any (links to the real folders). The simulator run with such a workspace is in test_hostile_sim.py."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from treeflare.flare.runner import shell_safe_paths


def test_a_safe_path_is_used_as_it_is_with_a_short_private_tmpdir(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    root = tmp_path / "flare"
    root.mkdir()
    with shell_safe_paths(root) as seen:
        assert seen == root
        private = Path(os.environ["TMPDIR"])
        assert tempfile.gettempdir() == str(private) and private.parent.name.startswith("tf-sim-")
        assert len(str(private)) < 30  # multiprocessing's socket paths must stay under 108 bytes
        (private / "left-behind").mkdir()  # what a killed simulator process leaves
    assert not private.parent.exists()
    assert os.environ["TMPDIR"] == str(tmp_path) and sorted(p.name for p in tmp_path.iterdir()) == ["flare"]


def test_workspace_with_a_space_is_reached_through_a_link(tmp_path):
    root = tmp_path / "my work space" / "flare"
    root.mkdir(parents=True)
    with shell_safe_paths(root) as seen:
        assert " " not in str(seen) and seen.resolve() == root.resolve()
        assert " " not in tempfile.gettempdir()
        (seen / "written.txt").write_text("through the link")
        alias = seen.parent
    assert (root / "written.txt").read_text() == "through the link"  # the files stay, the link goes
    assert not alias.exists()
    assert tempfile.gettempdir() != str(alias / "tmp")


def test_python_in_a_folder_with_a_space(tmp_path, monkeypatch):
    """A virtual environment under a path with a space: the simulator gets a link to the environment, and
    Python started through it still finds the environment's packages."""
    env = tmp_path / "my env"
    env.symlink_to(Path(sys.prefix), target_is_directory=True)
    python = env / Path(sys.executable).relative_to(sys.prefix)
    monkeypatch.setattr(sys, "prefix", str(env))
    monkeypatch.setattr(sys, "executable", str(python))
    root = tmp_path / "flare"
    root.mkdir()
    with shell_safe_paths(root):
        exe = sys.executable
        assert " " not in exe
        out = subprocess.run([exe, "-c", "import sys, treeflare, nvflare; print(sys.prefix)"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    assert sys.executable == str(python)
