"""Leaves a save once could not write: complex numbers, whose zarr3 fill value is a pair of
parts (a raw TensorStore error before); stock Orbax restores what suture writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp

import suture


def test_complex_leaves_are_written_and_restore_in_stock_orbax(tmp_path: Path) -> None:
    tree = {
        "c": np.array([1 + 1j, 2 - 3j, -0.0 + 0j], np.complex64),
        "z": np.array([[1e300 - 1j]], np.complex128),
    }
    suture.save(tree, tmp_path / "ckpt", progress=False)
    for restored in (
        suture.load(tmp_path / "ckpt"),
        ocp.StandardCheckpointer().restore(tmp_path / "ckpt"),
    ):
        for name, values in tree.items():
            assert restored[name].dtype == values.dtype
            np.testing.assert_array_equal(restored[name], values)
