"""Surgery that would silently give wrong values: a reverse with the wrong --like, lossy casts.

A recipe's forward output records what it read, so ``--reverse --like`` of another model is
refused; a cast that can destroy values is flagged in the plan, an error with strict casts,
and refused by `rules.reverse` (docs/reliability.md, "Surgery that cannot silently change
values").
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

import suture
from suture import rules
from suture._dtypes import cast_changes, cast_loss
from suture._surgery.recorded_input import RECORD_KEY
from suture.cli import app

runner = CliRunner()


def _model(width: int = 6, layers: int = 3, dtype=np.float32) -> dict:
    rng = np.random.default_rng(width)
    return {
        "model": {
            f"layer{i}": {"w": rng.standard_normal((4, width)).astype(dtype)} for i in range(layers)
        },
        "embed": rng.standard_normal((10, width)).astype(dtype),
    }


RECIPE = (
    "rules:\n"
    "  - rename: {pattern: 'model/layer(\\d+)', to: 'blocks/\\1'}\n"
    "  - stack: {pattern: 'blocks/(?P<i>\\d+)', into: layers}\n"
    "  - cast: {pattern: embed, dtype: float64}\n"
)


def _cli(*arguments: object):
    result = runner.invoke(app, [str(argument) for argument in arguments])
    return result


def _refused(result, *phrases: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Error:" in result.output and "Traceback" not in result.output
    for phrase in phrases:
        assert phrase in result.output, result.output


def _read(path: Path) -> dict:
    return {key: np.asarray(value) for key, value in suture.flatten(suture.load(path)).items()}


def _assert_identical(tree: dict, back: dict) -> None:
    source = {key: np.asarray(value) for key, value in suture.flatten(tree).items()}
    assert sorted(source) == sorted(back)
    for key, value in source.items():
        assert value.dtype == back[key].dtype, key
        np.testing.assert_array_equal(value, back[key], err_msg=key)


@pytest.fixture
def forward(tmp_path: Path) -> tuple[Path, Path, dict]:
    """(recipe, forward output, source tree): the recipe applied to `source` by the CLI."""
    tree = _model()
    suture.save(tree, tmp_path / "source", progress=False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    result = _cli("apply", recipe, tmp_path / "source", "-o", tmp_path / "fwd", "--no-progress")
    assert result.exit_code == 0, result.output
    return recipe, tmp_path / "fwd", tree


# Item 5: --reverse --like of another model -----------------------------------------------------


def test_the_forward_output_records_names_shapes_and_dtypes_of_its_input(forward):
    _, output, tree = forward
    record = json.loads(suture.open(output).custom_metadata[RECORD_KEY])
    assert record["leaves"]["model/layer0/w"] == [[4, 6], "float32"]
    assert sorted(record["leaves"]) == sorted(suture.flatten(tree))
    assert record["dtype"] is None and record["strict_casts"] is False


def test_reverse_like_of_a_different_model_is_refused(forward, tmp_path):
    recipe, output, _ = forward
    suture.save(_model(width=8), tmp_path / "other", progress=False)  # same names, other sizes
    result = _cli(
        "apply", recipe, output, "-o", tmp_path / "back", "--reverse", "--like", tmp_path / "other"
    )
    _refused(result, "is not the input that the forward run read", "float32[4, 8]", "[4, 6]")
    assert not (tmp_path / "back").exists()


def test_reverse_like_of_the_same_model_in_another_dtype_is_refused(forward, tmp_path):
    """The recipe gives the same tree from a float16 like (cast to float64), but casting back
    would write float16: only the record tells."""
    recipe, output, _ = forward
    other = _model()
    other["embed"] = other["embed"].astype(np.float16)
    suture.save(other, tmp_path / "half", progress=False)
    result = _cli(
        "apply", recipe, output, "-o", tmp_path / "back", "--reverse", "--like", tmp_path / "half"
    )
    _refused(result, "leaf 'embed' is float16[10, 6] in --like but float32[10, 6] in the record")


def test_reverse_like_with_a_leaf_more_or_less_is_refused(forward, tmp_path):
    recipe, output, _ = forward
    fewer = _model(layers=2)
    suture.save(fewer, tmp_path / "fewer", progress=False)
    result = _cli(
        "apply", recipe, output, "-o", tmp_path / "back", "--reverse", "--like", tmp_path / "fewer"
    )
    _refused(result, "the record has leaf 'model/layer2/w', which --like lacks")


def test_without_a_record_like_is_checked_against_the_output(forward, tmp_path):
    """A forward output written by the library (no record): the recipe run forward on --like
    must give it."""
    recipe, output, _ = forward
    suture.save(suture.load(output), tmp_path / "unrecorded", progress=False)
    suture.save(_model(width=8), tmp_path / "other", progress=False)
    result = _cli(
        "apply",
        recipe,
        tmp_path / "unrecorded",
        "-o",
        tmp_path / "back",
        "--reverse",
        "--like",
        tmp_path / "other",
    )
    _refused(
        result,
        "is not the input of",
        "leaf 'layers/w' is float32[3, 4, 8] in the forward result but float32[3, 4, 6] in the "
        "source",
    )
    assert not (tmp_path / "back").exists()


def test_reverse_uses_the_record_when_like_is_left_out(forward, tmp_path):
    recipe, output, tree = forward
    result = _cli("apply", recipe, output, "-o", tmp_path / "back", "--reverse", "--no-progress")
    assert result.exit_code == 0, result.output
    _assert_identical(tree, _read(tmp_path / "back"))


def test_the_record_survives_a_safetensors_output_and_a_dtype(tmp_path):
    tree = _model()
    suture.save(tree, tmp_path / "source", progress=False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - rename: {pattern: 'model/layer(\\d+)', to: 'block\\1'}\n")
    out = tmp_path / "fwd.safetensors"
    result = _cli(
        "apply", recipe, tmp_path / "source", "-o", out, "--format", "safetensors",
        "--dtype", "float64", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    back = _cli("apply", recipe, out, "-o", tmp_path / "back", "--reverse", "--no-progress")
    assert back.exit_code == 0, back.output  # the recorded --dtype is undone too
    _assert_identical(tree, _read(tmp_path / "back"))


def test_convert_with_a_recipe_records_its_input_too(tmp_path):
    tree = _model()
    suture.save(tree, tmp_path / "source", progress=False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    converted = _cli(
        "convert", tmp_path / "source", tmp_path / "fwd.safetensors", "--recipe", recipe,
        "--no-progress",
    )  # fmt: skip
    assert converted.exit_code == 0, converted.output
    suture.save(_model(width=8), tmp_path / "other", progress=False)
    refused = _cli(
        "apply", recipe, tmp_path / "fwd.safetensors", "-o", tmp_path / "x", "--reverse",
        "--like", tmp_path / "other",
    )  # fmt: skip
    _refused(refused, "is not the input that the forward run read")
    back = _cli(
        "apply", recipe, tmp_path / "fwd.safetensors", "-o", tmp_path / "back", "--reverse",
        "--no-progress",
    )  # fmt: skip
    assert back.exit_code == 0, back.output
    _assert_identical(tree, _read(tmp_path / "back"))


@pytest.mark.parametrize(
    "record",
    [
        "not json",
        json.dumps({"version": 2, "leaves": {}}),
        json.dumps({"version": 1, "leaves": {"w": [[-1], "float32"]}, "strict_casts": False}),
        json.dumps({"version": 1, "leaves": {"w": [[2], "float99"]}, "strict_casts": False}),
        json.dumps({"version": 1, "leaves": {"w": [[2], "object"]}, "strict_casts": False}),
        json.dumps(
            {"version": 1, "leaves": {"w": [[2**61, 2**61], "float32"]}, "strict_casts": False}
        ),
        "[" * 100_000,
        json.dumps({"version": 1, "leaves": {"w": [[2], "float32"]}, "strict_casts": "yes"}),
    ],
)
def test_a_malformed_record_is_refused_not_trusted(tmp_path, record):
    suture.save({"w": np.ones(2, np.float32)}, tmp_path / "out", metadata={RECORD_KEY: record})
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - rename: {pattern: w, to: v}\n")
    result = _cli("apply", recipe, tmp_path / "out", "-o", tmp_path / "back", "--reverse")
    _refused(result, RECORD_KEY)


# Item 6: lossy casts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target", "loses"),
    [
        ("float32", "int8", "fractions are cut, and values outside -128..127"),
        ("float32", "uint8", "values outside 0..255"),
        ("float32", "bool", "every nonzero value becomes True"),
        ("float32", "float16", "values beyond ±65504 become inf"),
        ("float32", "float8_e4m3fn", "values beyond ±448 become NaN"),
        ("float64", "float32", "become inf"),
        ("int64", "int32", "wrap around"),
        ("int8", "uint8", "values outside 0..255 wrap around"),
        ("uint8", "int8", "values outside -128..127 wrap around"),
        ("int32", "float32", "integers above 2**24 are rounded"),
        ("int32", "float16", "integers beyond ±65504 become inf"),
        ("complex64", "float32", "the imaginary part is dropped"),
        ("int8", "int4", "values outside -8..7"),
        # precision-only narrowing and widening: not flagged
        ("float32", "bfloat16", None),
        ("float16", "float32", None),
        ("bfloat16", "float32", None),
        ("int8", "int32", None),
        ("uint8", "int16", None),
        ("int8", "bfloat16", None),
        ("bool", "float32", None),
        ("float32", "complex64", None),
    ],
)
def test_cast_loss_names_what_each_cast_can_destroy(source, target, loses):
    found = cast_loss(source, target)
    assert found is None if loses is None else loses in found


def test_cast_changes_finds_only_values_that_do_not_fit():
    values = np.array([1.0, 300.0, 2.5, -0.0, np.nan], np.float32)
    with np.errstate(invalid="ignore"):
        cast = values.astype(np.int8)
    assert cast_changes(values, cast).tolist() == [
        False, True, True, False, True,
    ]  # fmt: skip
    halves = np.array([1.0001, 1e5, np.inf, np.nan, 65504.0], np.float32)
    with np.errstate(over="ignore"):
        cast = halves.astype(np.float16)
    assert cast_changes(halves, cast).tolist() == [False, True, False, False, False]
    big = np.array([2**24 + 1, 7], np.int32)
    assert cast_changes(big, big.astype(np.float32)).tolist() == [True, False]
    wide = np.array([1 + 0j, 1 + 1j], np.complex64)
    assert cast_changes(wide, wide.real.copy()).tolist() == [False, True]


def _quantize_recipe(tmp_path: Path, dtype: str = "int8") -> Path:
    recipe = tmp_path / "quantize.yaml"
    recipe.write_text(f"rules:\n  - cast: {{pattern: w, dtype: {dtype}, floating_only: false}}\n")
    return recipe


def test_the_plan_flags_lossy_casts_and_not_bfloat16(tmp_path):
    source = {
        "w": np.array([1.0, 300.0], np.float32),
        "b": np.ones(3, np.float32),
        "h": np.ones(2, np.float32),
    }
    recipe = [
        rules.cast("w", "int8", floating_only=False),
        rules.cast("b", "bfloat16"),
        rules.cast("h", "float16"),
    ]
    plan = suture.plan(recipe, source)
    assert plan.ok
    assert [(c.path, c.source_dtype, c.dtype, c.checked) for c in plan.lossy_casts] == [
        ("w", "float32", "int8", False),
        ("h", "float32", "float16", False),
    ]
    text = str(plan)
    assert "Lossy cast float32 -> int8 at 1 leaf (w)" in text
    assert "Lossy cast float32 -> float16 at 1 leaf (h): values beyond ±65504 become inf" in text
    assert "bfloat16 at" not in text and "pass strict_casts=True" in text
    strict = suture.plan(recipe, source, strict_casts=True)
    assert all(cast.checked for cast in strict.lossy_casts)
    assert "cast int8 (checked)" in str(strict) and "checked as it is written" in str(strict)
    assert json.loads(strict.to_json())["lossy_casts"][0]["checked"] is True


def test_the_plan_flags_a_cast_of_stacked_members(tmp_path):
    lazy = suture.open(_model())
    stacked = suture.stack([lazy[f"model/layer{i}/w"] for i in range(3)]).astype("float16")
    plan = suture.plan(lambda tree: {"stacked": stacked}, {"x": np.ones(1)})
    assert [cast.path for cast in plan.lossy_casts] == ["stacked"]


def test_cli_plan_and_apply_flag_a_lossy_cast(tmp_path):
    suture.save({"w": np.array([1.0, 300.0], np.float32)}, tmp_path / "src", progress=False)
    recipe = _quantize_recipe(tmp_path)
    planned = _cli("plan", recipe, tmp_path / "src")
    assert planned.exit_code == 0, planned.output
    assert "Lossy cast float32 -> int8 at 1 leaf (w)" in planned.output
    assert "pass --strict-casts" in planned.output
    applied = _cli("apply", recipe, tmp_path / "src", "-o", tmp_path / "out", "--no-progress")
    assert applied.exit_code == 0, applied.output
    assert "Warning: Lossy cast float32 -> int8" in applied.stderr
    assert _read(tmp_path / "out")["w"].tolist() == [1, 44]  # what was asked, and said


def test_strict_casts_stop_a_write_at_a_value_that_does_not_fit(tmp_path):
    values = np.zeros((64, 32), np.float32)
    values[37, 5] = 300.0
    suture.save({"w": values}, tmp_path / "src", progress=False)
    result = _cli(
        "apply", _quantize_recipe(tmp_path), tmp_path / "src", "-o", tmp_path / "out",
        "--strict-casts", "--no-progress",
    )  # fmt: skip
    _refused(
        result,
        "Leaf 'w': casting float32 to int8 changes element (37, 5) from 300.0 to 44",
        "without --strict-casts",
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["quantize.yaml", "src"]


def test_strict_casts_pass_values_that_fit_exactly(tmp_path):
    values = np.array([[1.0, -128.0], [127.0, 0.0]], np.float32)
    suture.save({"w": values}, tmp_path / "src", progress=False)
    result = _cli(
        "apply", _quantize_recipe(tmp_path), tmp_path / "src", "-o", tmp_path / "out",
        "--strict-casts", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.output
    np.testing.assert_array_equal(_read(tmp_path / "out")["w"], values.astype(np.int8))


def test_strict_casts_in_python_and_across_blocks(tmp_path):
    values = np.zeros((2048, 1024), np.float32)  # 8 MiB, written in several blocks
    values[1900, 1000] = 1e5
    suture.save({"w": values}, tmp_path / "src", progress=False)
    recipe = [rules.cast("w", "float16")]
    lazy = suture.transform(recipe, tmp_path / "src", strict_casts=True)
    with pytest.raises(
        suture.LossyCastError, match=r"element \(1900, 1000\) from 100000\.0 to inf"
    ):
        suture.save(
            lazy, tmp_path / "out", max_memory="32MiB", chunk_bytes="256KiB", progress=False
        )
    assert not (tmp_path / "out").exists()
    with pytest.raises(suture.LossyCastError, match="values beyond ±65504 become inf"):
        suture.load_and_transform(recipe, tmp_path / "src", strict_casts=True)
    rounded = suture.load_and_transform(
        recipe, {"w": np.array([1.0001], np.float32)}, strict_casts=True
    )
    assert rounded["w"].dtype == np.float16  # rounding is not a loss


def test_strict_casts_check_a_stacked_cast_and_leave_bfloat16_alone():
    tree = {f"layer{i}": np.full(3, 100.0 * i, np.float32) for i in range(3)}
    recipe = [
        rules.stack(r"layer(?P<i>\d+)", into="layers"),
        rules.cast("layers", "int8", floating_only=False),
    ]
    lazy = suture.transform(recipe, tree, strict_casts=True)
    assert lazy["layers"].node.describe() == "cast int8 (checked)"
    with pytest.raises(suture.LossyCastError, match=r"element \(2, 0\) from 200\.0 to -56"):
        suture.load(lazy)
    bf16 = suture.transform([rules.cast(".*", "bfloat16")], tree, strict_casts=True)
    assert bf16["layer2"].node.describe() == "cast bfloat16"
    assert suture.load(bf16)["layer2"].dtype == ml_dtypes.bfloat16


def test_convert_with_strict_casts(tmp_path):
    suture.save({"w": np.array([1.0, 1e5], np.float32)}, tmp_path / "src", progress=False)
    result = _cli(
        "convert", tmp_path / "src", tmp_path / "out.safetensors", "--dtype", "float16",
        "--strict-casts", "--no-progress",
    )  # fmt: skip
    _refused(result, "casting float32 to float16 changes element (1,) from 100000.0 to inf")
    assert not (tmp_path / "out.safetensors").exists()


def test_reverse_refuses_to_undo_a_lossy_cast():
    tree = {"w": np.array([1.0, 300.0], np.float32)}
    recipe = [rules.cast("w", "int8", floating_only=False)]
    with pytest.raises(
        suture.RuleError, match="cannot be undone exactly: 'w' was float32"
    ) as caught:
        rules.reverse(recipe, like=tree)
    assert "values outside -128..127" in str(caught.value) and "allow_lossy=True" in str(
        caught.value
    )
    undone = rules.apply_rules(
        rules.reverse(recipe, like=tree, allow_lossy=True), rules.apply_rules(recipe, tree)
    )
    assert np.asarray(undone["w"]).tolist() == [1.0, 44.0]  # why it is refused by default
    bf16 = [rules.cast("w", "bfloat16")]  # rounding only: undone to the rounded values
    assert rules.reverse(bf16, like=tree)[0].dtype == np.dtype(np.float32)


def test_cli_reverse_of_a_lossy_cast_is_refused_unless_the_forward_run_checked_it(tmp_path):
    suture.save({"w": np.array([1.0, 300.0], np.float32)}, tmp_path / "src", progress=False)
    recipe = _quantize_recipe(tmp_path)
    forward = _cli("apply", recipe, tmp_path / "src", "-o", tmp_path / "fwd", "--no-progress")
    assert forward.exit_code == 0, forward.output
    back = _cli("apply", recipe, tmp_path / "fwd", "-o", tmp_path / "back", "--reverse")
    _refused(back, "cannot be undone exactly", "to int8 is lossy")
    assert not (tmp_path / "back").exists()

    fits = {"w": np.array([1.0, -7.0], np.float32)}
    suture.save(fits, tmp_path / "fits", progress=False)
    strict = _cli(
        "apply", recipe, tmp_path / "fits", "-o", tmp_path / "fwd2", "--strict-casts",
        "--no-progress",
    )  # fmt: skip
    assert strict.exit_code == 0, strict.output
    back = _cli(
        "apply", recipe, tmp_path / "fwd2", "-o", tmp_path / "back2", "--reverse", "--no-progress"
    )
    assert back.exit_code == 0, back.output  # checked forward: undone exactly
    _assert_identical(fits, _read(tmp_path / "back2"))
