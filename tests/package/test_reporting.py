"""Benchmark scripts own blocks between markers in the docs pages; nothing else in a page changes."""

import pytest

from flare_helpers import load_script

bench_common = load_script("scripts/bench_common.py", "bench_common")
bench_settings, write_bench_block = bench_common.bench_settings, bench_common.write_bench_block


def test_bench_block_replaced_between_markers_only(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- bench:x:start -->\nold table\n<!-- bench:x:end -->\noutro\n")
    assert write_bench_block(page, "x", "| new |\n") == page
    assert page.read_text() == "intro\n<!-- bench:x:start -->\n| new |\n<!-- bench:x:end -->\noutro\n"


@pytest.mark.parametrize("text, missing", [
    ("no markers\n", "<!-- bench:x:start -->"),
    ("<!-- bench:x:start -->\nold\n", "<!-- bench:x:end -->"),
    ("<!-- bench:x:end -->\nold\n<!-- bench:x:start -->\n", "<!-- bench:x:end -->"),
    ("<!-- bench:xy:start -->\nold\n<!-- bench:xy:end -->\n", "<!-- bench:x:start -->"),
])
def test_bench_block_missing_marker_refused_page_unchanged(tmp_path, text, missing):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError) as err:
        write_bench_block(page, "x", "table")
    assert str(page) in str(err.value) and missing in str(err.value)
    assert page.read_text() == text


def test_bench_block_absent_page_refused(tmp_path):
    with pytest.raises(ValueError, match="absent.md"):
        write_bench_block(tmp_path / "absent.md", "x", "table")
    assert not (tmp_path / "absent.md").exists()


def test_bench_settings_records_load_and_extras():
    s = bench_settings(seeds=[0, 1], randomness="full")
    assert len(s["loadavg"]) == 3 and s["cores"] >= 1
    assert s["seeds"] == [0, 1] and s["randomness"] == "full"


def test_an_atomic_write_gets_the_mode_open_would_give_and_keeps_an_existing_ones(tmp_path):
    """report.json and report.html used to be 0600 (mkstemp's mode) beside outputs of 0644."""
    import os
    import stat

    from treeflare.files import write_json_atomic, write_text_atomic

    mask = os.umask(0o022)
    os.umask(mask)
    fresh = write_json_atomic(tmp_path / "report.json", {"a": 1})
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert stat.S_IMODE(fresh.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~mask
    private = tmp_path / "private.json"
    private.write_text("{}")
    private.chmod(0o600)
    write_text_atomic(private, "{}\n")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
