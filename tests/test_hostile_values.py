"""Values that once came out wrong without a word: FP8 export of blocks holding inf, NaN, a
float64 beyond float32 or only tiny values, an MXFP4 scale byte 255 (E8M0's NaN), merges that
wrote inf or NaN, `suture.map` casting to its declared dtype, a Karcher mean that never
stopped, numpy's overflow warnings.

Each builds the input with the stock writers (safetensors, numpy), runs the Python API and
the command line, and checks the error or warning names the tensor or leaf and the fix,
that nothing is left behind and the source is unchanged; and that the valid neighbour of
the input still gives the same values as before.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import suture
from suture._merge import methods
from suture.cli import app
from tests.test_merge_config import hf_model

runner = CliRunner()
UP = "model.layers.0.mlp.up_proj.weight"
DOWN = "model.layers.0.mlp.down_proj.weight"


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(folder.rglob("*")):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


def _suture(*args: str) -> subprocess.CompletedProcess:
    """The `suture` command in its own process: its warnings print as ``Warning:`` lines."""
    return subprocess.run(
        [sys.executable, "-m", "suture", *args], capture_output=True, text=True, timeout=300
    )


def _hf_folder(folder: Path, tensors: dict[str, np.ndarray]) -> Path:
    folder.mkdir()
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "dtype": "float32"}))
    return folder


# --- item 3: FP8 export ---------------------------------------------------------------------


def _hostile_weight(dtype=np.float32) -> np.ndarray:
    weight = np.random.default_rng(3).standard_normal((300, 260)).astype(dtype)
    weight[5, 150] = np.inf  # block (0, 1)
    weight[200, 3] = np.nan  # block (1, 0)
    weight[256:, 256:] = 1e-40  # block (2, 2): only subnormals
    return weight


def test_fp8_export_keeps_finite_values_beside_inf_nan_and_subnormals(tmp_path: Path) -> None:
    """The finite values of a block holding inf or NaN, and a block of subnormals, come back
    close; inf and NaN are written as NaN, said once naming the tensor and the block; a
    normal tensor beside it is transformers' bytes exactly."""
    weight = _hostile_weight()
    normal = np.random.default_rng(4).standard_normal((256, 384)).astype(np.float32)
    source = _hf_folder(tmp_path / "hf", {UP: weight, DOWN: normal})
    before = _digest(source)
    with pytest.warns(
        suture.SutureWarning,
        match=rf"Tensor '{UP}': block \(row 0, column 1\) of 128x128 holds inf at element "
        r"\(5, 150\) .* written as NaN .*--strict-casts",
    ):
        suture.convert(source, tmp_path / "fp8", quantize="fp8-block", progress=False)
    back = suture.open(tmp_path / "fp8", dequantize=True, dequantize_dtype="float32")
    read = back[UP.replace(".", "/")].read()
    finite = np.isfinite(weight)
    assert np.isnan(read[~finite]).all()
    block = (np.abs(weight[:128, 128:256][np.isfinite(weight[:128, 128:256])])).max()
    assert np.abs(read[:128, 128:256] - weight[:128, 128:256])[finite[:128, 128:256]].max() < (
        block / 8
    )
    np.testing.assert_allclose(read[256:, 256:], weight[256:, 256:], rtol=0.1)
    stored = suture.open(tmp_path / "fp8")
    scales = stored[UP.replace(".", "/") + "_scale_inv"].read()
    assert np.isfinite(scales).all() and (scales > 0).all()
    torch = pytest.importorskip("torch", reason="the reference is transformers' torch code")
    from tests.test_quantized import as_numpy, reference_quantize  # needs torch

    values, expected = reference_quantize(torch.from_numpy(normal))
    assert stored[DOWN.replace(".", "/")].read().tobytes() == as_numpy(values).tobytes()
    assert stored[DOWN.replace(".", "/") + "_scale_inv"].read().tobytes() == (
        expected.numpy().tobytes()
    )
    assert _digest(source) == before


