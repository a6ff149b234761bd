"""The job scripts and prepare_data never delete a user's files. A federation folder is
replaced only when treeflare wrote it (its marker file lists what it wrote) and it holds nothing else; the
embedded datasets, and the package that ships them, are never written into (a --workspace there is refused)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from flare_helpers import job_module
from treeflare.data import DataError, load_dataset, prepare_federation, write_federation
from treeflare.data.embedded import REPO_DATA as EMBEDDED
from treeflare.data.federation import MARKER

REPO = Path(__file__).resolve().parents[2]


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def car_fed():
    return prepare_federation(load_dataset("car"), 2, "iid", None, seed=0)


def load_job(name: str):
    return job_module(name)


def run_main(mod, argv, capsys):
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    return e.value.code, capsys.readouterr().err


def test_a_user_file_in_a_federation_folder_is_kept(car_fed, tmp_path):
    out = write_federation(car_fed, tmp_path / "data")
    (out / "my_patients.csv").write_text("id,age\n1,40\n")
    (out / "site-1" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"holds files treeflare did not write \(my_patients.csv, site-1/notes.txt\)"):
        write_federation(car_fed, out, overwrite=True)
    assert (out / "my_patients.csv").read_text() == "id,age\n1,40\n" and (out / "site-1" / "notes.txt").is_file()


def test_a_marker_that_is_not_json_is_not_ours(car_fed, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    (out / MARKER).write_text("not json")
    with pytest.raises(DataError, match="was not written by treeflare"):
        write_federation(car_fed, out, overwrite=True)


@pytest.mark.parametrize("job", ["icdta4fl", "vertical_tree"])
def test_job_refuses_a_users_data_folder(job, tmp_path, capsys):
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "my_patients.csv").write_text("keep me")
    args = ["--dataset", "car", "--workspace", str(ws)] + (["--sites", "2"] if job == "icdta4fl" else [])
    code, err = run_main(load_job(job), args, capsys)
    assert code == 2 and "was not written by treeflare" in err and "Traceback" not in err, err
    assert tree_digest(ws / "data") == {"my_patients.csv": hashlib.sha256(b"keep me").hexdigest()}
    assert not (ws / "flare").exists()  # refused before FLARE started


@pytest.mark.parametrize("job", ["icdta4fl", "vertical_tree"])
def test_a_workspace_inside_the_package_is_refused_and_the_datasets_untouched(job, capsys, monkeypatch):
    """The embedded datasets ship inside the package (treeflare/data/datasets): a --workspace there, or anywhere in
    the package, is refused before anything is written."""
    before = tree_digest(EMBEDDED)
    package = EMBEDDED.parents[1]
    entries = {p: set(os.listdir(p)) for p in (package, EMBEDDED.parent, EMBEDDED)}
    for workspace in (EMBEDDED, EMBEDDED.parent, package):
        monkeypatch.chdir(workspace)
        code, err = run_main(load_job(job), ["--dataset", "car", "--workspace", "."], capsys)
        assert code == 2 and "treeflare package's own folder" in err, err
    assert tree_digest(EMBEDDED) == before
    assert {p: set(os.listdir(p)) for p in entries} == entries  # no report, no federation, no temporary sibling


def test_never_writes_over_around_or_into_data(car_fed):
    for out in (EMBEDDED, EMBEDDED / "federation", REPO):
        with pytest.raises(DataError, match="embedded datasets' folder|treeflare package's own folder"):
            write_federation(car_fed, out, overwrite=True)
    assert not (EMBEDDED / "federation").exists()
