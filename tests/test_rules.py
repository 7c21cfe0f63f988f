"""suture.rules: each rule against numpy, lazily, with clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import suture
from suture import rules
from suture._iostats import count_bytes_read
from tests.orbax_writers import save_standard


def model(layers: int = 3, width: int = 4, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "params": {
            f"layer{i}": {
                "query": rng.standard_normal((width, width), dtype=np.float32),
                "key": rng.standard_normal((width, width), dtype=np.float32),
                "value": rng.standard_normal((width, width), dtype=np.float32),
                "bias": rng.standard_normal(width, dtype=np.float32),
            }
            for i in range(layers)
        },
        "opt_state": {"count": np.int32(3)},
        "step": np.int32(7),
    }


def flat_read(tree) -> dict:
    return {
        path: (leaf.read() if isinstance(leaf, suture.LazyArray) else leaf)
        for path, leaf in suture.flatten(tree).items()
    }


def test_rename_a_subtree_and_by_regex() -> None:
    tree = model()
    result = rules.apply_rules(
        [
            rules.rename("params/layer0", "params/first"),
            rules.rename(r"params/layer(\d)/bias", r"params/layer\1/b"),
        ],
        tree,
    )
    flat = suture.flatten(result)
    assert "params/first/query" in flat and "params/first/bias" in flat
    assert "params/layer1/b" in flat and "params/layer1/bias" not in flat
    np.testing.assert_array_equal(flat["params/first/query"], tree["params"]["layer0"]["query"])


def test_drop_and_keep() -> None:
    assert set(suture.flatten(rules.apply_rules([rules.drop("opt_state|step")], model()))) == {
        f"params/layer{i}/{name}" for i in range(3) for name in ("query", "key", "value", "bias")
    }
    assert list(rules.apply_rules([rules.keep("step")], model())) == ["step"]


def test_stack_every_leaf_of_every_layer_with_back_references() -> None:
    tree = model()
    result = rules.apply_rules(
        [rules.stack(r"params/layer(?P<i>\d+)/(.*)", into=r"params/layers/\2")], tree
    )
    stacked = result["params"]["layers"]["query"]
    assert stacked.shape == (3, 4, 4)
    np.testing.assert_array_equal(
        stacked.read(), np.stack([tree["params"][f"layer{i}"]["query"] for i in range(3)])
    )
    assert set(result["params"]["layers"]) == {"query", "key", "value", "bias"}


def test_stack_a_subtree_pattern_and_axis() -> None:
    tree = model()
    result = rules.apply_rules(
        [rules.stack(r"params/layer(\d+)", into="params/layers", axis=1)], tree
    )
    np.testing.assert_array_equal(
        result["params"]["layers"]["bias"].read(),
        np.stack([tree["params"][f"layer{i}"]["bias"] for i in range(3)], axis=1),
    )


def test_stack_orders_numerically_and_fills_gaps() -> None:
    tree = {f"layer{i}": np.full(2, float(i)) for i in (0, 2, 10)}
    with pytest.raises(
        rules.RuleError,
        match=r"has no member for index 1, 3, 4, 5, 6, 7, 8, 9 \(found \[0, 2, 10\]\)\. Give fill=",
    ):
        rules.apply_rules([rules.stack(r"layer(\d+)", into="layers")], tree)
    filled = rules.apply_rules([rules.stack(r"layer(\d+)", into="layers", fill=-1.0)], tree)[
        "layers"
    ].read()
    assert filled.shape == (11, 2)
    assert filled[10, 0] == 10 and filled[1, 0] == -1 and filled[2, 0] == 2


def test_stack_with_start_and_mismatched_shapes() -> None:
    tree = {"block1": np.ones(2), "block2": np.ones(2)}
    assert rules.apply_rules([rules.stack(r"block(\d+)", into="blocks", start=1)], tree)[
        "blocks"
    ].shape == (2, 2)
    with pytest.raises(
        suture.ShapeMismatchError,
        match=r"members of 'blocks' have different shapes: block1: \(2,\), block2: \(3,\)",
    ):
        rules.apply_rules(
            [rules.stack(r"block(\d+)", into="blocks", start=1)],
            {"block1": np.ones(2), "block2": np.ones(3)},
        )


def test_unstack_inverts_stack() -> None:
    tree = {"params": model()["params"]}
    there = rules.apply_rules([rules.stack(r"params/layer(?P<i>\d+)", into="params/layers")], tree)
    back = rules.apply_rules([rules.unstack("params/layers", into="params/layer{i}")], there)
    expected = suture.flatten(tree)
    actual = flat_read(back)
    assert sorted(actual) == sorted(expected)
    for path in expected:
        np.testing.assert_array_equal(actual[path], expected[path])


def test_cast_floating_only_by_default() -> None:
    result = rules.apply_rules([rules.cast(".*", "bfloat16")], model())
    assert result["params"]["layer0"]["query"].dtype == ml_dtypes.bfloat16
    assert np.asarray(result["step"]).dtype == np.int32
    everything = rules.apply_rules([rules.cast(".*", "float16", floating_only=False)], model())
    assert everything["step"].dtype == np.float16


def test_fused_qkv_concat_and_split_round_trip() -> None:
    tree = model()
    fused = rules.apply_rules(
        [rules.concat([r"(.*)/query", r"(.*)/key", r"(.*)/value"], into=r"\1/qkv", axis=-1)], tree
    )
    qkv = fused["params"]["layer1"]["qkv"]
    layer = tree["params"]["layer1"]
    np.testing.assert_array_equal(
        qkv.read(), np.concatenate([layer["query"], layer["key"], layer["value"]], axis=-1)
    )
    split = rules.apply_rules(
        [rules.split(r"(.*)/qkv", into=[r"\1/query", r"\1/key", r"\1/value"], axis=-1)], fused
    )
    for name in ("query", "key", "value"):
        np.testing.assert_array_equal(split["params"]["layer1"][name].read(), layer[name])


def test_split_with_sizes_and_bad_sizes() -> None:
    tree = {"w": np.arange(10)}
    parts = rules.apply_rules([rules.split("w", into=["a", "b"], sizes=[3, 7])], tree)
    assert parts["a"].read().tolist() == [0, 1, 2] and parts["b"].shape == (7,)
    with pytest.raises(rules.RuleError, match=r"does not split into 3 equal parts. Give sizes="):
        rules.apply_rules([rules.split("w", into=["a", "b", "c"])], tree)
    with pytest.raises(
        rules.RuleError, match=r"sizes \(3, 3\) must have one entry per output and sum to 10"
    ):
        rules.apply_rules([rules.split("w", into=["a", "b"], sizes=[3, 3])], tree)


def test_concat_missing_part_is_an_error() -> None:
    with pytest.raises(rules.RuleError, match=r"'l/qkv' has no part matching '\(\.\*\)/value'"):
        rules.apply_rules(
            [rules.concat([r"(.*)/query", r"(.*)/value"], into=r"\1/qkv")],
            {"l": {"query": np.ones(2)}, "m": {"query": np.ones(2), "value": np.ones(2)}},
        )


def test_map_values_is_lazy(tmp_path: Path) -> None:
    layers = model()["params"]
    flat = {f"params.{k}.{n}": v for k, named in layers.items() for n, v in named.items()}
    save_file(flat, str(tmp_path / "model.safetensors"))
    tree = suture.open(tmp_path / "model.safetensors").tree
    with count_bytes_read() as counted:
        result = rules.apply_rules([rules.map_values(r".*/bias", lambda b: b * 2 + 1)], tree)
    assert counted.bytes == 0
    bias = result["params"]["layer2"]["bias"]
    assert isinstance(bias, suture.LazyArray)
    with count_bytes_read() as reading:
        np.testing.assert_allclose(bias.read(), model()["params"]["layer2"]["bias"] * 2 + 1)
    assert reading.bytes == 4 * 4  # the bias is read only now


def test_unmatched_rule_is_an_error_unless_optional() -> None:
    with pytest.raises(
        rules.RuleError,
        match=r"rename\('param', 'p'\) matches no path\. Did you mean 'params'.*optional=True",
    ):
        rules.apply_rules([rules.rename("param", "p")], model())
    assert rules.apply_rules([rules.drop("ema", optional=True)], {"w": 1}) == {"w": 1}


def test_two_rules_writing_one_path_name_both() -> None:
    tree = {"a": np.ones(1), "b": np.ones(1)}
    with pytest.raises(
        rules.RuleError, match=r"Rules rename\('a', 'c'\) and rename\('b', 'c'\) both produce 'c'"
    ):
        rules.apply_rules([rules.rename("a", "c"), rules.rename("b", "c")], tree)
    with pytest.raises(
        rules.RuleError, match=r"rename\('\(a\|b\)', 'c'\) maps both 'a' and 'b' to 'c'"
    ):
        rules.apply_rules([rules.rename("(a|b)", "c")], tree)
    with pytest.raises(rules.RuleError, match=r"would overwrite 'b', which the tree already holds"):
        rules.apply_rules([rules.rename("a", "b")], tree)


def test_bad_patterns_and_rule_objects() -> None:
    with pytest.raises(rules.RuleError, match=r"'\[' is not a valid regular expression"):
        rules.apply_rules([rules.drop("[")], {"a": 1})
    with pytest.raises(rules.RuleError, match=r"Rules must be suture.rules objects; got str"):
        rules.apply_rules(["drop opt"], {"a": 1})
    with pytest.raises(rules.RuleError, match=r"index of 'x' must be digits"):
        rules.apply_rules([rules.stack("x", into="y")], {"x": np.ones(1)})
    with pytest.raises(rules.RuleError, match=r"needs an array at 'name0'"):
        rules.apply_rules([rules.stack(r"name(\d)", into="y")], {"name0": "text"})


def test_rules_on_disk_read_only_what_is_used(tmp_path: Path) -> None:
    tree = model(layers=8, width=256)
    save_standard(tmp_path / "ckpt", tree)
    ckpt = suture.open(tmp_path / "ckpt")
    result = rules.apply_rules(
        [
            rules.drop("opt_state"),
            rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
            rules.cast("params", "bfloat16"),
        ],
        ckpt.tree,
    )
    query = result["params"]["layers"]["query"]
    query[0].read()  # the OCDBT index, once
    with count_bytes_read() as one_layer:
        got = query[5].read()
    np.testing.assert_array_equal(got, tree["params"]["layer5"]["query"].astype(ml_dtypes.bfloat16))
    assert one_layer.bytes < 256 * 256 * 4 * 1.1


# Hypothesis: rename / drop / cast rule sets against a plain reference implementation.
segments = st.sampled_from(["a", "b", "enc", "dec", "w0", "w1"])
paths = st.lists(segments, min_size=1, max_size=3).map("/".join)


def _reference(flat: dict, rule_specs: list) -> dict:
    for kind, pattern, extra in rule_specs:
        compiled = re.compile(pattern)

        def hit(path, compiled=compiled):
            parts = path.split("/")
            for depth in range(len(parts), 0, -1):
                m = compiled.fullmatch("/".join(parts[:depth]))
                if m:
                    return m, "/".join(parts[depth:])
            return None

        if kind == "drop":
            flat = {p: v for p, v in flat.items() if not hit(p)}
        elif kind == "cast":
            flat = {p: (v.astype(np.float16) if hit(p) else v) for p, v in flat.items()}
        else:
            renamed = {}
            for p, v in flat.items():
                h = hit(p)
                new = (h[0].expand(extra) + (f"/{h[1]}" if h[1] else "")) if h else p
                renamed[new] = v
            flat = renamed
    return flat


@st.composite
def rule_cases(draw):
    flat = {}
    for path in draw(st.lists(paths, min_size=1, max_size=6, unique=True)):
        if any(other.startswith(path + "/") or path.startswith(other + "/") for other in flat):
            continue
        flat[path] = np.full(2, len(flat), np.float32)
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["rename", "drop", "cast"]))
        segment = draw(segments)
        if kind == "rename":
            specs.append(("rename", f"(.*){segment}", r"\1" + segment + "_x"))
        else:
            specs.append((kind, f"(.*){segment}(.*)", None))
    return flat, specs


@settings(max_examples=200, deadline=None)
@given(rule_cases())
def test_random_rule_sets_match_the_reference(case) -> None:
    flat, specs = case
    built = [
        rules.rename(p, e, optional=True)
        if k == "rename"
        else rules.drop(p, optional=True)
        if k == "drop"
        else rules.cast(p, "float16", optional=True)
        for k, p, e in specs
    ]
    try:
        expected = _reference(dict(flat), specs)
    except re.error:
        return
    try:
        actual = suture.flatten(rules.apply_rules(built, suture.unflatten(flat)))
    except rules.RuleError as error:
        assert (
            "would overwrite" in str(error)
            or "maps both" in str(error)
            or "both produce" in str(error)
        )
        return
    if not expected:
        assert actual in ({}, {"": {}})
        return
    assert sorted(actual) == sorted(expected)
    for path, value in expected.items():
        got = actual[path]
        np.testing.assert_array_equal(
            np.asarray(got.read() if isinstance(got, suture.LazyArray) else got), value
        )
        assert (
            np.asarray(got.read() if isinstance(got, suture.LazyArray) else got).dtype
            == value.dtype
        )
