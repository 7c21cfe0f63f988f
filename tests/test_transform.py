"""suture.apply_transformations gives what orbax.checkpoint.apply_transformations gives."""

from __future__ import annotations

import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import suture
from suture._iostats import count_bytes_read
from tests.orbax_writers import save_standard

logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax warns on every call of its API


def both(original, transforms, new_tree, **kwargs):
    """The result of Orbax and of suture for the same inputs (Transforms translated)."""

    def to_orbax(node):
        if isinstance(node, dict):
            return {key: to_orbax(value) for key, value in node.items()}
        return ocp.Transform(
            original_key=node.original_key,
            use_fallback=node.use_fallback,
            value_fn=node.value_fn,
            multi_value_fn=node.multi_value_fn,
        )

    expected = ocp.apply_transformations(original, to_orbax(transforms), new_tree, **kwargs)
    actual = suture.apply_transformations(original, transforms, new_tree, **kwargs)
    return expected, actual


def assert_same(expected, actual) -> None:
    flat_expected, flat_actual = suture.flatten(expected), suture.flatten(actual)
    assert sorted(flat_expected) == sorted(flat_actual)
    for key, value in flat_expected.items():
        got = flat_actual[key]
        if isinstance(got, suture.LazyArray):
            got = got.read()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(value), err_msg=key)


T = suture.Transform

SEED_EXAMPLES = {
    "rename": (
        {"a": 1, "b": 2},
        {"a2": T(original_key="a"), "b2": T(original_key="b")},
        {"a2": ..., "b2": ...},
    ),
    "regex_rename": (
        {"a1": 1, "b5": 2},
        {r"([a-z])_([0-9])": T(original_key=r"\1\2")},
        {"a_1": ..., "b_5": ...},
    ),
    "nested_rename_flat_keys": (
        {"a": 1, "dense_1": {"kernel": 2, "bias": 3}, "dense_2": {"kernel": 4, "bias": 5}},
        {
            r"([a-z]+)_NEW": T(original_key=r"\1"),
            r"([a-z]+)_([0-9])_NEW/([a-z]+)_1": T(original_key=r"\1_\2/\3"),
        },
        {
            "a_NEW": ...,
            "dense_1_NEW": {"kernel_1": ..., "bias_1": ...},
            "dense_2_NEW": {"kernel_1": ..., "bias_1": ...},
        },
    ),
    "nested_rename_nested_dict": (
        {"a": 1, "dense_1": {"kernel": 2, "bias": 3}, "dense_2": {"kernel": 4, "bias": 5}},
        {
            r"([a-z]+)_NEW": T(original_key=r"\1"),
            r"([a-z]+)_([0-9])_NEW": {"([a-z]+)_1": T(original_key=r"\1_\2/\3")},
        },
        {
            "a_NEW": ...,
            "dense_1_NEW": {"kernel_1": ..., "bias_1": ...},
            "dense_2_NEW": {"kernel_1": ..., "bias_1": ...},
        },
    ),
    "value_fn": (
        {"a": 1, "b": 2},
        {"a": T(value_fn=lambda v: v * 2), "b2": T(value_fn=lambda v: v * 3, original_key="b")},
        {"a": ..., "b2": ...},
    ),
    "value_fn_regex": (
        {"a1": 1, "a2": 2, "b": 3},
        {
            r"a([0-9]?)\*2": T(value_fn=lambda v: v * 2, original_key=r"a\1"),
            r"b([0-9]?)\*3": T(value_fn=lambda v: v * 3, original_key=r"b\1"),
        },
        {"a1*2": ..., "a2*2": ..., "b*3": ...},
    ),
    "restructure": (
        {"a": 1, "dense_1": {"kernel": 2, "bias": 3}, "dense_2": {"kernel": 4, "bias": 5}},
        {
            r"([a-z]+)": T(original_key=r"\1"),
            r"([a-z]+)_([0-9])_([a-z]+)": T(original_key=r"\1_\2/\3"),
        },
        {
            "a": ...,
            "dense_1_kernel": ...,
            "dense_1_bias": ...,
            "dense_2_kernel": ...,
            "dense_2_bias": ...,
        },
    ),
    "multi_value": (
        {"a": np.array([1, 2, 3, 4]), "b": {"c": np.array([5, 6, 7, 8])}},
        {
            "a": T(multi_value_fn=lambda _, kv: kv["a"][-1]),
            "b": {"c": T(multi_value_fn=lambda _, kv: kv["a"] + kv["b"]["c"])},
        },
        {"a": ..., "b": {"c": ...}},
    ),
    "average": (
        {"a": {"a_1": 1, "a_2": 2}, "b": {"b_1": 3, "b_2": 4, "b_3": 5}},
        {r"([a-z]+)": T(multi_value_fn=lambda k, kv: sum(kv[k].values()) / len(kv[k]))},
        {"a": ..., "b": ...},
    ),
    "named_groups": (
        {"encoder": {"layer0": 1, "layer1": 2}},
        {r"blocks/(?P<index>\d+)": T(original_key=r"encoder/layer\g<index>")},
        {"blocks": {"0": ..., "1": ...}},
    ),
}


