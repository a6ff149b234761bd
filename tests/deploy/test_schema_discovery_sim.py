"""Schema discovery in the FLARE simulator (one run of scripts/schema.py discover): three sites whose CSVs differ in
row order, column order, category order and a rare value agree on the schema the pooled data would give, less the
rare value, which reaches neither the server's files nor schema.json. site-3's file is semicolon-separated (the
separator is detected); the workspace holds the FLARE folders in flare/ and, with no --out, schema.json."""

from __future__ import annotations

import json

import pytest

from flare_helpers import run_script
from test_schema_discovery_job import RARE, site_folders
from treeflare.data import Schema
from treeflare.data.csv_io import infer_schema

pytestmark = pytest.mark.flare


def test_discovery_in_the_simulator(tmp_path):
    import pandas as pd

    data = site_folders(tmp_path / "data")
    site3 = tmp_path / "data" / "site-3" / "train.csv"
    pd.read_csv(site3, dtype=str, keep_default_na=False).to_csv(site3, sep=";", index=False)
    assert site3.read_text().splitlines()[0] == "y;grade;colour;x"
    ws = tmp_path / "ws"
    out = ws / "schema.json"
    proc = run_script("scripts/schema.py", ["discover", "--env", "sim", "--sites", "3", "--label", "y",
                                            "--data-root", str(tmp_path / "data"), "--workspace", str(ws)],
                      tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    schema = Schema.from_dict(json.loads(out.read_text()))
    assert schema == infer_schema(pd.DataFrame(data), label="y")
    assert json.loads(out.read_text())["discovery"]["sites"]["site-2"]["n_rows"] == 80
    assert "site-1 80, site-2 80, site-3 80" in proc.stdout and "colour" in proc.stdout
    assert not (ws / "discovery").exists()  # the workspace is discovery's own: no folder nested in it
    server = ws / "flare" / "schema_discovery" / "server"
    assert (server / "simulate_job" / "schema_discovery_result.json").is_file()
    for f in server.rglob("*"):
        if f.is_file():
            assert RARE not in f.read_text(errors="replace"), f
    assert RARE not in out.read_text()
