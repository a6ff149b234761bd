"""Jobs on a real local POC system driven by scripts/poc.sh (up K | run JOB | down), as a user would.

One POC for the module, started under the machine-wide FLARE lock with a temporary HOME and POC workspace, on a
free port instead of 8002 (TREEFLARE_POC_PORT), and stopped in teardown even when a test fails.
"""

from __future__ import annotations

import importlib

import json
import os
import re
import shlex
import socket
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from flare_helpers import REPO, flare_lock, free_port, isolated_env, kill_token, processes_with_token, run_cmd

pytestmark = [pytest.mark.flare, pytest.mark.flare_lock]  # runs under the machine-wide FLARE lock

POC_SH = str(REPO / "scripts" / "poc.sh")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


@pytest.fixture(scope="module")
def poc(tmp_path_factory):
    root = tmp_path_factory.mktemp("poc")
    token = uuid.uuid4().hex
    env = isolated_env(root, token)
    port = free_port()  # not 8002: a developer's own POC may be running
    env.update({"TREEFLARE_POC_ROOT": str(root / "system"), "TREEFLARE_FLARE_LOCK_HELD": "1",
                "TREEFLARE_POC_PORT": str(port), "PYTHON": sys.executable})
    timings = {}
    with flare_lock():
        try:
            t = time.perf_counter()
            up = run_cmd(["bash", POC_SH, "up", "3"], env, timeout=240)
            timings["up"] = time.perf_counter() - t
            assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-2000:]
            yield {"root": root, "env": env, "timings": timings, "up": up, "port": port}
        finally:
            t = time.perf_counter()
            down = run_cmd(["bash", POC_SH, "down"], env, timeout=120)
            timings["down"] = time.perf_counter() - t
            left = processes_with_token(token)
            kill_token(token)
            print(f"\nPOC timings: {timings}")
            assert down.returncode == 0, down.stderr[-2000:]
            assert not left, f"processes left behind after poc.sh down: {left}"
            assert _port_free(port)


def test_poc_up_and_status(poc):
    assert "site-1, site-2, site-3" in poc["up"].stdout and f"localhost:{poc['port']}" in poc["up"].stdout
    st = run_cmd(["bash", POC_SH, "status"], poc["env"], timeout=60)
    assert st.returncode == 0, st.stderr
    assert "connected: ['site-1', 'site-2', 'site-3']" in st.stdout
    # isolated: the POC's own HOME got the nvflare config, not the user's
    assert (poc["root"] / "system" / "home" / ".nvflare" / "config.conf").is_file()
    assert not (poc["root"] / "home" / ".nvflare").exists()


def test_poc_refuses_a_second_system(poc):
    again = run_cmd(["bash", POC_SH, "up", "2"], poc["env"], timeout=60)
    assert again.returncode != 0 and "already running" in again.stderr


