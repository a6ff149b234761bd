import importlib
"""scripts/prepare_data.py end to end: in a subprocess (as a user runs it) and, for the error cases, in-process."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest



ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "prepare_data.py"
CAR_HEADER = "buying,maint,doors,persons,lug_boot,safety,class"


def run(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def files(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def car_runs(tmp_path_factory):
    """Two runs with the same arguments and one with another seed."""
    tmp = tmp_path_factory.mktemp("prep")
    base = ["--dataset", "car", "--sites", 3, "--partition", "label", "--alpha", 0.8]
    procs = {name: run(*base, "--seed", seed, "--out", tmp / name, cwd=tmp)
             for name, seed in (("a", 7), ("b", 7), ("c", 8))}
    return tmp, procs


def test_car_federation_files(car_runs):
    tmp, procs = car_runs
    p = procs["a"]
    assert p.returncode == 0, p.stderr
    out = tmp / "a"
    expected = {"partition.json", "server/test.csv"} | {f"site-{i}/{f}" for i in (1, 2, 3)
                                                        for f in ("train.csv", "test.csv")}
    assert set(files(out)) == expected | {".treeflare-federation.json"}
    n_rows = 0
    for name in expected - {"partition.json"}:
        lines = (out / name).read_text().splitlines()
        assert lines[0] == CAR_HEADER, name
        assert len(lines) > 10, name
        n_rows += len(lines) - 1
    assert n_rows == 1728

    summary = json.loads((out / "partition.json").read_text())
    assert summary["dataset"] == "car" and summary["n_sites"] == 3
    assert summary["partition"] == {"kind": "label", "alpha": 0.8, "seed": 7, "test_size": 0.2,
                                    "local_test_size": 0.2}
    assert [f["name"] for f in summary["schema"]["features"]] == CAR_HEADER.split(",")[:-1]
    assert summary["schema"]["label"] == "class" and len(summary["schema"]["classes"]) == 4
    sizes = [s["n_train"] + s["n_test"] for s in summary["sites"].values()]
    assert sum(sizes) + summary["server"]["n_test"] == 1728
    for name, s in summary["sites"].items():  # sizes in partition.json match the files
        assert s["n_train"] == len((out / name / "train.csv").read_text().splitlines()) - 1
        assert sum(s["class_counts"].values()) == s["n_train"]
    # the printed table: one line per site and the server, and where partition.json is
    lines = p.stdout.splitlines()
    for name, s in summary["sites"].items():
        row = next(line for line in lines if line.startswith(name + " "))
        assert row.split()[1:3] == [str(s["n_train"]), str(s["n_test"])]
    assert any(line.startswith("server") for line in lines)
    assert lines[-1] == f"partition.json: {out / 'partition.json'}"
    assert p.stderr == ""


def test_same_seed_same_bytes_other_seed_other_split(car_runs):
    tmp, procs = car_runs
    assert all(p.returncode == 0 for p in procs.values())
    a, b, c = (files(tmp / n) for n in "abc")
    assert a == b
    assert a["site-1/train.csv"] != c["site-1/train.csv"]


CSV = """customer,age,plan,region,spend,churn
c01,34,basic,north,12.5,no
c02,51,pro,south,80,yes
c03,,basic,north,15,no
c04,29,pro,east,?,no
c05,62,basic,south,22.75,yes
c06,45,pro,north,60,no
c07,38,basic,east,18,yes
c08,57,pro,south,95.5,no
c09,41,basic,north,11,no
c10,23,pro,east,70,yes
c11,36,basic,south,14,no
c12,48,pro,north,88,yes
"""


def test_bring_your_own_csv(tmp_path):
    src = tmp_path / "customers.csv"
    src.write_text(CSV)
    p = run("--csv", src, "--label", "churn", "--categorical", "region", "--id", "customer", "--sites", 2,
            "--out", tmp_path / "out", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "out" / "partition.json").read_text())
    kinds = {f["name"]: f["kind"] for f in summary["schema"]["features"]}
    assert kinds == {"age": "numeric", "plan": "categorical", "region": "categorical", "spend": "numeric"}
    assert summary["schema"]["classes"] == ["no", "yes"] and summary["schema"]["id_column"] == "customer"
    assert summary["partition"]["alpha"] is None  # iid: alpha is not used, so not recorded
    header = (tmp_path / "out" / "site-1" / "train.csv").read_text().splitlines()[0]
    assert header == "customer,age,plan,region,spend,churn"
    ids = []
    for f in ("server/test.csv", "site-1/train.csv", "site-1/test.csv", "site-2/train.csv", "site-2/test.csv"):
        ids += [line.split(",")[0] for line in (tmp_path / "out" / f).read_text().splitlines()[1:]]
    assert sorted(ids) == [f"c{i:02d}" for i in range(1, 13)]


def test_vertical_csv(tmp_path):
    src = tmp_path / "customers.csv"
    src.write_text(CSV)
    p = run("--csv", src, "--label", "churn", "--id", "customer", "--vertical", "--passive", 1,
            "--out", tmp_path / "vfl", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "vfl"
    h1 = (out / "site-1" / "train.csv").read_text().splitlines()[0].split(",")
    h2 = (out / "site-2" / "train.csv").read_text().splitlines()[0].split(",")
    assert h1 == ["customer", "age", "plan", "churn"] and h2 == ["customer", "region", "spend"]
    assert (out / "server" / "test.csv").read_text().splitlines()[0] == "customer,churn"
    assert json.loads((out / "partition.json").read_text())["partition"]["kind"] == "vertical"


def test_vertical_csv_without_id_adds_row_id(tmp_path, capsys):
    """--vertical needs no --id: the rows are numbered in a row_id column, as --help and docs/data.md say."""
    script = importlib.import_module("treeflare.tools.prepare_data")
    with pytest.raises(SystemExit):
        script.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "needs an id column" not in help_text and "row_id column of row numbers" in help_text
    src = tmp_path / "customers.csv"
    src.write_text("\n".join(line.split(",", 1)[1] for line in CSV.strip().splitlines()) + "\n")  # no id
    assert script.main(["--csv", str(src), "--label", "churn", "--vertical", "--out", str(tmp_path / "vfl")]) == 0
    out = tmp_path / "vfl"
    assert (out / "site-1" / "train.csv").read_text().splitlines()[0].split(",")[0] == "row_id"
    assert (out / "site-2" / "train.csv").read_text().splitlines()[0].split(",")[0] == "row_id"
    assert json.loads((out / "partition.json").read_text())["schema"]["id_column"] == "row_id"


def test_bad_input_exits_2_without_traceback(tmp_path):
    p = run("--csv", tmp_path / "missing.csv", "--label", "y", "--out", tmp_path / "out", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr == f"error: {tmp_path / 'missing.csv'}: file not found\n"
    assert p.stdout == "" and not (tmp_path / "out").exists()


# -- error cases in-process (fast) ------------------------------------------------------------------
@pytest.fixture(scope="module")
def script():
    return importlib.import_module("treeflare.tools.prepare_data")


def fail(script, capsys, argv):
    with pytest.raises(SystemExit) as e:
        script.main([str(a) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("extra,message", [
    (["--partition", "quantity", "--alpha", 0], "error: --alpha must be a positive number"),
    (["--partition", "label", "--alpha", -1], "error: --alpha must be a positive number"),
    (["--sites", 2000], "error: --sites 2000 is more than the 1382 rows"),
    (["--label", "class"], "error: --label applies only to --csv"),
])
def test_bad_arguments(script, capsys, tmp_path, extra, message):
    err = fail(script, capsys, ["--dataset", "car", *extra, "--out", tmp_path / "out"])
    assert err.startswith(message), err
    assert not (tmp_path / "out").exists()


def test_bad_csv_names_file_column_line(script, capsys, tmp_path):
    src = tmp_path / "c.csv"
    src.write_text(CSV.replace("c07,38,", "c07,thirty-eight,"))
    err = fail(script, capsys, ["--csv", src, "--label", "churn", "--id", "customer", "--out", tmp_path / "o"])
    assert str(src) in err and "column 'age'" in err and "line 8" in err and "'thirty-eight'" in err
    err = fail(script, capsys, ["--csv", src, "--label", "churned", "--out", tmp_path / "o"])
    assert "label column 'churned' not found" in err
    err = fail(script, capsys, ["--csv", src, "--label", "churn", "--categorical", "colour",
                                "--out", tmp_path / "o"])
    assert "--categorical column 'colour'" in err


def test_existing_out_needs_overwrite(script, capsys, tmp_path):
    out = tmp_path / "out"
    assert script.main(["--dataset", "car", "--sites", "2", "--out", str(out)]) == 0
    before = files(out)
    capsys.readouterr()
    err = fail(script, capsys, ["--dataset", "car", "--sites", "3", "--out", out])
    assert "already exists" in err and "--overwrite" in err
    assert files(out) == before
    assert script.main(["--dataset", "car", "--sites", "3", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "partition.json").read_text())["n_sites"] == 3


def test_usage_errors_exit_2(script, capsys):
    with pytest.raises(SystemExit) as e:
        script.main(["--dataset", "car"])  # no --out
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        script.main(["--dataset", "car", "--partition", "dirichlet", "--out", "x"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
