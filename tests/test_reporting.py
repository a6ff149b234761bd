"""Benchmark scripts own blocks between markers in the docs pages; nothing else in a page changes."""

import pytest

from treeflare.reporting import bench_settings, write_bench_block


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
