"""The `treeflare` command (issue 34): every job and tool as a subcommand, help that says each default once and
every option's meaning, typos answered with the nearest name, a refused run leaving no empty workspace, and the old
script paths still working as thin wrappers."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from treeflare import command

REPO = Path(__file__).resolve().parents[2]
PARSED = [name for name in command.COMMANDS if name not in ("poc", "bench", "provision")]


def run_command(argv, capsys):
    try:
        code = command.main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_command_and_a_typo_gets_the_nearest(capsys):
    code, out, _ = run_command(["--help"], capsys)
    assert code == 0 and all(re.search(rf"^  {name}\s", out, re.M) for name in command.COMMANDS)
    code, _, err = run_command(["predcit", "--csv", "x"], capsys)
    assert code == 2 and "unknown command 'predcit'; did you mean 'predict'?" in err
    code, _, err = run_command(["bogus"], capsys)
    assert code == 2 and "did you mean" not in err and "treeflare --help" in err


@pytest.mark.parametrize("name", PARSED)
def test_every_option_has_help_and_its_default_said_once(name, capsys):
    module = importlib.import_module(command.COMMANDS[name][0])
    parser = module.build_parser()
    parsers = [parser] + [sub for action in parser._actions if action.choices and isinstance(action.choices, dict)
                          for sub in action.choices.values()]
    for p in parsers:
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name}: {action.option_strings} has no help"
    code, out, _ = run_command([name, "--help"], capsys)
    assert code == 0 and out.startswith(f"usage: treeflare {name}")
    flat = " ".join(out.split())
    assert "(default: )" not in flat and not re.search(r"\(default[^()]*\) \(default", flat), flat


def test_a_mistyped_option_gets_the_nearest_in_two_lines(capsys):
    code, _, err = run_command(["icdta4fl", "--max-depht", "3", "--workspace", "x"], capsys)
    assert code == 2 and "did you mean --max-depth?" in err and len(err.strip().splitlines()) == 2, err


def test_a_refused_run_leaves_no_empty_workspace_and_keeps_a_folder_that_was_there(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,x\n2,y\n")
    fresh = tmp_path / "new" / "deeper"
    code, _, err = run_command(["icdta4fl", "--csv", str(bad), "--label", "nope", "--workspace", str(fresh)], capsys)
    assert code == 2 and "label column 'nope' not found" in err
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "mine"
    kept.mkdir()
    code, _, _ = run_command(["icdta4fl", "--csv", str(bad), "--label", "nope", "--workspace", str(kept)], capsys)
    assert code == 2 and kept.is_dir()


def test_poc_run_without_a_poc_and_bench_of_an_unknown_name_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TREEFLARE_POC_ROOT", str(tmp_path / "poc"))
    code, _, err = run_command(["poc", "run", "icdta4fl", "--dataset", "car"], capsys)
    assert code == 2 and "no POC running" in err and "treeflare poc up K" in err
    code, _, err = run_command(["poc", "run", "icdt4fl"], capsys)
    assert code == 2 and "did you mean 'icdta4fl'" in err
    code, _, err = run_command(["bench", "icdta4fl_frnt"], capsys)
    assert code == 2 and "did you mean 'icdta4fl_front'" in err


@pytest.mark.parametrize("script, name", [("jobs/icdta4fl/job.py", "icdta4fl"), ("jobs/xgb_histogram/job.py", "xgb"),
                                          ("jobs/vertical_tree/job.py", "vertical"), ("scripts/predict.py", "predict"),
                                          ("scripts/prepare_data.py", "prepare"), ("scripts/export.py", "export"),
                                          ("scripts/schema.py", "schema"), ("scripts/psi.py", "psi"),
                                          ("scripts/report_html.py", "report"), ("app/site_setup.py", "site")])
def test_the_old_script_paths_still_run_with_the_same_options(script, name, capsys):
    """Each old path runs the same command: the same options, and the same defaults, as `treeflare NAME --help`."""
    done = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0 and done.stdout.startswith("usage: "), done.stderr
    code, out, _ = run_command([name, "--help"], capsys)
    assert code == 0

    def said(text):  # every option and every default the help states, wherever the lines wrap
        flat = " ".join(text.split("\n\n", 1)[1].split())  # past the usage lines, which name the program
        return sorted(re.findall(r"--[A-Za-z][\w-]*", flat)), sorted(re.findall(r"\(default: [^)]*\)", flat))

    assert said(done.stdout) == said(out) and said(out)[0]




@pytest.mark.flare
def test_the_readme_recipe_example_runs_as_written(tmp_path):
    """The README's library example (an ICDTA4FLRecipe run by SimEnv, as NVFlare's recipes run) runs as printed and
    leaves the controller's result in the simulator's workspace."""
    from flare_helpers import isolated_env, kill_token

    readme = (REPO / "README.md").read_text()
    block = readme.split("The recipes are library objects too", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    token = "readme-" + tmp_path.name
    try:
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=isolated_env(tmp_path, token),
                              capture_output=True, text=True, timeout=300)
    finally:
        kill_token(token)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    result = next((tmp_path / "out" / "sim").rglob("icdta4fl_result.json"))
    server = json.loads(result.read_text())
    assert server["status"] == "completed" and server["n_sites"] == 3 and server["global"]["n_leaves"] >= 2


def test_an_exported_recipe_ships_the_package_once_without_data_or_templates(tmp_path):
    """`nvflare job submit` parses every .json file of a job folder as a configuration: the operator's binding
    template stays out of the shipped package, and so do the embedded datasets (the sites read their own data).
    A second export of the same recipe writes the same folder, the package in it once per app."""
    from treeflare.data import load_dataset, prepare_federation
    from treeflare.flare.icdta4fl.recipe import ICDTA4FLRecipe

    fed = prepare_federation(load_dataset("car"), n_sites=3, kind="iid", seed=0)
    recipe = ICDTA4FLRecipe(schema=fed.schema.to_dict(), sites=fed.site_names, data_root=str(tmp_path / "fed"))
    recipe.export(str(tmp_path / "a"))
    recipe.export(str(tmp_path / "b"))
    for out in (tmp_path / "a" / "icdta4fl", tmp_path / "b" / "icdta4fl"):
        customs = sorted(out.rglob("custom"))
        assert customs and all((c / "treeflare" / "command.py").is_file() for c in customs)
        assert len(list(out.rglob("command.py"))) == len(customs)  # one copy of the package per app
        shipped = [p for c in customs for p in c.rglob("*")]
        assert not [p for p in shipped if p.suffix == ".json"], [p for p in shipped if p.suffix == ".json"]
        assert not [p for p in shipped if p.name == "datasets"]
        assert [p for p in shipped if p.name == "recipe.py" and p.parent.name == "flare"]  # the package, whole
    listing = [sorted(str(p.relative_to(out)) for p in out.rglob("*")) for out in (tmp_path / "a", tmp_path / "b")]
    assert listing[0] == listing[1]