@pytest.mark.parametrize("name", list(SEED_EXAMPLES))
def test_seed_examples_match_orbax_in_memory(name: str) -> None:
    original, transforms, new_tree = SEED_EXAMPLES[name]
    expected, actual = both(original, transforms, new_tree)
    assert_same(expected, actual)


@pytest.mark.parametrize(
    "name",
    ["rename", "nested_rename_nested_dict", "value_fn", "restructure", "multi_value", "average"],
)
def test_seed_examples_match_orbax_on_lazy_trees(tmp_path: Path, name: str) -> None:
    original, transforms, new_tree = SEED_EXAMPLES[name]
    as_arrays = jax.tree.map(lambda v: np.asarray(v, np.float32), original)
    save_standard(tmp_path / "ckpt", as_arrays)
    lazy_original = suture.open(tmp_path / "ckpt").tree
    with count_bytes_read() as building:
        lazy_result = suture.apply_transformations(lazy_original, transforms, new_tree)
    assert building.bytes < 64 * 1024  # at most the OCDBT index, never array data
    expected, _ = both(as_arrays, transforms, new_tree)
    assert_same(expected, suture.load(lazy_result))


def test_default_to_original_false_and_fallbacks_match_orbax() -> None:
    original = {"a": 1, "b": 2, "c": 3}
    new_tree = {"a": 10, "b": 20, "d": 40}
    transforms = {"b": T(use_fallback=True)}
    for default_to_original in (True, False):
        expected, actual = both(
            original, transforms, new_tree, default_to_original=default_to_original
        )
        assert_same(expected, actual)


def test_every_matching_transform_applies_in_sorted_key_order_and_the_last_wins() -> None:
    original = {"x": 1, "y": 2}
    # Orbax (through jax) orders transformation keys by sorting: "(z)" before "z".
    transforms = {"z": T(original_key="x"), r"(z)": T(original_key="y")}
    expected, actual = both(original, transforms, {"z": ...})
    assert_same(expected, actual)
    assert actual == {"z": 1}


def test_lists_tuples_and_new_only_keys_keep_new_tree_values() -> None:
    original = {"params": {"w": [1, 2]}, "old": 5}
    new_tree = {"params": {"w": [0, 0]}, "extra": (7, 8)}
    expected, actual = both(original, {}, new_tree)
    assert_same(expected, actual)
    assert actual == {"params": {"w": [1, 2]}, "extra": (7, 8)}


def test_orbax_transform_objects_are_accepted() -> None:
    result = suture.apply_transformations(
        {"a": 1}, {"b": ocp.Transform(original_key="a")}, {"b": ...}
    )
    assert result == {"b": 1}


def test_real_world_dense_example_on_disk_reads_only_used_leaves(tmp_path: Path) -> None:
    """Seed 002's Dense_0..3 example: old layers 0, 1 become new layers 1, 2."""
    rng = np.random.default_rng(0)

    def dense(n_in, n_out):
        return {
            "kernel": rng.standard_normal((n_in, n_out), dtype=np.float32),
            "bias": np.zeros(n_out, np.float32),
        }

    width = 256
    original = {
        "params": {"Dense_0": dense(width, width), "Dense_1": dense(width, width)},
        "unused": dense(width, 4 * width),
    }
    save_standard(tmp_path / "ckpt", original)
    new_state = {"params": {f"Dense_{i}": dense(width, width) for i in range(4)}}
    transforms = {
        r"(.*)Dense_0(.*)": T(use_fallback=True),
        r"(.*)Dense_1(.*)": T(original_key=r"\1Dense_0\2"),
        r"(.*)Dense_2(.*)": T(original_key=r"\1Dense_1\2"),
    }
    expected = ocp.apply_transformations(
        original,
        {
            key: ocp.Transform(original_key=t.original_key, use_fallback=t.use_fallback)
            for key, t in transforms.items()
        },
        new_state,
    )
    ckpt = suture.open(tmp_path / "ckpt")
    lazy = suture.apply_transformations(ckpt.tree, transforms, new_state)
    with count_bytes_read() as reading:
        restored = suture.load(lazy)
    assert_same(expected, restored)
    used = 2 * (width * width + width) * 4
    assert reading.bytes < used * 1.2  # "unused" (4x larger) and nothing else was read
    np.testing.assert_array_equal(
        restored["params"]["Dense_0"]["kernel"], new_state["params"]["Dense_0"]["kernel"]
    )