def test_fp8_export_of_a_float64_beyond_float32_saturates_and_says_so(tmp_path: Path) -> None:
    weight = np.random.default_rng(5).standard_normal((128, 128))
    weight[7, 9] = 1e39
    tree = {"model": {"layers": {"0": {"mlp": {"up_proj": {"weight": weight}}}}}}
    side = tmp_path / "config.json"
    side.write_text(json.dumps({"model_type": "llama"}))
    with pytest.warns(suture.SutureWarning, match=r"holds 1e\+39 at element \(7, 9\)"):
        suture.save(
            tree,
            tmp_path / "fp8",
            format="safetensors",
            quantize="fp8-block",
            extra_files={"config.json": side},
            progress=False,
        )
    back = suture.open(tmp_path / "fp8", dequantize=True, dequantize_dtype="float32")
    read = back[UP.replace(".", "/")].read()
    assert read[7, 9] == pytest.approx(float(np.finfo(np.float32).max), rel=1e-6)
    assert np.isfinite(read).all()


def test_fp8_export_with_strict_casts_refuses_unheld_values(tmp_path: Path) -> None:
    source = _hf_folder(tmp_path / "hf", {UP: _hostile_weight()})
    before = _digest(source)
    with pytest.raises(
        suture.LossyCastError,
        match=rf"Tensor '{UP}': block \(row 0, column 1\) of 128x128 holds inf at element "
        r"\(5, 150\) .* FP8 E4M3 has no infinity.*--keep-unquantized",
    ):
        suture.convert(
            source, tmp_path / "fp8", quantize="fp8-block", strict_casts=True, progress=False
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    result = _suture(
        "convert", str(source), str(tmp_path / "fp8"), "--quantize", "fp8-block", "--strict-casts"
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    assert f"Tensor '{UP}': block (row 0, column 1)" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert _digest(source) == before


def test_cli_fp8_export_says_once_which_block_it_could_not_hold(tmp_path: Path) -> None:
    source = _hf_folder(tmp_path / "hf", {UP: _hostile_weight()})
    result = _suture("convert", str(source), str(tmp_path / "fp8"), "--quantize", "fp8-block")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(said) == 1 and f"Tensor '{UP}': block (row 0, column 1)" in said[0]
    assert "RuntimeWarning" not in result.stderr
    scales = suture.open(tmp_path / "fp8")[UP.replace(".", "/") + "_scale_inv"].read()
    assert np.isfinite(scales).all()


def _tiny_weight() -> np.ndarray:
    """float64 with block (1, 0) of 128x128 below float32's smallest subnormal (a zero among
    them), block (0, 2) mixing such values with normal ones, block (1, 2) float32 subnormals."""
    weight = np.random.default_rng(7).standard_normal((256, 384))
    weight[128:, :128] = 1e-300
    weight[130, 4] = 0.0
    weight[:128, 256:][::2] = -1e-300
    weight[128:, 256:] = 1e-40
    return weight


def test_fp8_export_of_a_float64_block_below_float32_says_so(tmp_path: Path) -> None:
    """A block whose every nonzero value flushes to zero in float32 is written as 0 with a
    warning naming the tensor and the block, once; its neighbours keep their values."""
    weight = _tiny_weight()
    source = _hf_folder(tmp_path / "hf", {UP: weight})
    before = _digest(source)
    with pytest.warns(
        suture.SutureWarning,
        match=rf"Tensor '{UP}': block \(row 1, column 0\) of 128x128 holds 1e-300 at element "
        r"\(128, 0\) \(16383 such value\(s\) .* written as 0, as is every other value of that "
        r"block: .* round to 0 in float32 \(below its smallest subnormal, 1.401e-45\), .*"
        r"--strict-casts",
    ) as said:
        suture.convert(source, tmp_path / "fp8", quantize="fp8-block", progress=False)
    assert len([w for w in said if issubclass(w.category, suture.SutureWarning)]) == 1
    back = suture.open(tmp_path / "fp8", dequantize=True, dequantize_dtype="float32")
    read = back[UP.replace(".", "/")].read()
    assert not read[128:, :128].any()
    np.testing.assert_allclose(read[128:, 256:], weight[128:, 256:], rtol=0.1)
    np.testing.assert_allclose(read[:128], weight[:128], atol=0.3)
    scales = suture.open(tmp_path / "fp8")[UP.replace(".", "/") + "_scale_inv"].read()
    assert scales[1, 0] == 1.0 and np.isfinite(scales).all() and (scales > 0).all()
    assert _digest(source) == before


def test_fp8_export_with_strict_casts_refuses_a_block_below_float32(tmp_path: Path) -> None:
    source = _hf_folder(tmp_path / "hf", {UP: _tiny_weight()})
    before = _digest(source)
    with pytest.raises(
        suture.LossyCastError,
        match=rf"Tensor '{UP}': block \(row 1, column 0\) of 128x128 holds 1e-300 at element "
        r"\(128, 0\) .* every nonzero value of that block rounds to 0 in float32 \(below its "
        r"smallest subnormal, 1.401e-45\), .* write the whole block as 0\. Scale the values "
        r"up .*--keep-unquantized",
    ):
        suture.convert(
            source, tmp_path / "fp8", quantize="fp8-block", strict_casts=True, progress=False
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    result = _suture(
        "convert", str(source), str(tmp_path / "fp8"), "--quantize", "fp8-block", "--strict-casts"
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    assert f"Tensor '{UP}': block (row 1, column 0) of 128x128 holds 1e-300" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert _digest(source) == before


def test_cli_fp8_export_says_once_which_block_fell_below_float32(tmp_path: Path) -> None:
    source = _hf_folder(tmp_path / "hf", {UP: _tiny_weight()})
    result = _suture("convert", str(source), str(tmp_path / "fp8"), "--quantize", "fp8-block")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(said) == 1, result.stderr
    assert f"Tensor '{UP}': block (row 1, column 0) of 128x128 holds 1e-300" in said[0]
    assert "written as 0" in said[0] and "RuntimeWarning" not in result.stderr


def test_fp8_export_of_float64_that_float32_holds_is_transformers_bytes(tmp_path: Path) -> None:
    """Neighbours: tiny float64 values beside normal ones in a block (FP8 rounds them to 0
    as it rounds any value that small beside the block's largest), an all-zero block: no
    warning, even with strict casts, and the bytes of transformers' quantizer run on the
    float32 values."""
    weight = _tiny_weight()
    weight[128:, :128] = 0.0
    weight[128:, 256:] = np.random.default_rng(9).standard_normal((128, 128))
    source = _hf_folder(tmp_path / "hf", {UP: weight})
    with warnings.catch_warnings():
        warnings.simplefilter("error", suture.SutureWarning)
        suture.convert(
            source, tmp_path / "fp8", quantize="fp8-block", strict_casts=True, progress=False
        )
    stored = suture.open(tmp_path / "fp8")
    torch = pytest.importorskip("torch", reason="the reference is transformers' torch code")
    from tests.test_quantized import as_numpy, reference_quantize  # needs torch

    values, scales = reference_quantize(torch.from_numpy(weight.astype(np.float32)))
    assert stored[UP.replace(".", "/")].read().tobytes() == as_numpy(values).tobytes()
    assert stored[UP.replace(".", "/") + "_scale_inv"].read().tobytes() == (
        scales.numpy().tobytes()
    )


# --- MXFP4 scale byte 255 (E8M0's NaN) -----------------------------------------------------

EXPERTS = "model.layers.0.mlp.experts.gate_up_proj"


def _mxfp4_folder(folder: Path, damaged: int) -> tuple[Path, np.ndarray, np.ndarray]:
    """A gpt-oss-like MXFP4 folder whose scale [1, 5, 1] is `damaged`; that block's first
    bytes hold the codes 0, 0.5, -0.5 and 6 (low nibble first)."""
    rng = np.random.default_rng(8)
    blocks = rng.integers(0, 256, (2, 8, 2, 16), dtype=np.uint8)
    blocks[1, 5, 1, :2] = [0x10, 0x79]  # 0, 0.5, then -0.5, 6
    scales = rng.integers(118, 136, (2, 8, 2), dtype=np.uint8)
    scales[1, 5, 1] = damaged
    folder.mkdir()
    save_file(
        {f"{EXPERTS}_blocks": blocks, f"{EXPERTS}_scales": scales}, folder / "model.safetensors"
    )
    quantization = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(
        json.dumps(
            {"model_type": "gpt_oss", "dtype": "bfloat16", "quantization_config": quantization}
        )
    )
    return folder, blocks, scales


def _transformers_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch", reason="the reference is transformers' torch code")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    expected = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales))
    return expected.view(torch.int16).numpy().view(ml_dtypes.bfloat16)


def test_mxfp4_scale_byte_255_says_so_naming_tensor_block_and_byte(tmp_path: Path) -> None:
    """Byte 255 is read as transformers reads it (ldexp by 128: 0 stays 0, ±0.5 is ±2**127,
    the rest ±inf), said once naming the tensor, the block and the byte; a normal scale in
    its place is read exactly, without a word."""
    folder, blocks, scales = _mxfp4_folder(tmp_path / "mx", 255)
    opened = suture.open(folder, dequantize=True)
    with pytest.warns(
        suture.SutureWarning,
        match=rf"Tensor '{EXPERTS}': the scale of block \[1, 5, 1\] \({EXPERTS}_scales\[1, 5, 1\], "
        r"32 values\) is byte 255, E8M0's NaN .* first at element \(1, 32, 5\) .* damaged",
    ) as said:
        read = opened[EXPERTS.replace(".", "/")].read()
        opened[EXPERTS.replace(".", "/")][1, 32:64].read()
    assert len(said) == 1
    damaged = read[1, 32:64, 5].astype(np.float32)
    assert damaged[:4].tolist() == [0.0, 2.0**127, -(2.0**127), np.inf]
    assert (
        read.view(np.int16).tobytes()
        == _transformers_mxfp4(blocks, scales).view(np.int16).tobytes()
    )

    folder, blocks, scales = _mxfp4_folder(tmp_path / "valid", 130)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        valid = suture.open(folder, dequantize=True)[EXPERTS.replace(".", "/")].read()
    assert valid[1, 32:36, 5].astype(np.float32).tolist() == [0.0, 4.0, -4.0, 48.0]
    assert (
        valid.view(np.int16).tobytes()
        == _transformers_mxfp4(blocks, scales).view(np.int16).tobytes()
    )


def test_cli_dequantize_of_mxfp4_scale_byte_255_says_so_once(tmp_path: Path) -> None:
    folder, blocks, scales = _mxfp4_folder(tmp_path / "mx", 255)
    before = _digest(folder)
    out = tmp_path / "out"
    result = _suture("convert", str(folder), str(out), "--dequantize", "--format", "safetensors")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("Warning: ")]
    assert len(said) == 1, result.stderr
    assert f"Tensor '{EXPERTS}': the scale of block [1, 5, 1]" in said[0]
    assert "is byte 255, E8M0's NaN" in said[0] and "RuntimeWarning" not in result.stderr
    written = suture.open(out)[EXPERTS.replace(".", "/")].read()
    assert (
        written.view(np.int16).tobytes()
        == _transformers_mxfp4(blocks, scales).view(np.int16).tobytes()
    )
    assert _digest(folder) == before


# --- item 4: merges that would write inf or NaN ----------------------------------------------


def _pair(dtype=np.float32, value=1.0) -> tuple[dict, dict]:
    return {"w": np.full((4, 3), value, dtype)}, {"w": np.full((4, 3), -value / 2, dtype)}


@pytest.mark.parametrize(
    ("method", "weights", "params", "match"),
    [
        (
            "multislerp",
            [1, -1],
            {},
            r"Leaf 'w': multislerp merge weights sum to 0 and cannot be normalized; pass "
            r"normalize_weights=False, or change the weights \[1.0, -1.0\]",
        ),
        (
            "linear",
            [1e300, 1],
            {"normalize": False},
            r"Leaf 'w': the linear merge's weight of model 0 is 1e\+300, beyond the largest "
            r"float32 .* Use smaller weights",
        ),
    ],
)
def test_merge_weights_that_give_inf_or_nan_are_refused(method, weights, params, match) -> None:
    a, b = _pair()
    with pytest.raises(suture.MergeError, match=match):
        suture.merge([a, b], method, weights=weights, params=params)


def test_merged_block_that_overflows_is_refused_naming_leaf_and_method(tmp_path: Path) -> None:
    a, b = {"w": np.full(3, 60000, np.float16)}, {"w": np.full(3, 60000, np.float16)}
    merged = suture.merge([a, b], "linear", params={"normalize": False})
    with pytest.raises(
        suture.MergeError,
        match=r"Leaf 'w': 3 value\(s\) of a block are inf after the linear merge: the merged "
        r"values exceed the largest float16 .* dtype='float32'",
    ):
        suture.save(merged, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []
    nan = {"w": np.array([1.0, np.nan], np.float32)}
    with pytest.raises(suture.MergeError, match=r"model 1 already hold\(s\) inf or NaN"):
        suture.load(suture.merge([_pair()[0] | {"w": np.ones(2, np.float32)}, nan], "linear"))


def test_merge_neighbours_that_fit_still_merge_exactly() -> None:
    a, b = _pair()
    linear = suture.load(
        suture.merge([a, b], "linear", weights=[1, -0.5], params={"normalize": False})
    )
    np.testing.assert_array_equal(linear["w"], np.full((4, 3), 1.25, np.float32))
    half = suture.load(suture.merge([a, a], "multislerp", weights=[1, 1]))
    np.testing.assert_allclose(half["w"], a["w"], rtol=1e-6)
    wide = suture.load(
        suture.merge([a, b], "linear", weights=[1e30, 1e30], params={"normalize": False})
    )
    np.testing.assert_allclose(wide["w"], np.full((4, 3), 0.5e30, np.float32), rtol=1e-6)


@pytest.mark.parametrize(
    ("method", "first", "second", "match"),
    [
        ("multislerp", "weight: 1", "weight: -1", r"weights sum to 0 and cannot be normalized"),
        (
            "linear",
            "weight: 1.0e+300",
            "weight: 1",
            r"the linear merge's weight of model 0 is 1e\+300",
        ),
    ],
)
def test_cli_mergekit_config_with_weights_giving_inf_is_refused(
    tmp_path: Path, method: str, first: str, second: str, match: str
) -> None:
    hf_model(tmp_path / "a", 1)
    hf_model(tmp_path / "b", 2)
    before = _digest(tmp_path / "a") + _digest(tmp_path / "b")
    config = tmp_path / "mergekit.yml"
    config.write_text(
        f"merge_method: {method}\n"
        f"models:\n  - model: a\n    parameters: {{{first}}}\n"
        f"  - model: b\n    parameters: {{{second}}}\n"
        + ("parameters: {normalize: false}\n" if method == "linear" else "")
    )
    result = runner.invoke(
        app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"]
    )
    assert result.exit_code == 2, result.output
    assert "Error: " in result.stderr and "Leaf 'model/" in result.stderr
    assert re.search(match, result.stderr), result.stderr
    assert {p.name for p in tmp_path.iterdir()} <= {"a", "b", "mergekit.yml", "merge.toml"}
    assert _digest(tmp_path / "a") + _digest(tmp_path / "b") == before


def test_cli_mergekit_merge_that_overflows_float16_is_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        save_file(
            {"model.norm.weight": np.full(4, 60000, np.float16)}, folder / "model.safetensors"
        )
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    config = tmp_path / "mergekit.yml"
    config.write_text(
        "merge_method: linear\nparameters: {normalize: false}\n"
        "models:\n  - model: a\n    parameters: {weight: 1}\n"
        "  - model: b\n    parameters: {weight: 1}\n"
    )
    result = runner.invoke(
        app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"]
    )
    assert result.exit_code == 2, result.output
    assert "Leaf 'model/norm/weight': 4 value(s) of a block are inf after the linear merge" in (
        result.stderr
    )
    assert {p.name for p in tmp_path.iterdir()} <= {"a", "b", "mergekit.yml", "merge.toml"}


# --- item 6: suture.map's declared dtype ------------------------------------------------------


def test_map_declared_dtype_that_loses_values_is_refused(tmp_path: Path) -> None:
    tree = {"params": {"w": np.array([1, 3000, -5], np.int64)}}
    lazy = suture.LazyArray.from_array(tree["params"]["w"], path="params/w")
    narrowed = suture.map(lambda x: x, lazy, dtype="int8", shape=(3,))
    with pytest.raises(
        suture.LossyCastError,
        match=r"suture.map\(<lambda>\) of leaf 'params/w' returns int64 values, declared "
        r"dtype='int8': 1 value\(s\) .* the first 3000 becomes .* Declare dtype='int64'",
    ):
        suture.save({"w": narrowed}, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []
    # neighbours: a dtype that holds the values, and rounding to a lower-precision float
    wide = suture.map(lambda x: x, lazy, dtype="int16", shape=(3,))
    np.testing.assert_array_equal(wide.read(), np.array([1, 3000, -5], np.int16))
    floats = suture.LazyArray.from_array(np.array([1.00390625, 3.3], np.float32))
    rounded = suture.map(lambda x: x * 1, floats, dtype="bfloat16", shape=(2,))
    assert rounded.read().tobytes() == floats.read().astype(ml_dtypes.bfloat16).tobytes()


def test_cli_apply_with_a_map_whose_dtype_loses_values_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "src.safetensors"
    save_file({"params.w": np.array([1, 3000, -5], np.int64)}, source)
    recipe = tmp_path / "narrow.py"
    recipe.write_text(
        "import suture\n\n"
        "def transform(ckpt):\n"
        "    w = ckpt['params']['w']\n"
        "    return {'w': suture.map(lambda x: x * 1, w, dtype='int8', shape=w.shape)}\n"
    )
    before = source.read_bytes()
    out = tmp_path / "out.safetensors"
    result = _suture("apply", str(recipe), str(source), "-o", str(out), "--no-progress")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr
    assert "of leaf 'params/w' returns int64 values, declared dtype='int8'" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["narrow.py", "src.safetensors"]
    assert source.read_bytes() == before


# --- item 10: karcher's iterations and time ---------------------------------------------------


def test_karcher_absurd_max_iter_is_refused_and_time_is_bounded(monkeypatch) -> None:
    a, b = {"w": np.array([1.0, 0.0], np.float32)}, {"w": np.array([0.0, 1.0], np.float32)}
    with pytest.raises(
        suture.MergeError,
        match=r"karcher parameter 'max_iter' is 1000000000; at most 1000 iterations .* raise tol",
    ):
        suture.merge([a, b], "karcher", params={"max_iter": 1e9, "tol": 0})
    exact = suture.load(suture.merge([a, b], "karcher", params={"max_iter": 1000, "tol": 0}))
    np.testing.assert_allclose(exact["w"], [np.sqrt(0.5)] * 2, rtol=1e-6)
    monkeypatch.setattr(methods, "KARCHER_SECONDS", -1.0)
    with pytest.raises(
        suture.MergeError, match=r"Leaf 'w': karcher did not converge within -1 s .* Raise tol"
    ):
        suture.load(suture.merge([a, b], "karcher", params={"max_iter": 1000, "tol": 0}))


def test_cli_karcher_config_with_absurd_max_iter_is_refused(tmp_path: Path) -> None:
    hf_model(tmp_path / "a", 1)
    hf_model(tmp_path / "b", 2)
    config = tmp_path / "mergekit.yml"
    config.write_text(
        "merge_method: karcher\nparameters: {max_iter: 1.0e+9, tol: 0}\n"
        "models:\n  - model: a\n  - model: b\n"
    )
    result = _suture("merge", str(config), "-o", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 2, result.stderr
    assert "line 2 (parameters.max_iter)" in result.stderr
    assert "at most 1000 iterations" in result.stderr
    assert {p.name for p in tmp_path.iterdir()} <= {"a", "b", "mergekit.yml", "merge.toml"}
    own = tmp_path / "merge.toml"  # TOML reads 1e9 as a number, as suture's schema takes it
    own.write_text('method = "karcher"\nmodels = ["a", "b"]\n[params]\nmax_iter = 1e9\ntol = 0\n')
    result = _suture("merge", str(own), "-o", str(tmp_path / "out"), "--no-progress")
    assert result.returncode == 2, result.stderr
    assert "karcher parameter 'max_iter' is 1000000000; at most 1000" in result.stderr
    assert {p.name for p in tmp_path.iterdir()} <= {"a", "b", "mergekit.yml", "merge.toml"}


# --- minor: numpy's overflow warnings -----------------------------------------------------


def test_dequantizing_beyond_float16_says_so_once_naming_the_tensor(tmp_path: Path) -> None:
    folder = tmp_path / "fp8"
    folder.mkdir()
    weight = np.full((4, 4), 448.0, ml_dtypes.float8_e4m3fn)
    save_file(
        {"m.weight": weight, "m.weight_scale_inv": np.full((2, 2), 1000.0, np.float32)},
        folder / "model.safetensors",
    )
    quantization = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [2, 2]}
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": quantization})
    )
    opened = suture.open(folder, dequantize=True, dequantize_dtype="float16")
    with pytest.warns(
        suture.SutureWarning,
        match=r"Tensor 'm.weight': dequantizing to float16 gives 16 inf .* bfloat16 or float32",
    ) as said:
        opened["m/weight"].read()
        opened["m/weight"].read()
    assert len(said) == 1
