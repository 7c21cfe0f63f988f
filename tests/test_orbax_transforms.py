"""Every scenario of Orbax's transform_utils tests: suture's result equals stock Orbax's.

Each case builds its inputs once per side, with ``orbax.checkpoint.Transform`` for Orbax and
``suture.Transform`` for suture, runs both, and compares the whole results (tree structure,
leaf types, dtypes, values). Where suture raises, Orbax raises too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn
from flax.training.train_state import TrainState
from orbax.checkpoint import transform_utils

import suture
from suture._iostats import count_bytes_read
from tests.orbax_compare import assert_same_as_orbax

logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax warns on every call of its API

ORIGINAL = {"a": 0, "b": 1, "c": {"a": 2, "e": 3}}


class Unset:
    """A leaf value of the new tree that only gives structure (never copied by either side)."""


def unset_like(tree):
    return jax.tree.map(lambda _: Unset(), tree)


def run_both(case, **kwargs):
    """Orbax's and suture's result of `case(T)` (T: each side's Transform class)."""
    original, transforms, new_tree = case(ocp.Transform)
    expected = ocp.apply_transformations(original, transforms, new_tree, **kwargs)
    original, transforms, new_tree = case(suture.Transform)
    actual = suture.apply_transformations(original, transforms, new_tree, **kwargs)
    return expected, actual


def rename(T):
    transforms = {
        "a1": T(original_key="a"),
        "c": {"a": T()},
        "e1": T(original_key="c/e"),
        "f": T(use_fallback=True),
        "ca1": T(original_key="c/a"),
        "ca2": T(original_key="c/a"),
    }
    new = {"a1": ..., "c": {"a": ...}, "e1": ..., "f": None, "g": 100, "ca1": ..., "ca2": ...}
    return ORIGINAL, transforms, new


def partial_transformation(T):
    transforms = {
        "a1": T(original_key="a"),
        "e1": T(original_key="c/e"),
        "e2": T(original_key="c/e"),
    }
    new = {"a": ..., "a1": ..., "c": {"a": ..., "e": ...}, "e1": ..., "e2": ..., "f": None, "g": 2}
    return ORIGINAL, transforms, new


def regex_with_back_references(T):
    original = {
        "a1": 1,
        "c": {"a2": {"d": 2}, "a3": 3},
        "d": {"e1": 2, "e2": 4},
        "f": {"e3": 6, "e4": {"a": 1}},
    }
    transforms = {
        r"(.*)x(\d.*)": T(original_key=r"\1a\2"),
        r"(.*)y(\d)": T(original_key=r"\1e\2", value_fn=lambda value: value * 2),
    }
    new = {"x1": 0, "c": {"x2": {"d": 0}, "x3": 0}, "d": {"y1": 0, "y2": 0}, "f": {"y3": 0}}
    return original, transforms, unset_like(new)


def named_groups(T):
    original = {"layers_0": {"w": np.arange(3)}, "layers_1": {"w": np.arange(3) + 10}}
    transforms = {r"block(?P<n>\d)/(?P<leaf>\w+)": T(original_key=r"layers_\g<n>/\g<leaf>")}
    return original, transforms, {"block0": {"w": ...}, "block1": {"w": ...}}


def partial_restore(T):
    return ORIGINAL, {"a": T(), "c": {"e": T()}}, unset_like({"a": 0, "c": {"e": 0}})


def multi_value_fn(T):
    transforms = {
        "a": T(multi_value_fn=lambda _, tree: tree["a"] * 2 + 20),
        "c": {"a": T(multi_value_fn=lambda _, tree: tree["c"]["a"] + tree["c"]["e"])},
        "w": T(multi_value_fn=lambda _, tree: tree["a"] + tree["b"]),
        "x": T(multi_value_fn=lambda _, tree: tree["a"] + tree["b"] * 2),
        "y": T(multi_value_fn=lambda _, tree: tree["a"]),
        "z": T(multi_value_fn=lambda key, tree: f"{key}:{tree['b']}"),
    }
    new = {"a": 0, "c": {"a": 0}, "w": 0, "x": 0, "y": 0, "z": 0}
    return ORIGINAL, transforms, unset_like(new)


def no_transform(T):
    return ORIGINAL, jax.tree.map(lambda _: T(), ORIGINAL), unset_like(ORIGINAL)


def last_matching_transform_wins(T):
    transforms = {"(.*)": T(original_key="a"), "b": T(original_key="c/e")}
    return ORIGINAL, transforms, {"b": ..., "q": ...}


@pytest.mark.parametrize(
    "case",
    [
        rename,
        partial_transformation,
        regex_with_back_references,
        named_groups,
        partial_restore,
        multi_value_fn,
        no_transform,
        last_matching_transform_wins,
    ],
)
def test_dict_scenarios(case) -> None:
    assert_same_as_orbax(*run_both(case))


def test_default_new_takes_unmatched_keys_from_the_new_tree() -> None:
    def case(T):
        transforms = {"a": T(use_fallback=True), "b1": T(original_key="b")}
        new = {"a": ..., "c": {"a": 10, "e": 11}, "b1": ..., "f": None, "g": 2}
        return ORIGINAL, transforms, new

    assert_same_as_orbax(*run_both(case, default_to_original=False))


def test_use_fallback_of_a_key_the_original_lacks() -> None:
    def case(T):
        return (
            ORIGINAL,
            {"f": T(use_fallback=True)},
            {"a": 2, "b": 3, "c": {"a": 7, "e": 8}, "f": 20},
        )

    assert_same_as_orbax(*run_both(case, default_to_original=True))
    with pytest.raises(ValueError):
        run_both(case, default_to_original=False)  # Orbax raises first
    with pytest.raises(suture.TransformError, match=r"Key 'f' uses use_fallback.*has no such key"):
        suture.apply_transformations(*case(suture.Transform), default_to_original=False)


def test_original_key_the_original_lacks() -> None:
    with pytest.raises(ValueError):
        ocp.apply_transformations({"a": 1}, {"b": ocp.Transform()}, {"b": ...})
    with pytest.raises(suture.TransformError, match=r"original key 'b'.*does not have"):
        suture.apply_transformations({"a": 1}, {"b": suture.Transform()}, {"b": ...})


@pytest.mark.parametrize(
    ("original", "new_tree"),
    [({}, {}), ({"a": 0, "b": 1}, {}), ({}, {"a": 1}), ({"a": 1}, None), ({"a": 1}, [])],
)
def test_empty_trees(original, new_tree) -> None:
    expected = ocp.apply_transformations(original, {}, new_tree)
    assert_same_as_orbax(expected, suture.apply_transformations(original, {}, new_tree))


BARE_LEAVES = [np.arange(3), jnp.arange(3), 7, 0, "test", 1.5]


@pytest.mark.parametrize("leaf", BARE_LEAVES, ids=repr)
def test_bare_leaves(leaf) -> None:
    assert_same_as_orbax(
        ocp.apply_transformations(leaf, {}, leaf), suture.apply_transformations(leaf, {}, leaf)
    )
    assert_same_as_orbax(transform_utils.merge_trees(leaf), suture.merge_trees(leaf))
    assert_same_as_orbax(
        transform_utils.intersect_trees(leaf, leaf), suture.intersect_trees(leaf, leaf)
    )


# Issue case 3: transformation trees that are not dicts.


class Pair(NamedTuple):
    first: object
    second: object


@flax.struct.dataclass
class Holder:
    kernel: object
    bias: object


@pytest.mark.parametrize("container", [list, tuple, "namedtuple", "dataclass"])
def test_transformation_trees_that_are_not_dicts(container) -> None:
    def build(first, second):
        if container == "namedtuple":
            return Pair(first, second)
        if container == "dataclass":
            return Holder(first, second)
        return container([first, second])

    def case(T):
        original = {"f": [10, 20], "h": {"k": np.ones(2), "b": np.zeros(2)}}
        transforms = {
            "g": build(T(original_key="f/1"), T(original_key="f/0")),
            "p": build(T(original_key="h/k"), T(original_key="h/b", value_fn=lambda v: v + 1)),
        }
        return original, transforms, {"g": build(0, 0), "p": build(..., ...)}

    assert_same_as_orbax(*run_both(case))


def test_whole_transformation_tree_as_a_list() -> None:
    def case(T):
        return {"f": [10, 20]}, [T(original_key="f/1"), T(original_key="f/0")], [0, 0]

    assert_same_as_orbax(*run_both(case))


def test_flax_struct_trees_with_lists_and_fallbacks() -> None:
    @flax.struct.dataclass
    class SubTree:
        x: dict
        y: list

    @flax.struct.dataclass
    class Tree:
        a: int
        b: np.ndarray
        c: SubTree

    @flax.struct.dataclass
    class NewTree:
        a1: int
        b: np.ndarray
        c: SubTree
        d: float
        e: int
        f: list

    tree = Tree(a=10, b=np.arange(3), c=SubTree(x={"i": 0, "j": 1}, y=[4, 5, 6]))

    def case(T):
        transforms = NewTree(
            a1=T(original_key="a"),
            b=T(multi_value_fn=lambda _, t: t.b * 2),
            c=jax.tree.map(lambda _: T(), tree.c),
            d=T(use_fallback=True),
            e=T(multi_value_fn=lambda _, t: t.c.y[0]),
            f=[T(multi_value_fn=lambda _, t: t.c.y[1]), T(multi_value_fn=lambda _, t: t.c.y[2])],
        )
        new = NewTree(
            a1=Unset(),
            b=Unset(),
            c=SubTree(x={"i": Unset(), "j": Unset()}, y=[Unset(), Unset(), Unset()]),
            d=7,
            e=Unset(),
            f=[Unset(), Unset()],
        )
        return tree, transforms, new

    expected, actual = run_both(case)
    assert isinstance(actual, NewTree)
    assert_same_as_orbax(expected, actual)


# Issue case 4: a dataclass jax does not register is a leaf.


@dataclasses.dataclass
class Config:
    learning_rate: float = 0.1
    name: str = "base"


def test_unregistered_dataclasses_are_leaves_copied_whole() -> None:
    def case(T):
        original = {"config": Config(0.3, "old"), "w": np.arange(2)}
        transforms = {"settings": T(original_key="config")}
        return original, transforms, {"config": ..., "settings": ..., "w": ..., "new": Config()}

    expected, actual = run_both(case)
    assert_same_as_orbax(expected, actual)
    assert actual["config"] == Config(0.3, "old") and actual["new"] == Config()


def test_value_fn_on_an_unregistered_dataclass_gets_the_whole_object() -> None:
    def case(T):
        transforms = {"config": T(value_fn=lambda c: dataclasses.replace(c, name="new"))}
        return {"config": Config(0.3, "old")}, transforms, {"config": ...}

    assert_same_as_orbax(*run_both(case))


# Flax TrainState, as Orbax's tests use it.


class SmallModel(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(features=4)(x)
        return nn.Dense(features=4)(nn.sigmoid(x))


class LargeModel(nn.Module):
    @nn.compact
    def __call__(self, x):
        for features in (8, 4, 4):
            x = nn.sigmoid(nn.Dense(features=features)(x))
        return nn.Dense(features=2)(x)


def train_state(model, seed: int = 0):
    params = model.init(jax.random.PRNGKey(seed), jnp.ones([2, 3]))
    state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
    return jax.tree.map(np.asarray, state)


def test_flax_train_state_inserting_a_layer() -> None:
    old_state, new_state = train_state(SmallModel()), train_state(LargeModel(), seed=1)

    def case(T):
        transforms = {
            r"(.*)Dense_0(.*)": T(use_fallback=True),
            r"(.*)Dense_1(.*)": T(original_key=r"\1Dense_0\2"),
            r"(.*)Dense_2(.*)": T(original_key=r"\1Dense_1\2"),
        }
        return old_state, transforms, new_state

    expected, actual = run_both(case)
    assert_same_as_orbax(expected, actual)
    assert isinstance(actual, TrainState)
    assert isinstance(actual.opt_state[1], optax.EmptyState)  # adamw's empty states kept


def test_flax_train_state_default_new() -> None:
    old_state, new_state = train_state(LargeModel()), train_state(LargeModel(), seed=1)

    def case(T):
        return old_state, {r"(.*)Dense_1(.*)": T(use_fallback=True)}, new_state

    assert_same_as_orbax(*run_both(case, default_to_original=False))


# Issue case 8: merge_trees and intersect_trees.

ONE = {"a": 1, "b": {"c": 2, "d": 3}}
TWO = {"a": 2, "b": {"c": 4, "e": 6}}
FOUR = {"f": 7, "g": 8}


def test_merge_trees() -> None:
    trees = (ONE, TWO, {}, FOUR)
    assert_same_as_orbax(transform_utils.merge_trees(*trees), suture.merge_trees(*trees))
    assert_same_as_orbax(transform_utils.merge_trees({}, {}), suture.merge_trees({}, {}))
    assert_same_as_orbax(transform_utils.merge_trees(), suture.merge_trees())
    lists = ({"a": [1, 2], "n": None}, {"a": [3]})
    assert_same_as_orbax(transform_utils.merge_trees(*lists), suture.merge_trees(*lists))


def test_merge_trees_into_a_target() -> None:
    @flax.struct.dataclass
    class Expected:
        a: int
        b: dict
        f: int
        g: int

    target = Expected(a=0, b={"c": 0, "d": 0, "e": 0}, f=0, g=0)
    expected = transform_utils.merge_trees(ONE, TWO, {}, FOUR, target=target)
    actual = suture.merge_trees(ONE, TWO, {}, FOUR, target=target)
    assert isinstance(actual, Expected)
    assert_same_as_orbax(expected, actual)
    smaller = {"a": 0}  # paths the target leaves out are dropped, in both
    assert_same_as_orbax(
        transform_utils.merge_trees(ONE, TWO, target=smaller),
        suture.merge_trees(ONE, TWO, target=smaller),
    )


def test_merge_trees_target_path_no_tree_has() -> None:
    with pytest.raises(KeyError):
        transform_utils.merge_trees(ONE, target={"a": 0, "z": 0})
    with pytest.raises(suture.MissingLeafError, match="target has a leaf at 'z', which none"):
        suture.merge_trees(ONE, target={"a": 0, "z": 0})


def test_intersect_trees() -> None:
    assert_same_as_orbax(
        transform_utils.intersect_trees(ONE, TWO), suture.intersect_trees(ONE, TWO)
    )
    assert_same_as_orbax(
        transform_utils.intersect_trees(ONE, TWO, target={"a": 0, "b": {"c": 0}}),
        suture.intersect_trees(ONE, TWO, target={"a": 0, "b": {"c": 0}}),
    )
    with pytest.raises(TypeError):
        transform_utils.intersect_trees()
    with pytest.raises(suture.TransformError, match="needs at least one tree"):
        suture.intersect_trees()


def test_merge_trees_of_lazy_trees_reads_nothing(tmp_path) -> None:
    ocp.PyTreeCheckpointer().save(tmp_path / "a", {"w": np.arange(4.0), "b": np.ones(2)})
    ocp.PyTreeCheckpointer().save(tmp_path / "b", {"w": np.zeros(4)})
    first, second = suture.open(tmp_path / "a").tree, suture.open(tmp_path / "b").tree
    with count_bytes_read() as counted:
        merged = suture.merge_trees(first, second)
    assert counted.bytes == 0
    assert isinstance(merged["w"], suture.LazyArray)
    np.testing.assert_array_equal(suture.load(merged)["w"], np.zeros(4))


def test_load_and_transform_with_a_list_of_transforms(tmp_path) -> None:
    tree = {"f": [np.arange(3), np.arange(3) + 10]}
    ocp.PyTreeCheckpointer().save(tmp_path / "ckpt", tree)
    orbax_transforms = [ocp.Transform(original_key="f/1"), ocp.Transform(original_key="f/0")]
    expected = ocp.apply_transformations(tree, orbax_transforms, [0, 0])
    transforms = [suture.Transform(original_key="f/1"), suture.Transform(original_key="f/0")]
    actual = suture.load_and_transform(transforms, tmp_path / "ckpt", target=[..., ...])
    assert_same_as_orbax(expected, actual)


def test_what_placeholder_means_in_each_context(tmp_path) -> None:
    """Issue case 10, as docs/coming-from-orbax.md defines it (each context against Orbax)."""
    from orbax.checkpoint import v1 as ocp_v1

    from suture import rules

    tree = {"a": np.arange(3), "b": np.ones(2)}
    path = tmp_path / "ckpt"
    ocp_v1.save(path, tree)
    restored = ocp_v1.load(path)

    # 1. A target of load: "do not read"; comes back as `...`.
    target = {"a": ..., "b": np.ndarray}
    assert_same_as_orbax(ocp_v1.load(path, target), suture.load(path, target))

    # 2. A new_tree of apply_transformations: structure only; unfilled leaves stay `...`.
    new_tree = {"c": ..., "b": ..., "z": ...}
    expected = ocp.apply_transformations(restored, {"c": ocp.Transform(original_key="a")}, new_tree)
    transforms = {"c": suture.Transform(original_key="a")}
    assert_same_as_orbax(expected, suture.apply_transformations(restored, transforms, new_tree))

    # 3. target= of load_and_transform: Orbax's new_tree with a transformations tree ...
    actual = suture.load_and_transform(transforms, path, target=new_tree)
    assert_same_as_orbax(expected, actual)
    # ... and a restore target with rules: "do not read".
    renamed = suture.load_and_transform([rules.rename("a", "c")], path, target={"c": ..., "b": N})
    assert_same_as_orbax(
        ocp_v1.load(path, {"a": ..., "b": N}), {"a": renamed["c"], "b": renamed["b"]}
    )

    # 4. A result: a value_fn returning `...` gives a leaf holding `...`.
    to_placeholder = {"c": ocp.Transform(original_key="a", value_fn=lambda _: ...)}
    expected = ocp.apply_transformations(restored, to_placeholder, {"c": 0})
    ours = {"c": suture.Transform(original_key="a", value_fn=lambda _: ...)}
    assert_same_as_orbax(expected, suture.load_and_transform(ours, path, target={"c": 0}))


N = np.ndarray
