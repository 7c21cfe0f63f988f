"""compressed-tensors exports without torch: blocks of rows, and the errors that stop them."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import suture
from suture._lazy.graph import MemorySource
from suture._quant.ct_math import pack_int32, quantize_int
from suture._quant.ct_nodes import ct_parts
from suture._quant.ct_scheme import ct_scheme


def test_streamed_blocks_equal_the_whole_tensor() -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((10, 64)).astype(ml_dtypes.bfloat16)
    parts = ct_parts(MemorySource(weight), ct_scheme("W4A16", 32), "w", None)
    values, scales = quantize_int(weight, 4, 32)
    packed = parts["weight_packed"]
    rows = [packed.read((range(a, min(10, a + 3)), range(8))) for a in range(0, 10, 3)]
    assert np.concatenate(rows).tobytes() == pack_int32(values, 4).tobytes()
    assert packed.input_selections((range(3, 6), range(8)))[0][1] == (range(3, 6), range(64))
    assert parts["weight_scale"].read((range(10), range(2))).tobytes() == scales.tobytes()
    assert parts["weight_shape"].read((range(2),)).tolist() == [10, 64]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"quantize": "int3"}, "Unknown quantize='int3'"),
        ({"quantize": "FP8_DYNAMIC", "group_size": 32}, "does not apply to FP8_DYNAMIC"),
        ({"quantize": "fp8-block", "group_size": 32}, "does not apply to fp8-block"),
        ({"quantize": "W4A16", "group_size": 0}, "expected a positive integer"),
        ({"quantize": "W4A16", "group_size": 48}, "divides it, such as 64, or keep"),
        ({"group_size": 32}, "go with quantize="),
    ],
)
def test_bad_quantize_arguments_say_what_to_do(tmp_path: Path, kwargs, message) -> None:
    tree = {"model": {"w": {"weight": np.ones((8, 64), ml_dtypes.bfloat16)}}}
    with pytest.raises(suture.SurgeryError) as error:
        suture.save(tree, tmp_path / "out", format="safetensors", progress=False, **kwargs)
    assert message in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["W4A16", "NVFP4A16", "FP8_DYNAMIC"])
def test_inf_and_nan_are_refused_naming_the_element(tmp_path: Path, name: str) -> None:
    weight = np.ones((8, 128), np.float32)
    weight[5, 7] = np.nan
    tree = {"model": {"w": {"weight": weight}}}
    with pytest.raises(suture.SurgeryError, match=r"'model.w.weight': element \(5, 7\) is nan"):
        suture.save(tree, tmp_path / "out", format="safetensors", quantize=name, progress=False)
    assert not (tmp_path / "out").exists()
