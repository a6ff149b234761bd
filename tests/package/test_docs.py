"""The docs hold together: links resolve, benchmark blocks are where their scripts write them, and every module,
component or source path they name exists (modules move; this is how a stale mention is caught)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CUSTOM = REPO / "custom"
TESTS = REPO / "tests"
PAGES = sorted([REPO / "README.md", REPO / "SECURITY.md", *(REPO / "docs").glob("*.md")])
# the scripts that write measured blocks: the benchmarks, and the network lab's fault matrix
# (bench_common.py: the helpers every benchmark imports)
BENCH_SCRIPTS = [s for s in sorted([*(REPO / "scripts").glob("bench_*.py"), REPO / "scripts" / "netlab_faults.py"])
                 if s.name != "bench_common.py"]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
MARKER = re.compile(r"<!-- bench:([\w.-]+):(start|end) -->")
# treeflare.a.b, not admin@treeflare.org nor a path segment
DOTTED = re.compile(r"(?<![\w@/.-])treeflare(?:\.[A-Za-z_]\w*)+")
# a source path in backticks: from the repository root, or from custom/ or custom/treeflare/
SOURCE_PATH = re.compile(r"^(?:custom|jobs|scripts|tests|app|configs|\.ci|treeflare|flare|crypto|vertical|xgb|trees|icdta4fl)/"
                         r"[\w./-]*\w\.(?:py|c|sh|yml)$")
# a test cited by file and name: tests/test_x.py::test_y (SECURITY.md cites the tests behind its sentences)
TEST_REF = re.compile(r"^(?:tests/)?(test_\w+\.py)((?:::\w+)*)(?:\[[^\]]*\])?$")


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation but - and _ removed,
    spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        out.add(slug if k == 0 else f"{slug}-{k}")   # GitHub numbers repeated headings
    return out


def link_problems(page: Path) -> list[str]:
    problems = []
    for n, line in prose_lines(page.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):      # http:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{n}: link {target!r}"
            if not dest.exists():
                problems.append(f"{where}: no file {path!r}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return problems


def marker_problems(page: Path) -> list[str]:
    """Every bench block opens and closes once, in order, and blocks do not nest."""
    problems, open_name = [], None
    counts: dict[tuple[str, str], int] = {}
    for n, line in enumerate(page.read_text().split("\n"), 1):
        for name, kind in MARKER.findall(INLINE_CODE.sub("", line)):   # a marker quoted in `code` is prose
            counts[name, kind] = counts.get((name, kind), 0) + 1
            where = f"{page.relative_to(REPO)}:{n}: bench:{name}:{kind}"
            if kind == "start":
                if open_name is not None:
                    problems.append(f"{where} inside the open block {open_name!r}")
                open_name = name
            elif open_name != name:
                problems.append(f"{where} without its start marker before it")
            else:
                open_name = None
    if open_name is not None:
        problems.append(f"{page.relative_to(REPO)}: bench:{open_name}:start has no end marker")
    problems += [f"{page.relative_to(REPO)}: bench:{name}:{kind} appears {c} times"
                 for (name, kind), c in counts.items() if c > 1]
    return problems


def blocks_in(page: Path) -> set[str]:
    return {name for name, kind in MARKER.findall(INLINE_CODE.sub("", page.read_text())) if kind == "start"}


def script_blocks(script: Path) -> tuple[dict[str, str], list[str]]:
    """(the script's BENCH_BLOCKS: block name -> page, problems with its write_bench_block calls)."""
    tree = ast.parse(script.read_text())
    blocks = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BENCH_BLOCKS" for t in node.targets):
            blocks = ast.literal_eval(node.value)
    problems = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "write_bench_block"):
            continue
        where = f"{script.relative_to(REPO)}:{call.lineno}"
        page, name = call.args[0], call.args[1]
        # the page must come from BENCH_BLOCKS, so that what the test checks is what the script writes
        if not any(isinstance(x, ast.Name) and x.id == "BENCH_BLOCKS" for x in ast.walk(page)):
            problems.append(f"{where}: write_bench_block's page is not taken from BENCH_BLOCKS")
        if isinstance(name, ast.Constant) and name.value not in blocks:
            problems.append(f"{where}: block {name.value!r} is not in BENCH_BLOCKS")
    return blocks, problems


