"""rules.reverse: every structural rule undone exactly, and rules without an inverse named."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import suture
from suture import rules
from suture.rules import RuleError


def _read(tree):
    return {path: np.asarray(leaf) for path, leaf in suture.flatten(tree).items()}


def _round_trip(recipe, tree, like=True):
    forward = rules.apply_rules(recipe, tree)
    back = rules.apply_rules(rules.reverse(recipe, like=tree if like else None), forward)
    return _read(back)


def _assert_identical(tree, back):
    source = _read(tree)
    assert sorted(source) == sorted(back)
    for path, value in source.items():
        assert value.dtype == back[path].dtype, path
        np.testing.assert_array_equal(value, back[path], err_msg=path)


def _layers(n=3, shape=(4, 6), dtype=np.float32):
    rng = np.random.default_rng(0)
    return {
        "model": {
            f"layer{i}": {
                "attn": {"w": rng.standard_normal(shape).astype(dtype)},
                "norm": rng.standard_normal(shape[-1]).astype(dtype),
            }
            for i in range(n)
        },
        "embed": rng.standard_normal((10, shape[-1])).astype(dtype),
    }


@pytest.mark.parametrize(
    "recipe",
    [
        [rules.rename(r"model/layer(\d+)/attn", r"decoder/block_\1/attention")],
        [rules.rename(r"model/layer(?P<n>\d)/(attn|norm)", r"m/\2_\g<n>")],
        [rules.rename("embed", "token_embedder/embedding")],
        [rules.stack(r"model/layer(?P<i>\d+)", into="layers")],
        [rules.stack(r"model/layer(\d+)/attn/w", into="stacked/w", axis=1)],
        [rules.transpose(r"model/layer\d+/attn/w")],
        [rules.transpose("embed", (1, 0))],
        [rules.permute("embed", [3, 1, 0, 2, 5, 4], axis=1)],
        [rules.reshape(r"model/layer\d+/attn/w", (4, 2, 3))],
        [rules.cast("embed", "float64")],
        [rules.scale("embed", 0.25)],
        [rules.split("embed", into=["head", "tail"], sizes=[3, 7])],
        [rules.concat(["model/layer0/norm", "model/layer1/norm"], into="both", axis=0)],
        [rules.map_values("embed", lambda x: x * 2, inverse=lambda x: x / 2)],
        [
            rules.rename(r"model/layer(\d+)", r"blocks/\1"),
            rules.transpose(r"blocks/\d+/attn/w"),
            rules.stack(r"blocks/(?P<i>\d+)", into="decoder/layers", axis=1),
            rules.reshape("embed", (5, 2, 6)),
            rules.cast("embed", "float64"),
        ],
    ],
    ids=lambda recipe: " + ".join(repr(rule) for rule in recipe)[:60],
)
def test_recipe_then_its_reverse_gives_the_source_bit_for_bit(recipe):
    tree = _layers()
    _assert_identical(tree, _round_trip(recipe, tree))


def test_unstack_reverses_to_stack():
    tree = {"layers": np.arange(24, dtype=np.int32).reshape(2, 3, 4)}
    _assert_identical(tree, _round_trip([rules.unstack("layers", into="layer{i}", axis=1)], tree))


def test_a_scale_by_a_power_of_two_is_exact_and_others_come_within_one_ulp():
    tree = {"w": np.random.default_rng(1).standard_normal(1000).astype(np.float32)}
    assert rules.scale("w", 0.125).exact and not rules.scale("w", 3.0).exact
    back = _round_trip([rules.scale("w", 3.0)], tree)["w"]
    assert np.all(np.abs(back - tree["w"]) <= np.spacing(np.abs(tree["w"])))


def test_a_downcast_comes_back_in_the_recorded_dtype_rounded_once():
    tree = {"w": np.linspace(-1, 1, 50, dtype=np.float32)}
    back = _round_trip([rules.cast("w", "bfloat16")], tree)["w"]
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, tree["w"].astype(ml_dtypes.bfloat16).astype(np.float32))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (rules.drop("embed"), r"drop\('embed'\) has no inverse: what it removes is gone"),
        (rules.keep("embed"), r"keep\('embed'\) has no inverse"),
        (rules.map_values("embed", np.tanh), r"give map_values\(\.\.\., inverse=fn\)"),
        (
            rules.rename(r"model/.*", "x"),
            r"cannot be reversed: its pattern has '\.' outside a group",
        ),
        (
            rules.rename(r"model/layer(\d+)/attn", "attn"),
            r"group 1 of its pattern is not used by its template",
        ),
        (rules.stack(r"model/layer(?P<i>\d+)", into="layers", start=1), r"start= and fill="),
    ],
)
def test_rules_without_an_inverse_are_named(rule, message):
    with pytest.raises(RuleError, match=message):
        rules.reverse([rules.rename("embed", "e2"), rule])


@pytest.mark.parametrize(
    "rule",
    [
        rules.cast("embed", "float64"),
        rules.reshape("embed", (60,)),
        rules.concat(["embed", "model/layer0/norm"], into="x"),
    ],
)
def test_inverses_that_need_the_input_say_to_pass_like(rule):
    with pytest.raises(RuleError, match=r"pass the recipe's input as like= \(--like SOURCE"):
        rules.reverse([rule])


def test_new_rules_check_their_arguments():
    tree = _layers()
    with pytest.raises(RuleError, match="does not fit"):
        rules.apply_rules([rules.reshape("embed", (7, 7))], tree)
    with pytest.raises(RuleError, match=r"order must be a permutation of range\(6\)"):
        rules.apply_rules([rules.permute("embed", [0, 1], axis=1)], tree)
    with pytest.raises(RuleError, match="not a permutation"):
        rules.apply_rules([rules.transpose("embed", (0, 0))], tree)


def test_reverse_on_disk_with_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from suture.cli import app

    tree = _layers()
    suture.save(tree, tmp_path / "source", progress=False)
    recipe = tmp_path / "recipe.py"
    recipe.write_text(
        "from suture import rules\n"
        "RULES = [rules.rename(r'model/layer(\\d+)', r'blocks/\\1'),\n"
        "         rules.stack(r'blocks/(?P<i>\\d+)', into='layers', axis=1),\n"
        "         rules.cast('embed', 'float64')]\n"
    )
    runner = CliRunner()
    forward = runner.invoke(
        app,
        [
            "apply",
            str(recipe),
            str(tmp_path / "source"),
            "-o",
            str(tmp_path / "fwd"),
            "--no-progress",
        ],
    )
    assert forward.exit_code == 0, forward.output
    recorded = runner.invoke(  # the forward output records its input: no --like needed
        app, ["apply", str(recipe), str(tmp_path / "fwd"), "-o", str(tmp_path / "x"), "--reverse"]
    )
    assert recorded.exit_code == 0, recorded.output
    _assert_identical(tree, _read(suture.load(tmp_path / "x")))
    suture.save(suture.load(tmp_path / "fwd"), tmp_path / "unrecorded", progress=False)
    missing = runner.invoke(
        app,
        [
            "apply",
            str(recipe),
            str(tmp_path / "unrecorded"),
            "-o",
            str(tmp_path / "y"),
            "--reverse",
        ],
    )
    assert missing.exit_code == 2 and "--like SOURCE" in missing.output
    back = runner.invoke(
        app,
        [
            "apply",
            str(recipe),
            str(tmp_path / "fwd"),
            "-o",
            str(tmp_path / "back"),
            "--reverse",
            "--like",
            str(tmp_path / "source"),
            "--no-progress",
        ],
    )
    assert back.exit_code == 0, back.output
    _assert_identical(tree, _read(suture.load(tmp_path / "back")))