def test_icdta4fl_through_poc(poc):
    """scripts/poc.sh run icdta4fl: the same outputs in --workspace as a simulator run, plus the server result
    and each site's run folder gathered under flare/poc_result/."""
    ws = poc["root"] / "icdta4fl"
    t = time.perf_counter()
    proc = run_cmd(["bash", POC_SH, "run", "icdta4fl", "--algorithm", "cart", "--dataset", "car", "--sites", "3",
                    "--partition", "iid", "--seed", "1", "--max-depth", "4", "--task-timeout", "60",
                    "--workspace", str(ws)], poc["env"], timeout=240)
    poc["timings"]["icdta4fl"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads((ws / "report.json").read_text())
    assert report["job"] == "icdta4fl" and report["dataset"] == "car" and report["params"]["env"] == "poc"
    assert report["n_sites"] == 3 and report["dropped_sites"] == {}
    assert set(report["sites"]) == {"site-1", "site-2", "site-3"}
    g = report["global"]
    assert 0.75 < g["accuracy"] <= 1.0 and g["n_leaves"] >= 2
    assert set(report["baselines"]) == {"centralized", "mean_local", "best_local"}
    # the POC's startup kits sign every site's masking key, and every site checked every certificate
    assert report["refinement"]["key_authentication"].startswith("certificates"), report["refinement"]
    assert len(report["refinement"]["adoption"]) == 1
    for name in ("global_tree.json", "rules.txt", "global_tree.png"):
        assert (ws / name).is_file(), name
    result = ws / "flare" / "poc_result"
    job_id = next(p.name for p in result.iterdir() if p.is_dir() and not p.name.startswith("site-"))
    assert (result / job_id / "workspace" / "icdta4fl_result.json").is_file()
    for site in ("site-1", "site-2", "site-3"):
        assert "icdta4fl_train" in (result / site / job_id / "log.txt").read_text()


def test_icdta4fl_on_the_sites_own_data_discovers_the_schema(poc, tmp_path):
    """No --dataset/--csv on a POC: the schema is discovered from the sites' files (--schema discover is the default
    there), written to schema.json, and the job trains on those files. The sites' CSVs differ in row order,
    column order and a rare value (3 rows at site-3), which stays out of the schema. Car's ordered columns are
    declared with --ordinal (discovery cannot know an order); lug_boot is left to be discovered as categorical."""
    from dataclasses import replace

    import pandas as pd

    from treeflare.data import Feature, load_dataset, prepare_federation, write_federation
    from treeflare.data.embedded import ORDINAL

    rare = "rare-value-4711"
    data = write_federation(prepare_federation(load_dataset("car"), n_sites=3, seed=2), tmp_path / "data")
    site2, site3 = data / "site-2" / "train.csv", data / "site-3" / "train.csv"
    pd.read_csv(site2, dtype=str).sample(frac=1.0, random_state=0).to_csv(site2, index=False)
    third = pd.read_csv(site3, dtype=str)
    third.loc[:2, "lug_boot"] = rare
    third[third.columns[::-1]].to_csv(site3, index=False)
    ws = poc["root"] / "icdta4fl_sites"
    t = time.perf_counter()
    ordinal = [f"{c}={'<'.join(levels)}" for c, levels in ORDINAL["car"].items() if c != "lug_boot"]
    proc = run_cmd(["bash", POC_SH, "run", "icdta4fl", "--label", "class", "--sites", "3", "--data-root", str(data),
                    *[a for spec in ordinal for a in ("--ordinal", spec)], "--max-depth", "4", "--task-timeout", "60",
                    "--workspace", str(ws)],
                   poc["env"], timeout=240)
    poc["timings"]["icdta4fl_discover"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "schema discovery on site-1, site-2, site-3" in proc.stdout
    schema = json.loads((ws / "schema.json").read_text())
    car = load_dataset("car").schema
    expected = replace(car, features=tuple(Feature("lug_boot", "categorical", ("big", "med", "small"))
                                           if f.name == "lug_boot" else f for f in car.features), _index={})
    assert schema == {**expected.to_dict(), "discovery": schema["discovery"]}
    assert rare not in (ws / "schema.json").read_text()
    report = json.loads((ws / "report.json").read_text())
    assert report["params"]["env"] == "poc" and report["dataset"] == "the sites' own data"
    assert report["schema_source"]["schema"] == "discovered" and report["baselines"]["centralized"] is None
    assert report["dropped_sites"] == {} and set(report["sites"]) == {"site-1", "site-2", "site-3"}
    assert 0.75 < report["global"]["accuracy"] <= 1.0  # the server's test set is in --data-root here
    # the sites' own data: no partition settings; each site's score of the final tree on its validation rows
    assert report["partition"] == {"kind": "site-held"}
    scored = report["validation"]["final_tree"]["sites"]
    assert set(scored) == set(report["sites"]) and all(0 < v["accuracy"] <= 1 for v in scored.values())
    assert all(scored[s]["n_test"] == report["sites"][s]["n_test"] for s in scored)
    outputs = proc.stdout[proc.stdout.index("\noutputs:\n"):]  # every output named with where it went
    for name in ("report.json", "global_tree.json", "rules.txt", "global_tree.png", "schema.json"):
        assert str(ws / name) in outputs, name
    assert sum(info["n_train"] for info in report["sites"].values()) == \
        sum(info["n_rows"] for info in schema["discovery"]["sites"].values())
    # the refinement round ran on POC (real mTLS messaging): encrypted counts from all three sites
    assert report["refinement"]["status"] == "completed" and report["refinement"]["history"][0]["sites"] == 3
    # the operator's last step: the downloaded model predicts on new rows (raw values, no label column)
    new_rows = tmp_path / "new.csv"
    pd.read_csv(data / "server" / "test.csv", dtype=str).drop(columns=["class"]).head(20).to_csv(new_rows, index=False)
    out = tmp_path / "predictions.csv"
    pred = run_cmd([sys.executable, str(REPO / "scripts" / "predict.py"), "--model", str(ws), "--csv", str(new_rows),
                    "--out", str(out), "--explain"], poc["env"], timeout=60)
    assert pred.returncode == 0, pred.stderr[-2000:]
    table = pd.read_csv(out)
    assert len(table) == 20 and set(table["predicted"]) <= set(schema["classes"])
    assert {f"p_{c}" for c in schema["classes"]} <= set(table.columns) and table["explanation"].str.len().min() > 0


DEPLOY_MD = REPO / "docs" / "DEPLOY.md"


def _hint_commands(text: str) -> list[str]:
    """The ``nvflare job`` command lines an export hint (or a docs code block) writes, without their comments."""
    return [" ".join(shlex.split(line, comments=True)) for line in text.splitlines()
            if line.strip().startswith("nvflare job ")]


def test_deploy_md_step_5_writes_the_export_hint_commands():
    """docs/DEPLOY.md's by-hand commands are the ones the job scripts' --export hint prints (with ADMIN_KIT)."""
    from treeflare.flare.runner import export_hint

    docs = DEPLOY_MD.read_text()
    step5 = docs[docs.index("5. **Train**"):docs.index("6. **Predict**")]
    hint = _hint_commands(export_hint(Path("jobs_out/icdta4fl")))
    assert len(hint) == 3 and all("--startup-kit ADMIN_KIT" in c for c in hint), hint
    assert set(hint) <= set(_hint_commands(step5)), (hint, _hint_commands(step5))


def _bind(env, kit: Path, data: Path, *extra) -> None:
    proc = run_cmd([sys.executable, str(REPO / "app" / "site_setup.py"), "bind", str(kit), "--data-dir", str(data),
                    *extra], env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _py(env, script: str, *args, cwd, timeout=240):
    proc = run_cmd([sys.executable, str(REPO / script), *map(str, args)], env, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, f"{script} {args}\n" + proc.stderr[-3000:] + proc.stdout[-3000:]
    return proc


def test_running_on_real_sites_as_docs_deploy_writes_it(poc, tmp_path):
    """docs/DEPLOY.md "Running on real sites", steps 3-5, on the POC with data no other test uses: bank-marketing
    shaped files as the UCI file is published (';'-separated, quoted, "unknown" and empty cells, y=yes ~12%), of a
    different size at each site, bound with app/site_setup.py (a default binding, and a named one for the vertical
    job's columns). Schema discovery; ICDTA4FL exported and run with the `nvflare job submit/wait/download` commands
    its --export hint prints (with ADMIN_KIT and the job id filled in); XGBoost and the vertical job with
    `--env poc` on the sites' own data, their printed per-site validation tables and output paths checked."""
    from data_helpers import bank_marketing_like, write_bank_csv

    xgb_validation_rows = importlib.import_module("treeflare.jobs.xgb_histogram").VALIDATION_ROWS["horizontal"]

    env = {**poc["env"], "PATH": f"{Path(sys.executable).parent}{os.pathsep}{poc['env'].get('PATH', '')}"}
    kits = Path(env["TREEFLARE_POC_ROOT"]) / "poc" / "example_project" / "prod_00"  # where DEPLOY.md says
    admin_kit, sites = kits / "admin@nvidia.com", ["site-1", "site-2", "site-3"]
    assert admin_kit.is_dir() and all((kits / s).is_dir() for s in sites)
    cols = bank_marketing_like(900, seed=21)
    bounds = [0, 200, 320, 600]  # train rows 150, 90, 210 (three quarters of each share); the rest: validation
    horizontal = tmp_path / "sites"
    for i, site in enumerate(sites):
        rows = range(bounds[i], bounds[i + 1])
        cut = bounds[i] + 3 * len(rows) // 4
        write_bank_csv(horizontal / site / "train.csv", cols, rows=range(bounds[i], cut))
        write_bank_csv(horizontal / site / "test.csv", cols, rows=range(cut, bounds[i + 1]))
    # vertical: parties whose customers differ, as real ones do: 150 people at every party plus 25 only that party
    # holds, each party its own columns and its own row order; the PSI phase finds the 150 (and the 75 test people
    # all hold). This is the issue-22 POC run of PSI on site-bound data.
    vertical, rng = tmp_path / "vertical", np.random.default_rng(22)
    cols["uid"] = [f"c{i:05d}" for i in range(len(cols["y"]))]
    held = {"site-1": ["uid", "age", "balance", "duration", "y"],
            "site-2": ["uid", "job", "marital", "education", "housing", "loan"],
            "site-3": ["uid", "contact", "month", "campaign", "pdays", "poutcome"]}
    shared, test_people = list(range(600, 750)), list(range(825, 900))
    for i, (site, columns) in enumerate(held.items()):
        own = shared + list(range(750 + 25 * i, 775 + 25 * i))
        write_bank_csv(vertical / site / "train.csv", cols, rows=rng.permutation(own).tolist(), columns=columns)
        write_bank_csv(vertical / site / "test.csv", cols, rows=rng.permutation(test_people).tolist(),
                       columns=columns)
    t0 = time.perf_counter()
    try:
        # step 3: bind each site's data (a default binding, and the named one the vertical job reads)
        for site in sites:
            _bind(env, kits / site, horizontal / site, "--label-column", "y")
            _bind(env, kits / site, vertical / site, "--name", "vertical", "--id-column", "uid",
                  *(["--label-column", "y"] if site == "site-1" else []))
        # step 4: agree the schema (the separator detected at each site)
        _py(env, "scripts/schema.py", "discover", "--sites", 3, "--label", "y", "--env", "poc", "--workspace",
            "out/discovery", "--out", "schema.json", "--task-timeout", 60, cwd=tmp_path)
        schema = json.loads((tmp_path / "schema.json").read_text())
        assert schema["label"] == "y" and schema["classes"] == ["no", "yes"]
        assert [f["name"] for f in schema["features"]] == list(cols)[:16]
        kinds = {f["name"]: f["kind"] for f in schema["features"]}
        assert kinds["duration"] == "numeric" and kinds["poutcome"] == "categorical"
        poc["timings"]["real_sites_discovery"] = time.perf_counter() - t0

        # step 5 by hand: export, then the commands the hint prints, as printed
        t = time.perf_counter()
        exported = _py(env, "jobs/icdta4fl/job.py", "--schema", "schema.json", "--sites", 3, "--workspace", "out/icd",
                       "--export", "jobs_out", "--max-depth", 3, "--task-timeout", 60, cwd=tmp_path)
        commands = _hint_commands(exported.stdout)
        assert [c.split()[:3] for c in commands] == [["nvflare", "job", "submit"], ["nvflare", "job", "wait"],
                                                     ["nvflare", "job", "download"]], exported.stdout
        job_id, ran = None, []
        for command in commands:
            argv = [a.replace("ADMIN_KIT", str(admin_kit)).replace("<job_id>", job_id or "<job_id>")
                    for a in shlex.split(command)]
            ran.append(argv)
            proc = run_cmd(argv, env, timeout=240, cwd=tmp_path)
            assert proc.returncode == 0, f"{argv}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            if job_id is None:
                found = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", proc.stdout)
                assert found, proc.stdout
                job_id = found[-1]
        # wait and download ran with the id submit printed, never the placeholder
        assert job_id and all(job_id in argv for argv in ran[1:]), ran
        assert not any("<job_id>" in a for argv in ran for a in argv), ran
        run_dir = tmp_path / "results" / job_id / "workspace"  # where the hint says the result lands
        result = json.loads((run_dir / "icdta4fl_result.json").read_text())
        assert result["status"] == "completed" and result["dropped_sites"] == {}, result.get("error")
        assert set(result["sites"]) == set(sites)
        assert {s: info["n_train"] for s, info in result["sites"].items()} == {"site-1": 150, "site-2": 90,
                                                                               "site-3": 210}
        for info in result["sites"].values():  # each site's score of the final tree on its own validation rows
            assert 0.5 < info["global"]["accuracy"] <= 1
        assert json.loads((run_dir / "global_tree.json").read_text())
        poc["timings"]["real_sites_icdta4fl_by_hand"] = time.perf_counter() - t

        # step 5 in one step: XGBoost on the sites' own data
        t = time.perf_counter()
        xgb = _py(env, "jobs/xgb_histogram/job.py", "--schema", "schema.json", "--sites", 3, "--env", "poc",
                  "--workspace", "out/xgb", "--rounds", 3, "--max-depth", 2,
                  "--nthread", 1, "--baselines", "", "--xgb-port", free_port(), "--task-timeout", 60, cwd=tmp_path)
        poc["timings"]["real_sites_xgb"] = time.perf_counter() - t
        ws = tmp_path / "out" / "xgb"
        report = json.loads((ws / "report.json").read_text())
        # horizontal XGBoost evaluates every site's validation rows collectively: one eval, the first site's
        validation = report["validation"]
        assert validation["metrics"] == ["auc"] and validation["rows"] == xgb_validation_rows
        assert set(validation["sites"]) == {"site-1"} and validation["sites"]["site-1"]["round"] == 3, validation
        assert "partition" not in report["params"] and "alpha" not in report["params"]
        lines = xgb.stdout.splitlines()
        assert any(line.startswith("model (each site's validation rows)") for line in lines), xgb.stdout
        row = next(line for line in lines if "site-1's eval, round 3" in line)
        assert row.split()[-1] == f"{validation['sites']['site-1']['auc']:.4f}" and 0.5 < float(row.split()[-1]) <= 1
        assert xgb_validation_rows in xgb.stdout
        outputs = xgb.stdout[xgb.stdout.index("\noutputs:\n"):].splitlines()[2:]
        named = {line.split()[0]: Path(line.split()[-1]) for line in outputs if line.strip()}
        assert named["model"].is_file() and named["report"] == ws / "report.json", outputs
        assert all(path.exists() for path in named.values()), outputs

        # the vertical job on the parties' own columns (their named bindings)
        t = time.perf_counter()
        _py(env, "scripts/schema.py", "discover", "--sites", 3, "--vertical", "--label", "y", "--id", "uid",
            "--binding", "vertical", "--env", "poc", "--workspace", "out/vdiscovery", "--out",
            "vertical_schema.json", "--task-timeout", 60, cwd=tmp_path)
        vschema = json.loads((tmp_path / "vertical_schema.json").read_text())
        assert {f["name"]: f["party"] for f in vschema["features"]} == {
            c: site for site, columns in held.items() for c in columns if c not in ("uid", "y")}
        vt = _py(env, "jobs/vertical_tree/job.py", "--schema", "vertical_schema.json", "--passive", 2,
                 "--binding", "vertical", "--env", "poc", "--workspace", "out/vt",
                 "--model", "gbdt", "--trees", 1, "--max-depth", 2, "--bins", 8, "--key-bits", 512,
                 "--allow-insecure-key", "--workers", 1, "--task-timeout", 120, cwd=tmp_path, timeout=300)
        poc["timings"]["real_sites_vertical"] = time.perf_counter() - t
        vreport = json.loads((tmp_path / "out" / "vt" / "report.json").read_text())
        assert vreport["sites"] == {"active": "site-1", "passive": ["site-2", "site-3"]}
        assert 0.5 < vreport["global"]["accuracy"] <= 1, vreport["global"]
        psi = vreport["psi"]
        assert psi["status"] == "completed" and vreport["n_train"] == len(shared), psi
        assert all(p["rows_before"] == {"train": 175, "test": 75} and p["rows_after"] == {"train": 150, "test": 75}
                   for p in psi["parties"].values()) and sorted(psi["parties"]) == sites, psi
        assert "plaintext oracle: not checked" in vt.stdout and "oracle: None" not in vt.stdout
    finally:
        for site in sites:  # the module's other tests read --data-root, which a binding would override
            for name in ("treeflare_site.json", "treeflare_site.vertical.json"):
                (kits / site / "local" / name).unlink(missing_ok=True)
    poc["timings"]["real_sites"] = time.perf_counter() - t0


def test_run_without_poc_is_a_clear_error(tmp_path):
    env = isolated_env(tmp_path, uuid.uuid4().hex)
    env["TREEFLARE_POC_ROOT"] = str(tmp_path / "nothing")
    proc = run_cmd(["bash", POC_SH, "run", "icdta4fl", "--dataset", "car"], env, timeout=60)
    assert proc.returncode == 2 and "no POC running" in proc.stderr and "scripts/poc.sh up" in proc.stderr
    proc = run_cmd(["bash", POC_SH, "run", "no_such_job"], env, timeout=60)
    assert proc.returncode == 2 and "no job 'no_such_job'" in proc.stderr
    proc = run_cmd(["bash", POC_SH, "up", "zero"], env, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr
    assert os.environ.get("HOME") != env["HOME"]