def module_file(dotted: str) -> Path | None:
    base = CUSTOM.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(source: Path) -> set[str]:
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problem(dotted: str) -> str | None:
    """None if ``treeflare.a.b[.Name]`` names a module under custom/ (and Name one of its top-level names)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        source = module_file(".".join(parts[:k]))
        if source is None:
            continue
        if k == len(parts) or parts[k] in top_level_names(source):
            return None
        if (source.parent / parts[k]).exists() and source.name == "__init__.py":
            return None
        return f"{'.'.join(parts[:k])} has no {parts[k]!r}"
    return "no such module"


def path_problem(word: str) -> str | None:
    if any((root / word).exists() for root in (REPO, CUSTOM, CUSTOM / "treeflare")):
        return None
    return "no such file"


def cited_test_problem(ref: re.Match) -> str | None:
    # a bare test_x.py names the suite's one file of that name, in whichever folder of tests/ it is
    found = [TESTS / ref.group(1)] if "/" in ref.group(1) else sorted(TESTS.rglob(ref.group(1)))
    source = found[0] if found else TESTS / ref.group(1)
    if not source.is_file():
        return "no such test file"
    defined = {n.name for n in ast.walk(ast.parse(source.read_text()))
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    missing = [name for name in ref.group(2).split("::") if name and name not in defined]
    return f"{ref.group(1)} defines no {missing[0]!r}" if missing else None


def mentions(text: str) -> list[tuple[str, str | None]]:
    """(each module, source path or test the text names, what is wrong with it or None)."""
    found = [(d, dotted_problem(d)) for d in DOTTED.findall(text)]
    for span in re.findall(r"`([^`\n]+)`", text):
        for word in (w.strip("(),;:") for w in span.split()):
            if SOURCE_PATH.match(word):
                found.append((word, path_problem(word)))
            elif ref := TEST_REF.match(word):
                found.append((word, cited_test_problem(ref)))
    return found


def mention_problems(page: Path) -> list[str]:
    """Every name must exist, but in a table between <!-- moved-paths:start/end --> (old path | new path) the
    first column lists what no longer exists, and must not."""
    problems, moved_table = [], False
    for n, line in enumerate(page.read_text().split("\n"), 1):
        where = f"{page.relative_to(REPO)}:{n}"
        if "<!-- moved-paths:start -->" in line or "<!-- moved-paths:end -->" in line:
            moved_table = "start" in line
            continue
        cells = line.strip().strip("|").split("|") if moved_table and line.lstrip().startswith("|") else [line]
        if len(cells) > 1:
            problems += [f"{where}: {name}: listed as moved, but it is still there"
                         for name, problem in mentions(cells[0]) if problem is None]
            cells = cells[1:]
        for cell in cells:
            problems += [f"{where}: {name}: {problem}" for name, problem in mentions(cell) if problem]
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page):
    assert link_problems(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_bench_markers_paired(page):
    assert marker_problems(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_module_and_source_paths_exist(page):
    assert mention_problems(page) == []


def test_every_bench_block_is_where_its_script_writes_it():
    problems, written = [], set()
    for script in BENCH_SCRIPTS:
        blocks, bad = script_blocks(script)
        problems += bad
        if "write_bench_block" in script.read_text() and not blocks:
            problems.append(f"{script.relative_to(REPO)}: writes bench blocks but has no BENCH_BLOCKS")
        for name, page in blocks.items():
            written.add(name)
            if not (REPO / page).is_file() or name not in blocks_in(REPO / page):
                problems.append(f"{script.relative_to(REPO)}: block {name!r} is not in {page}")
    orphans = {name: p.relative_to(REPO) for p in PAGES for name in blocks_in(p)}
    problems += [f"{page}: block {name!r} is written by no bench script"
                 for name, page in orphans.items() if name not in written]
    assert written, "no bench script declares BENCH_BLOCKS"
    assert problems == []


def test_every_docs_page_reachable_from_readme():
    reached, todo = set(), [REPO / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        for _, line in prose_lines(page.read_text()):
            for target in LINK.findall(INLINE_CODE.sub("", line)):
                dest = (page.parent / target.partition("#")[0]).resolve()
                if dest.suffix == ".md" and dest.is_file():
                    todo.append(dest)
    assert [str(p.relative_to(REPO)) for p in PAGES if p not in reached] == []


def test_checks_catch_what_they_are_for(tmp_path, monkeypatch):
    """The checkers report a broken link, a missing anchor, an unpaired marker and a stale module path."""
    monkeypatch.setitem(globals(), "REPO", tmp_path)   # pages are named relative to REPO
    (tmp_path / "other.md").write_text("# A heading: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-heading-with-code) [gone](missing.md) [bad](other.md#nope)\n"
                    "```\n[in code](not/checked.md)\n```\n"
                    "<!-- bench:x:start -->\n| t |\n\n<!-- bench:y:end -->\n"
                    "`python -m treeflare.flare.no_such_module` `treeflare.files.write_json_atomic`"
                    " `treeflare.reporting.write_readme_block` `custom/treeflare/gone.py` admin@treeflare.org"
                    " `test_docs.py::test_github_slug_rules` `test_docs.py::test_gone`\n")
    links = link_problems(page)
    assert len(links) == 2 and "missing.md" in links[0] and "#nope" in links[1]
    markers = marker_problems(page)
    assert any("bench:y:end without its start" in m for m in markers)
    assert any("bench:x:start has no end" in m for m in markers)
    found = mention_problems(page)
    assert len(found) == 4, found
    assert "no_such_module" in found[0] and "write_readme_block" in found[1] and "gone.py" in found[2]
    assert "defines no 'test_gone'" in found[3]
    page.write_text("<!-- moved-paths:start -->\n| old | new |\n|---|---|\n"
                    "| `treeflare.reporting.write_readme_block` | `treeflare.files.write_json_atomic` |\n"
                    "| `treeflare.files.write_json_atomic` | `treeflare.reporting.write_readme_block` |\n"
                    "<!-- moved-paths:end -->\n`treeflare.reporting.write_readme_block`\n")
    found = mention_problems(page)
    assert len(found) == 3, found
    assert "still there" in found[0] and "page.md:5" in found[0] and "page.md:5" in found[1]
    assert "page.md:7" in found[2]


def test_github_slug_rules():
    assert github_slug("Schema discovery (`--schema discover`, `scripts/schema.py discover`)") == \
        "schema-discovery---schema-discover-scriptsschemapy-discover"
    assert github_slug("Predicting on new data (vertical)") == "predicting-on-new-data-vertical"
    assert github_slug("3. Installing treeflare on the sites") == "3-installing-treeflare-on-the-sites"
