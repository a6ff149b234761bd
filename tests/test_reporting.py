"""Benchmark scripts own README blocks between markers; nothing else in the README changes."""

from treeflare.reporting import bench_settings, write_readme_block


def test_readme_block_replaced_between_markers_only(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:x:start -->\nold table\n<!-- bench:x:end -->\noutro\n")
    assert write_readme_block(readme, "x", "| new |\n")
    assert readme.read_text() == "intro\n<!-- bench:x:start -->\n| new |\n<!-- bench:x:end -->\noutro\n"


def test_readme_block_missing_markers_change_nothing(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert not write_readme_block(readme, "x", "table")
    assert readme.read_text() == "no markers\n"
    assert not write_readme_block(tmp_path / "absent.md", "x", "table")


def test_bench_settings_records_load_and_extras():
    s = bench_settings(seeds=[0, 1], randomness="full")
    assert len(s["loadavg"]) == 3 and s["cores"] >= 1
    assert s["seeds"] == [0, 1] and s["randomness"] == "full"
