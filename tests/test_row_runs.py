"""A read of part of each row (the gate or up half of fused experts) reads those bytes only."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._iostats import count_bytes_read
from suture._lazy.selection import full
from suture.sources import filesource

EXPERTS, ROWS, COLUMNS = 6, 64, 96


@pytest.fixture
def fused(tmp_path: Path, monkeypatch) -> tuple[Path, np.ndarray]:
    monkeypatch.setattr(filesource, "MIN_RUN_BYTES", 1024)  # runs of this tiny tensor count
    values = np.random.default_rng(0).standard_normal((EXPERTS, ROWS, COLUMNS), np.float32)
    save_file({"gate_up": values}, str(tmp_path / "m.safetensors"))
    return tmp_path / "m.safetensors", values


@pytest.mark.parametrize(
    "index",
    [
        (slice(None), slice(0, 32)),
        (slice(1, 5), slice(32, 64)),
        (slice(None, None, -2), slice(8, 40)),
        (slice(2, 3), slice(0, 64)),
    ],
    ids=str,
)
def test_runs_of_rows_read_into_a_callers_array_are_numpys(fused, index) -> None:
    path, values = fused
    view = suture.open(path)["gate_up"][index]
    expected = values[index]
    plain = np.empty(expected.shape, np.float32)
    view.node.read_into(full(view.shape), plain)
    assert plain.tobytes() == expected.tobytes()
    swapped = view.transpose(0, 2, 1)  # each expert transposed and cast, as a recipe does
    out = np.empty(swapped.shape[:1] + swapped.shape[:0:-1], ml_dtypes.bfloat16)
    out = out.transpose(0, 2, 1)
    with count_bytes_read() as counter:
        swapped.astype("bfloat16").node.read_into(full(swapped.shape), out)
    assert out.tobytes() == expected.transpose(0, 2, 1).astype(ml_dtypes.bfloat16).tobytes()
    assert counter.bytes == expected.nbytes  # the runs only, not the whole rows


def test_a_save_of_the_gate_half_reads_that_half_once(fused, tmp_path: Path) -> None:
    path, values = fused
    gate = suture.open(path)["gate_up"][:, :32].transpose(0, 2, 1)
    planned = suture.plan(lambda tree: tree, {"wi_0": gate})
    with count_bytes_read() as counter:
        suture.save({"wi_0": gate}, tmp_path / "out", progress=False)
    assert values.nbytes // 2 <= counter.bytes < values.nbytes // 2 + 4096  # and the header
    assert planned.bytes_to_read == values.nbytes // 2  # the plan says so: not whole rows
    restored = np.asarray(suture.load(tmp_path / "out")["wi_0"])
    assert restored.tobytes() == values[:, :32].transpose(0, 2, 1).tobytes()


def test_short_runs_go_a_strip_of_whole_rows_at_a_time(fused) -> None:
    path, _ = fused
    source = suture.open(path)["gate_up"].node
    selection = (range(EXPERTS), range(0, 2), range(COLUMNS))  # 768 bytes a row: too short
    row = ROWS * COLUMNS * 4
    assert source.read_cost(selection, into=True).disk == EXPERTS * row
    selection = (range(EXPERTS), range(0, 32), range(COLUMNS))
    assert source.read_cost(selection, into=True).disk == EXPERTS * row // 2


def test_a_map_of_the_gate_half_reads_that_half_once(fused, tmp_path: Path) -> None:
    """A map reads its input with `read`, not `read_into`: it reads the runs too, as the
    plan counts them (it read whole rows, twice the plan's bytes)."""
    path, values = fused
    gate = suture.open(path)["gate_up"][:, :32].transpose(0, 2, 1)
    negated = suture.map(np.negative, gate, elementwise=True)
    planned = suture.plan(lambda tree: tree, {"wi_0": negated})
    with count_bytes_read() as counter:
        suture.save({"wi_0": negated}, tmp_path / "out", progress=False)
    assert planned.bytes_to_read == values.nbytes // 2
    assert values.nbytes // 2 <= counter.bytes < values.nbytes // 2 + 4096  # and the header
    restored = np.asarray(suture.load(tmp_path / "out")["wi_0"])
    assert restored.tobytes() == (-values[:, :32].transpose(0, 2, 1)).tobytes()
