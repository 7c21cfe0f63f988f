"""Comparing suture's result with stock Orbax's: structure, leaf types, dtypes, values, shardings."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import suture


def assert_same_as_orbax(expected: Any, actual: Any) -> None:
    """`actual` (suture's) equals `expected` (Orbax's) in every way a caller can see.

    The tree structures are equal as jax sees them (containers, keys, None and empty
    nodes); each leaf has the same type, dtype, shape, values and, for jax.Arrays, sharding.
    Non-array leaves compare with ``==``.
    """
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    expected_leaves = jax.tree_util.tree_leaves_with_path(expected)
    actual_leaves = jax.tree.leaves(actual)
    for (key_path, want), got in zip(expected_leaves, actual_leaves, strict=True):
        where = jax.tree_util.keystr(key_path)
        if isinstance(got, suture.LazyArray):
            got = got.read()
        assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
        if isinstance(want, (np.ndarray, np.generic, jax.Array)):
            assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
            assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=where)
            if isinstance(want, jax.Array):
                assert got.sharding == want.sharding, f"{where}: {got.sharding} != {want.sharding}"
        else:
            assert got == want, f"{where}: {got!r} != {want!r}"
