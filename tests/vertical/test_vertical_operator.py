"""The vertical job as an operator on real sites sees it (issue 21): what the summary says when the oracle
comparison cannot run, and who holds which column in a vertical schema. In-process, no FLARE run."""
from __future__ import annotations

import importlib



SITES = ["site-1", "site-2", "site-3"]


def _job():
    return importlib.import_module("treeflare.jobs.vertical_tree")


def test_oracle_unchecked_says_why_instead_of_none():
    job = _job()
    # real sites / POC on the sites' own data: this script split nothing
    why = job.oracle_unchecked_reason(False, False, {}, SITES)
    assert "every party's data and model files" in why and "simulation" in why
    line = job.oracle_line({"identical_to_oracle": None, "oracle": {"checked": False, "reason": why}})
    assert "None" not in line and line.startswith("plaintext oracle: not checked")
    # the data was split here, but a passive party's model part is not on this machine
    files = {"site-1": {}, "site-3": {}, "_pred": {}}
    assert job.oracle_unchecked_reason(False, True, files, SITES).endswith("not on this machine: site-2")
    assert job.oracle_unchecked_reason(True, True, files, SITES) == "skipped (--no-oracle)"
    # everything here: it runs, and the line gives its result
    assert job.oracle_unchecked_reason(False, True, {**files, "site-2": {}}, SITES) is None
    assert job.oracle_line({"identical_to_oracle": True, "oracle": {}}) == "identical to the plaintext oracle: True"


def _vertical_schema_file(tmp_path, parties):
    from treeflare.data import Feature, Schema
    from treeflare.flare.discovery.controller import schema_file
    from treeflare.files import write_json_atomic

    schema = Schema((Feature("age", "numeric"), Feature("colour", "categorical", ("blue", "red"))), "y",
                    ("no", "yes"), "uid")
    path = tmp_path / "schema.json"
    write_json_atomic(path, schema_file(schema, None, parties))
    return schema, path


def test_vertical_schema_table_and_file_name_each_columns_party(tmp_path, capsys):
    import json

    import pytest

    from treeflare.data import DataError
    from treeflare.flare.discovery.job import read_schema_file, schema_file_parties

    schema, path = _vertical_schema_file(tmp_path, {"age": "site-1", "colour": "site-2"})
    assert read_schema_file(path) == schema
    assert importlib.import_module("treeflare.tools.schema").main(["check", str(path)]) == 0
    table = capsys.readouterr().out
    assert "party" in table.splitlines()[1]
    assert [line.split()[:2] for line in table.splitlines() if line.lstrip().startswith(("age", "colour"))] == \
        [["age", "site-1"], ["colour", "site-2"]]
    # an older file (or a horizontal schema) names no party: it loads, and the table has no party column
    old, old_path = _vertical_schema_file(tmp_path / "old", None)
    assert schema_file_parties(old_path, old) is None and read_schema_file(old_path) == old
    # a reviewed file naming a site the job does not have, or a party for one column only, is refused by column
    with pytest.raises(DataError, match="column 'colour': party 'site-9' is not one of this job's sites"):
        schema_file_parties(_vertical_schema_file(tmp_path / "b", {"age": "site-1", "colour": "site-9"})[1],
                            schema, SITES)
    doc = json.loads(path.read_text())
    del doc["features"][1]["party"]
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="column 'colour': no party named"):
        schema_file_parties(path, schema)
