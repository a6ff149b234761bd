"""The vertical job as an operator on real sites sees it (issue 21): what the summary says when the oracle
comparison cannot run, and who holds which column in a vertical schema. In-process, no FLARE run."""
from __future__ import annotations

from flare_helpers import load_script

SITES = ["site-1", "site-2", "site-3"]


def _job():
    return load_script("jobs/vertical_tree/job.py", "vertical_tree_job")


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
