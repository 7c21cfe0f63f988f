"""flatten / unflatten: Orbax's key spelling, every container kind, and round trips."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct
from flax.core import FrozenDict
from hypothesis import given, settings
from hypothesis import strategies as st
from orbax.checkpoint import tree as orbax_tree

import suture


class AdamLike(NamedTuple):
    count: int
    mu: dict
    nu: dict


@dataclasses.dataclass
class Plain:
    weight: np.ndarray
    extra: list


@struct.dataclass
class FlaxState:
    params: dict
    step: int
    name: str = struct.field(pytree_node=False, default="model")


def test_keys_are_spelled_like_orbax_flat_keys() -> None:
    tree = {"params": {"dense": {"kernel": 1, "bias": 2}}, "opt_state": [{"mu": 3}, (4, 5)]}
    expected = orbax_tree.to_flat_dict(tree, sep="/")
    assert suture.flatten(tree) == expected


def test_keys_match_jax_keystr_for_every_container() -> None:
    tree = {
        "adam": AdamLike(count=1, mu={"w": 2}, nu={"w": 3}),
        "frozen": FrozenDict({"a": {"b": 4}}),
        "flax": FlaxState(params={"w": 5}, step=6),
        "list": [7, (8, 9)],
    }
    via_jax = {
        jax.tree_util.keystr(path, simple=True, separator="/"): leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }
    assert suture.flatten(tree) == via_jax


def test_registered_dataclasses_are_nodes_and_unregistered_ones_leaves_as_in_orbax() -> None:
    plain = Plain(np.zeros(1), [1])
    tree = {"plain": plain, "flax": FlaxState({"w": 1}, 2)}
    flat = suture.flatten(tree)
    assert flat == orbax_tree.to_flat_dict(tree, sep="/")
    assert list(flat) == ["plain", "flax/params/w", "flax/step"]  # static fields are not keys
    assert flat["plain"] is plain


def test_nnx_state_flattens_like_orbax_saves_it() -> None:
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    flat = suture.flatten(state)
    assert set(flat) == {"kernel/value", "bias/value"}
    rebuilt = suture.unflatten(flat, like=state)
    assert isinstance(rebuilt, nnx.State)
    np.testing.assert_array_equal(rebuilt["kernel"][...], state["kernel"][...])


def test_unflatten_like_restores_containers() -> None:
    tree = {
        "adam": AdamLike(count=1, mu={"w": 2}, nu={"w": 3}),
        "frozen": FrozenDict({"a": {"b": 4}}),
        "flax": FlaxState(params={"w": 5}, step=6, name="kept"),
        "plain": Plain(weight=7, extra=[8, 9]),
        "tuple": (10, [11]),
    }
    rebuilt = suture.unflatten(suture.flatten(tree), like=tree)
    assert rebuilt == tree
    assert isinstance(rebuilt["adam"], AdamLike)
    assert isinstance(rebuilt["frozen"], FrozenDict)
    assert rebuilt["flax"].name == "kept"


def test_unflatten_without_template_gives_nested_dicts() -> None:
    assert suture.unflatten({"a/0": 1, "a/1": 2, "b": 3}) == {"a": {"0": 1, "1": 2}, "b": 3}
    assert suture.unflatten({"a.b": 1}, sep=".") == {"a": {"b": 1}}


def test_leaf_that_is_also_a_subtree_is_an_error() -> None:
    with pytest.raises(suture.SurgeryError, match="both a leaf and a subtree"):
        suture.unflatten({"a/b": 1, "a": 2})
    with pytest.raises(suture.SurgeryError, match=r"goes through 'a', which is also a leaf"):
        suture.unflatten({"a": 2, "a/b": 1})


def test_key_containing_the_separator_is_an_error() -> None:
    with pytest.raises(suture.SurgeryError, match=r"a key contains the separator '/'.*sep="):
        suture.flatten({"a/b": 1, "a": {"b": 2}})


def test_unflatten_like_reports_missing_and_extra_paths() -> None:
    with pytest.raises(suture.MissingLeafError, match=r"leaf at 'a/c'.*Did you mean 'a/b'"):
        suture.unflatten({"a/b": 1}, like={"a": {"c": 0}})
    with pytest.raises(suture.SurgeryError, match=r"1 path\(s\) are not in the template, e.g. 'z'"):
        suture.unflatten({"a": 1, "z": 2}, like={"a": 0})


def test_empty_containers_and_none_are_kept() -> None:
    tree = {"empty": {}, "none": None, "items": [], "x": 1}
    assert suture.flatten(tree) == tree
    assert suture.unflatten(suture.flatten(tree)) == tree


def test_arrays_and_shape_structs_are_leaves() -> None:
    tree = {
        "np": np.zeros((2, 2)),
        "jax": jnp.ones(3),
        "sds": jax.ShapeDtypeStruct((2,), np.float32),
    }
    assert list(suture.flatten(tree)) == ["np", "jax", "sds"]


keys = st.text(alphabet="abcxyz_019", min_size=1, max_size=6)
leaves = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=4), st.none())


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.dictionaries(keys, children, min_size=1, max_size=4),
        st.lists(children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3).map(tuple),
        st.tuples(children, st.dictionaries(keys, children, min_size=1, max_size=2), children).map(
            lambda t: AdamLike(*t)
        ),
    )


trees = st.recursive(leaves, _containers, max_leaves=20)
nested_dicts = st.recursive(
    leaves, lambda c: st.dictionaries(keys, c, min_size=1, max_size=4), max_leaves=20
)


@settings(max_examples=200, deadline=None)
@given(trees)
def test_round_trip_with_template(tree) -> None:
    assert suture.unflatten(suture.flatten(tree), like=tree) == tree


@settings(max_examples=200, deadline=None)
@given(nested_dicts, st.sampled_from(["/", ".", "|"]))
def test_round_trip_of_nested_dicts(tree, sep) -> None:
    assert suture.unflatten(suture.flatten(tree, sep=sep), sep=sep) == tree


@settings(max_examples=200, deadline=None)
@given(trees)
def test_flat_keys_equal_jax_keystr(tree) -> None:
    via_jax = [
        jax.tree_util.keystr(path, simple=True, separator="/")
        for path, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)[0]
    ]
    assert sorted(suture.flatten(tree)) == sorted(via_jax)