def test_value_fn_that_needs_concrete_arrays_is_traced_lazily(tmp_path: Path) -> None:
    save_standard(tmp_path / "ckpt", {"w": np.arange(12, dtype=np.float32).reshape(3, 4)})
    tree = suture.open(tmp_path / "ckpt").tree
    transforms = {
        "mean": T(original_key="w", value_fn=lambda v: jnp.mean(v, axis=0)),
        "root": T(original_key="w", value_fn=np.sqrt),
    }
    with count_bytes_read() as counted:
        result = suture.apply_transformations(tree, transforms, {"mean": ..., "root": ...})
    assert counted.bytes == 0
    assert isinstance(result["mean"], suture.LazyArray) and isinstance(
        result["root"], suture.LazyArray
    )
    np.testing.assert_allclose(result["mean"].read(), np.arange(12).reshape(3, 4).mean(0))
    np.testing.assert_allclose(
        result["root"].read(), np.sqrt(np.arange(12, dtype=np.float32).reshape(3, 4))
    )


def test_missing_original_key_names_it_and_suggests() -> None:
    with pytest.raises(
        suture.TransformError,
        match=r"maps new key 'b' to original key 'dense_O'.*Did you mean 'dense_0'",
    ):
        suture.apply_transformations({"dense_0": 1}, {"b": T(original_key="dense_O")}, {"b": ...})


def test_fallback_from_original_that_lacks_the_key() -> None:
    with pytest.raises(
        suture.TransformError, match=r"Key 'x' uses use_fallback.*original tree has no such key"
    ):
        suture.apply_transformations(
            {"a": 1}, {"x": T(use_fallback=True)}, {"x": 0}, default_to_original=False
        )


def test_contradictory_transform_is_an_error() -> None:
    with pytest.raises(
        suture.TransformError, match="original_key and use_fallback, which exclude each other"
    ):
        T(original_key="a", use_fallback=True)
    with pytest.raises(suture.TransformError, match="multi_value_fn and value_fn"):
        T(value_fn=abs, multi_value_fn=lambda k, t: 0)


def test_bad_regex_and_non_transform_leaves_are_errors() -> None:
    with pytest.raises(suture.TransformError, match=r"'\(' is not a valid regular expression"):
        suture.apply_transformations({"a": 1}, {"(": T()}, {"a": ...})
    with pytest.raises(
        suture.TransformError, match=r"transformations\['a'\] is a int, not a suture.Transform"
    ):
        suture.apply_transformations({"a": 1}, {"a": 3}, {"a": ...})


# Hypothesis: random trees and transformation sets, compared with Orbax.
names = st.sampled_from(["a", "b", "c", "dense_0", "dense_1", "w", "kernel"])
flat_trees = st.dictionaries(
    st.builds(lambda *parts: "/".join(parts), names, st.sampled_from(["", "x", "y"])).map(
        lambda k: k.rstrip("/")
    ),
    st.integers(-100, 100),
    min_size=1,
    max_size=6,
)


def _nested(flat: dict) -> dict:
    tree: dict = {}
    for key in sorted(flat, key=lambda k: k.count("/")):
        parts = key.split("/")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                return {}
        if parts[-1] in node:
            return {}
        node[parts[-1]] = flat[key]
    return tree


@st.composite
def cases(draw):
    original = _nested(draw(flat_trees))
    new = _nested(draw(flat_trees))
    keys = list(suture.flatten(original)) or ["a"]
    transforms = {}
    for new_key in draw(
        st.lists(st.sampled_from(list(suture.flatten(new)) or ["a"]), max_size=3, unique=True)
    ):
        kind = draw(st.sampled_from(["rename", "value", "fallback", "regex"]))
        if kind == "rename":
            transforms[new_key] = T(original_key=draw(st.sampled_from(keys)))
        elif kind == "value":
            transforms[new_key] = T(
                original_key=draw(st.sampled_from(keys)), value_fn=lambda v: v * 3 + 1
            )
        elif kind == "fallback":
            transforms[new_key] = T(use_fallback=True)
        else:
            transforms[r"(.*)"] = T(original_key=r"\1", value_fn=lambda v: -v)
    return original, transforms, new, draw(st.booleans())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(cases())
def test_random_transformations_match_orbax(case) -> None:
    original, transforms, new, default_to_original = case
    if not original or not new:
        return
    try:
        expected = ocp.apply_transformations(
            original,
            {
                k: ocp.Transform(
                    original_key=t.original_key, use_fallback=t.use_fallback, value_fn=t.value_fn
                )
                for k, t in transforms.items()
            },
            new,
            default_to_original=default_to_original,
        )
    except (ValueError, KeyError, TypeError):
        with pytest.raises(suture.SurgeryError):
            suture.apply_transformations(
                original, transforms, new, default_to_original=default_to_original
            )
        return
    actual = suture.apply_transformations(
        original, transforms, new, default_to_original=default_to_original
    )
    assert actual == expected
