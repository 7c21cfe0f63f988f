"""Mistakes that come from Orbax habits get a hint that says what to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.orbax_writers import save_standard

TREE = {
    "params": {"linear0": {"kernel": np.ones((2, 2), np.float32), "bias": np.zeros(2, np.float32)}}
}


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    save_standard(tmp_path / "layers", TREE)
    return tmp_path / "layers"


def test_checkpoint_before_transform_says_the_transform_comes_first(ckpt: Path) -> None:
    with pytest.raises(
        suture.SurgeryError, match=r"the transform comes first.*the arguments look swapped"
    ):
        suture.load_and_transform(str(ckpt), lambda tree: tree)
    with pytest.raises(suture.SurgeryError, match=r"the transform comes first"):
        suture.plan(suture.open(ckpt), None)


def test_a_misspelled_target_key_reports_every_problem_with_did_you_mean(ckpt: Path) -> None:
    target = {"params": {"linear0": {"kernal": np.zeros((2, 2), np.float32), "bias": np.zeros(2)}}}
    with pytest.raises(ValueError):  # stock Orbax refuses the same target too
        ocp.StandardCheckpointer().restore(ckpt, target)
    for load in (
        lambda: suture.load(ckpt, target),
        lambda: suture.load_and_transform(None, ckpt, target=target),
    ):
        with pytest.raises(suture.SurgeryError) as caught:
            load()
        message = str(caught.value)
        assert "has 2 problems" in message
        assert "1 leaf path(s) that the" in message and "'params/linear0/kernel'" in message
        assert "'params/linear0/kernal'. Did you mean 'params/linear0/kernel'?" in message


@pytest.fixture
def cli_files(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "recipe.yaml").write_text("rules:\n  - drop: opt_state\n")
    (tmp_path / "fine.yaml").write_text(
        "rules:\n  - rename: {pattern: params/linear0, to: params/layer0}\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_swapped_command_line_arguments_are_named(cli_files: Path) -> None:
    done = CliRunner().invoke(app, ["plan", "layers", "recipe.yaml"])
    assert done.exit_code == 2
    assert "The arguments look swapped: 'layers' is a checkpoint and 'recipe.yaml' a recipe" in (
        done.output
    )
    assert "suture plan recipe.yaml layers" in done.output
    done = CliRunner().invoke(app, ["apply", "layers", "layers", "-o", "out"])
    assert done.exit_code == 2 and "'layers' is a checkpoint, not a recipe file" in done.output


def test_a_family_recipe_given_to_plan_or_apply_points_to_convert(cli_files: Path) -> None:
    """`suture plan qwen3:maxtext HF` said the recipe "does not exist": built-in family
    recipes run with `suture convert --recipe`, whose `--dry-run` prints the plan."""
    done = CliRunner().invoke(app, ["plan", "qwen3.5:maxtext", "layers"])
    assert done.exit_code == 2 and "does not exist" not in done.output
    assert "'qwen3.5:maxtext' is a built-in family recipe" in done.output
    assert "suture convert layers OUT --recipe qwen3.5:maxtext --dry-run" in done.output
    done = CliRunner().invoke(app, ["apply", "llama3.1:maxtext", "layers", "-o", "out"])
    assert done.exit_code == 2
    assert "Run it: suture convert layers OUT --recipe llama3.1:maxtext" in done.output
    assert not (cli_files / "out").exists()


def test_apply_dry_run_exits_2_when_the_plan_has_problems(cli_files: Path) -> None:
    bad = CliRunner().invoke(app, ["apply", "recipe.yaml", "layers", "-o", "out", "--dry-run"])
    assert bad.exit_code == 2 and "drop('opt_state') matches no path" in bad.output
    good = CliRunner().invoke(app, ["apply", "fine.yaml", "layers", "-o", "out", "--dry-run"])
    assert good.exit_code == 0 and "No problems." in good.output
    assert not (cli_files / "out").exists()


def test_command_line_errors_speak_of_command_line_options(cli_files: Path) -> None:
    save_standard(cli_files / "wider", {"params": {"head": {"kernel": np.ones(3, np.float32)}}})
    done = CliRunner().invoke(app, ["plan", "fine.yaml", "layers", "--target", "wider"])
    assert done.exit_code == 2
    assert "pass --partial" in done.output
    assert "create them with init = {...} in a Python recipe (there is no --init option)" in (
        done.output
    )
    assert "init=" not in done.output and "partial=True" not in done.output
