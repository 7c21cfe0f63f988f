"""`max_memory` is a promise: the blocks in flight never hold more than the budget.

A matrix of Orbax and safetensors sources (written by orbax-checkpoint and safetensors) x
surgeries (plain, stacked, transposed, column slice, concat, map, merge) x budgets. Each
save reports the most bytes its blocks held at once (`SaveResult.peak_in_flight`), which
must stay within the budget; numpy's own allocations (traced by tracemalloc) must too,
give or take a small constant; and the values must be right.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from safetensors.numpy import save_file

import suture
from suture import rules
from suture._exec.runner import Budget
from suture._format import parse_bytes
from suture._iostats import count_bytes_read
from tests.orbax_writers import save_standard

LAYERS = 4


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tree = {"embed": rng.standard_normal((512, 96), dtype=np.float32)}
    for i in range(LAYERS):
        tree[f"layers.{i}.w"] = rng.standard_normal((160, 96), dtype=np.float32)
        tree[f"layers.{i}.b"] = rng.standard_normal(96, dtype=np.float32)
    return tree


def write_source(kind: str, folder: Path, seed: int = 0) -> Path:
    flat = model(seed)
    if kind == "safetensors":
        path = folder / f"model{seed}.safetensors"
        save_file(flat, str(path))
        return path
    path = folder / f"orbax{seed}"
    tree: dict[str, Any] = {"embed": flat["embed"], "layers": {}}
    for i in range(LAYERS):
        tree["layers"][str(i)] = {"w": flat[f"layers.{i}.w"], "b": flat[f"layers.{i}.b"]}
    save_standard(path, tree)
    return path


def plain(ckpt: Any, _: Any) -> tuple[Any, Callable[[dict], dict]]:
    return ckpt, lambda flat: flat


def stacked(ckpt: Any, _: Any) -> tuple[Any, Callable[[dict], dict]]:
    surgery = [
        rules.stack(r"layers/(?P<i>\d+)/w", into="stacked/w"),
        rules.stack(r"layers/(?P<i>\d+)/b", into="stacked/b"),
        rules.cast(".*", "bfloat16"),
    ]
    expected = {
        "stacked/w": np.stack([model()[f"layers.{i}.w"] for i in range(LAYERS)]),
        "stacked/b": np.stack([model()[f"layers.{i}.b"] for i in range(LAYERS)]),
    }
    return suture.transform(surgery, ckpt), lambda _: {
        "embed": model()["embed"].astype(ml_dtypes.bfloat16),
        **{k: v.astype(ml_dtypes.bfloat16) for k, v in expected.items()},
    }


def transposed(ckpt: Any, _: Any) -> tuple[Any, Callable[[dict], dict]]:
    tree = {"embed_t": ckpt["embed"].T.astype("bfloat16")}
    return tree, lambda flat: {"embed_t": flat["embed"].T.astype(ml_dtypes.bfloat16)}


def column_slice(ckpt: Any, _: Any) -> tuple[Any, Callable[[dict], dict]]:
    tree = {"part": ckpt["embed"][:, 8:40], "strided": ckpt["embed"][::-3, ::5]}
    return tree, lambda flat: {
        "part": flat["embed"][:, 8:40],
        "strided": flat["embed"][::-3, ::5],
    }


def concat(ckpt: Any, _: Any) -> tuple[Any, Callable[[dict], dict]]:
    layers = [ckpt[f"layers/{i}/w"] for i in range(LAYERS)]
    tree = {"fused": suture.concatenate(layers, axis=1)}
    return tree, lambda flat: {
        "fused": np.concatenate([flat[f"layers.{i}.w"] for i in range(LAYERS)], axis=1)
    }


def mapped(ckpt: Any, _: Any) -> tuple[Any, Callable[[dict], dict]]:
    tree = {
        "scaled": suture.map(lambda x: x * 2, ckpt["embed"], elementwise=True),
        "normed": suture.map(
            lambda x: x / np.linalg.norm(x), ckpt["layers/0/w"], shape=(160, 96), dtype="float32"
        ),
    }
    return tree, lambda flat: {
        "scaled": flat["embed"] * 2,
        "normed": flat["layers.0.w"] / np.linalg.norm(flat["layers.0.w"]),
    }


def merged(ckpt: Any, other: Any) -> tuple[Any, Callable[[dict], dict]]:
    tree = suture.merge([ckpt, other], "linear")
    second = model(1)
    return tree, lambda flat: {name: (value + second[name]) / 2 for name, value in flat.items()}


SURGERIES = [plain, stacked, transposed, column_slice, concat, mapped, merged]
BUDGETS = ["1MiB", "4MiB", "64MiB"]


@pytest.fixture(scope="module", params=["orbax", "safetensors"])
def sources(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp(request.param)
    return (
        request.param,
        write_source(request.param, folder),
        write_source(request.param, folder, 1),
    )


def by_name(tree: dict) -> dict[str, np.ndarray]:
    return {
        path.replace("/", "."): np.asarray(value) for path, value in suture.flatten(tree).items()
    }


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("surgery", SURGERIES, ids=lambda surgery: surgery.__name__)
def test_blocks_in_flight_stay_within_the_budget(
    sources: tuple, surgery: Callable, budget: str, tmp_path: Path
) -> None:
    kind, first, second = sources
    tree, expect = surgery(suture.open(first), suture.open(second))
    limit = parse_bytes(budget)
    tracemalloc.start()
    try:
        result = suture.save(tree, tmp_path / "out", max_memory=budget, progress=False)
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < result.peak_in_flight <= limit
    # numpy's allocations (TensorStore's own are not traced): the budget, plus the
    # per-thread tiles and Python's bookkeeping
    assert traced_peak <= limit + (2 << 20), (traced_peak, limit)
    wanted = {name.replace("/", "."): value for name, value in expect(model()).items()}
    got = by_name(suture.load(tmp_path / "out"))
    assert sorted(got) == sorted(wanted)
    for name, value in wanted.items():
        np.testing.assert_allclose(
            got[name].astype(np.float64), np.asarray(value).astype(np.float64), rtol=1e-6
        )


def test_a_block_costs_what_its_column_read_holds(tmp_path: Path) -> None:
    """A transposed safetensors leaf reads whole rows: the plan and the budget count them."""
    path = tmp_path / "model.safetensors"
    save_file({"lm_head": np.ones((2048, 256), np.float32)}, str(path))
    head = suture.open(path)["lm_head"]
    column = head.T[:4]  # four columns of the stored tensor: every row is read
    with count_bytes_read() as counter:
        column.read()
    assert counter.bytes == 2048 * 256 * 4
    planned = suture.plan(lambda tree: tree, {"c": column})
    assert planned.bytes_to_read == counter.bytes
    result = suture.save({"t": head.T.astype("bfloat16")}, tmp_path / "out", max_memory="8MiB")
    assert counter.bytes <= result.peak_in_flight <= 8 << 20  # the rows read were counted


def test_a_transposed_leaf_is_read_once_when_it_fits_the_budget(tmp_path: Path) -> None:
    """Blocks of rows of a transposed safetensors leaf would be column strips of the stored
    tensor, each reading every row: it is read once (in chunks of its columns, or as one
    block when its chunks cannot be cut so)."""
    path = tmp_path / "model.safetensors"
    stored = np.random.default_rng(0).standard_normal((2048, 512), np.float32)
    save_file({"lm_head": stored}, str(path))
    head = suture.open(path)["lm_head"]
    with count_bytes_read() as counter:
        result = suture.save(
            {"t": head.T.astype("bfloat16")}, tmp_path / "out", max_memory="16MiB", progress=False
        )
    # blocks of a thread's share of the budget would read it 2-4 times; the rest is the header
    assert stored.nbytes <= counter.bytes < stored.nbytes + 4096
    assert 0 < result.peak_in_flight <= 16 << 20
    np.testing.assert_array_equal(
        np.asarray(suture.load(tmp_path / "out")["t"]), stored.T.astype(ml_dtypes.bfloat16)
    )


def test_a_transposed_matrix_larger_than_a_block_is_chunked_in_tiles(tmp_path: Path) -> None:
    """MaxText's `logits_dense` is HF's `lm_head` turned around. Chunked by rows, each block
    would read the whole source, so the leaf ran as one block of the whole budget, alone:
    in tiles (a quarter of its rows, a few columns), it is blocks of columns beside each
    other, each reading its own rows of the source."""
    path = tmp_path / "model.safetensors"
    stored = np.random.default_rng(0).standard_normal((4096, 256), np.float32)  # 4 MiB
    save_file({"lm_head": stored}, str(path))
    kernel = suture.open(path)["lm_head"].T  # (256, 4096)
    with count_bytes_read() as counter:
        result = suture.save({"t": kernel}, tmp_path / "out", max_memory="2MiB", progress=False)
    assert stored.nbytes <= counter.bytes < stored.nbytes + 16384  # each row read once
    assert 0 < result.peak_in_flight <= 2 << 20  # blocks of half the leaf at most
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "ocdbt", "base": f"file://{tmp_path / 'out'}", "path": "t"},
    }
    grid = ts.open(spec).result().spec().to_json()["metadata"]["chunk_grid"]
    rows, columns = grid["configuration"]["chunk_shape"]
    assert rows == 64 and columns < 4096  # a quarter of the rows: restores split rows
    np.testing.assert_array_equal(np.asarray(suture.load(tmp_path / "out")["t"]), stored.T)


@pytest.mark.parametrize("verify", [False, True])
def test_layers_stacked_on_axis_1_are_read_once(tmp_path: Path, verify: bool) -> None:
    """MaxText's layout: each layer's kernel transposed, stacked on axis 1. Blocks of rows
    would be column strips of every layer (each reading the whole layer); blocks of whole
    layers along the stacking axis read each layer once."""
    layers = {
        f"w.{i}": np.random.default_rng(i).standard_normal((512, 384), np.float32)
        for i in range(12)
    }
    save_file(layers, str(tmp_path / "model.safetensors"))
    ckpt = suture.open(tmp_path / "model.safetensors")
    tree = {
        "kernel": suture.stack([ckpt[f"w/{i}"].T for i in range(12)], axis=1).astype("bfloat16")
    }
    with count_bytes_read() as counter:
        result = suture.save(
            tree, tmp_path / "out", max_memory="2MiB", verify=verify, progress=False
        )
    stored = sum(layer.nbytes for layer in layers.values())
    # the header, and with `verify` the (bfloat16, compressed) output read back: under half
    assert stored <= counter.bytes < stored + (64 << 10) + (stored // 2 if verify else 0)
    assert 0 < result.peak_in_flight <= 2 << 20
    expected = np.stack([layers[f"w.{i}"].T for i in range(12)], axis=1)
    np.testing.assert_array_equal(
        np.asarray(suture.load(tmp_path / "out")["kernel"]), expected.astype(ml_dtypes.bfloat16)
    )


def test_a_stack_of_mapped_layers_counts_one_map_at_a_time(tmp_path: Path) -> None:
    """MaxText's query kernel: per layer ``(w.T).reshape(...) / sqrt(d)``, stacked on axis 1.

    The layers are computed one after another, so a block holds one layer's map working
    memory, not one per layer at the size of the whole block (which made the block cost
    many times the budget and run alone, outside it).
    """
    layers, heads, head_dim, width = 8, 4, 16, 96
    rng = np.random.default_rng(0)
    shape = (heads * head_dim, width)
    tensors = {f"q.{i}": rng.standard_normal(shape).astype("float16") for i in range(layers)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    ckpt = suture.open(tmp_path / "model.safetensors")

    def scaled(values: np.ndarray) -> np.ndarray:
        return (values.astype(np.float32) / np.float32(4.0)).astype(values.dtype)

    members = [
        suture.map(scaled, ckpt[f"q/{i}"].T.reshape(width, heads, head_dim), elementwise=True)
        for i in range(layers)
    ]
    tree = {"query": suture.stack(members, axis=1).astype("bfloat16")}
    result = suture.save(tree, tmp_path / "out", max_memory="1MiB", progress=False)
    assert 0 < result.peak_in_flight <= 1 << 20
    expected = np.stack(
        [scaled(tensors[f"q.{i}"].T.reshape(width, heads, head_dim)) for i in range(layers)], axis=1
    ).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(suture.load(tmp_path / "out")["query"]), expected)


def test_a_block_of_rows_fills_the_output_in_place(tmp_path: Path) -> None:
    """A block is a row slice of its leaf: the slice reads into the block's buffer directly
    (cast and stacked as it is filled), with no block-sized temporary to copy from."""
    from suture._lazy.selection import full

    layers = {
        f"w.{i}": np.random.default_rng(i).standard_normal((256, 96), np.float32) for i in range(4)
    }
    save_file(layers, str(tmp_path / "model.safetensors"))
    ckpt = suture.open(tmp_path / "model.safetensors")
    leaf = suture.stack([ckpt[f"w/{i}"] for i in range(4)], axis=1).astype("bfloat16")
    block = leaf[64:192]
    out = np.empty(block.shape, ml_dtypes.bfloat16)
    block.node.read_into(full(block.shape), out)  # warms the per-thread read tiles
    tracemalloc.start()
    try:
        block.node.read_into(full(block.shape), out)
        _, traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert traced_peak < out.nbytes // 4, (traced_peak, out.nbytes)
    expected = np.stack([layers[f"w.{i}"] for i in range(4)], axis=1)[64:192]
    np.testing.assert_array_equal(out, expected.astype(ml_dtypes.bfloat16))


def test_a_row_longer_than_the_budget_is_written_in_parts(tmp_path: Path) -> None:
    """A row larger than the whole budget (one chunk of the default Orbax layout) is chunked
    along its own axis and written a block of that axis at a time, within the budget."""
    row = 300_001  # 1.2 MB of float32, not a whole number of 64 KiB chunks
    values = np.random.default_rng(0).standard_normal((2, row), dtype=np.float32)
    tree = {"long": values, "stacked": suture.stack([values, values + 1], axis=1)}
    for format_name, name in (("orbax", "out"), ("safetensors", "out.safetensors")):
        result = suture.save(
            tree, tmp_path / name, format=format_name, max_memory="1MiB", verify=True
        )
        assert 0 < result.peak_in_flight <= 1 << 20, format_name
        written = suture.open(tmp_path / name)
        np.testing.assert_array_equal(written["long"].read(), values)
        np.testing.assert_array_equal(
            written["stacked"].read(), np.stack([values, values + 1], axis=1)
        )


def test_a_block_that_cannot_fit_the_budget_is_refused_before_writing(tmp_path: Path) -> None:
    """A map of a whole array is one block; over the budget it is an error naming the leaf,
    the budget that works and the fix, and nothing is written."""
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((512, 1024), np.float32)}, str(path))
    w = suture.open(path)["w"]
    tree = {"normed": suture.map(lambda x: x / np.linalg.norm(x), w, shape=w.shape, dtype=w.dtype)}
    with pytest.raises(
        suture.SurgeryError, match=r"'normed'.*max_memory='\d+MiB' or more.*elementwise"
    ):
        suture.save(tree, tmp_path / "out", max_memory="1MiB")
    assert not (tmp_path / "out").exists()


RSS_DRIVER = """
import json, sys
import ml_dtypes, numpy, tensorstore
import suture

def status(key):
    with open("/proc/self/status") as lines:
        return int(next(l for l in lines if l.startswith(key + ":")).split()[1]) << 10

source, out, route, budget, tuning = sys.argv[1:]
ckpt = suture.open(source)
layers = [ckpt[f"layers/{i}/w"] for i in range(len(ckpt["layers"]))]
tree = {"stacked": suture.stack(layers).astype("bfloat16"), "embed_t": ckpt["embed"].T}
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the peak RSS starts again from here
baseline = status("VmRSS")
tune_allocator = {"keyword": True, "environment": None}[tuning]
result = suture.save(
    tree, out, format=route, max_memory=budget, progress=False, tune_allocator=tune_allocator
)
print(json.dumps({"growth": status("VmHWM") - baseline, "in_flight": result.peak_in_flight}))
"""
RSS_SLACK = 64 << 20  # allocator slack, per-thread tiles, TensorStore's own state


@pytest.fixture(scope="module")
def rss_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 300 MiB of float32 (random, so chunks do not compress to nothing); a layer
    (128 MiB, 64 MiB in bfloat16) costs more than the whole budget."""
    path = tmp_path_factory.mktemp("rss") / "model.safetensors"
    rng = np.random.default_rng(0)
    tensors = {"embed": rng.standard_normal((8192, 1024), dtype=np.float32)}
    for i in range(2):
        tensors[f"layers.{i}.w"] = rng.standard_normal((4096, 8192), dtype=np.float32)
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("route", ["orbax", "safetensors"])
@pytest.mark.parametrize("tuning", ["keyword", "environment"])
def test_the_process_grows_by_at_most_the_budget(
    route: str, tuning: str, rss_source: Path, tmp_path: Path
) -> None:
    """The promise itself: peak RSS (VmHWM) of a fresh process saving 300 MiB under a
    64 MiB budget grows by at most the budget plus a small constant, when the library is
    asked to tune the allocator (``tune_allocator=True``, or ``SUTURE_TUNE_ALLOCATOR=1``)."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / ("out" if route == "orbax" else "out.safetensors")
    environment = dict(os.environ)
    environment.pop("SUTURE_TUNE_ALLOCATOR", None)
    if tuning == "environment":
        environment["SUTURE_TUNE_ALLOCATOR"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", RSS_DRIVER, str(rss_source), str(out), route, "64MiB", tuning],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["in_flight"] <= 64 << 20
    assert 32 << 20 < report["growth"] <= (64 << 20) + RSS_SLACK, report["growth"] >> 20


def test_finished_blocks_leave_their_largest_arrays_for_reuse() -> None:
    """A small block's array cannot serve a large one, so the largest are kept; kept arrays
    count in flight and are given up as soon as a block needs the room."""
    budget = Budget(limit=100, keep=2)
    arrays = {n: np.empty(n, np.uint8) for n in (40, 15, 5)}  # none can serve the next
    for n, array in arrays.items():
        cost, reused = budget.acquire(n, n)
        assert reused is None
        budget.release(cost, array)
    assert budget.in_flight == 55  # 40 and 15 kept, 5 dropped
    cost, reused = budget.acquire(35, 35)
    assert reused is arrays[40] and cost == 40  # charged as the array it got
    budget.release(cost, reused)
    cost, reused = budget.acquire(90, 90)  # no kept array fits: they make room instead
    assert reused is None and budget.in_flight == 90
    budget.release(cost)
    assert budget.in_flight == 0


def test_a_block_waiting_for_running_blocks_leaves_the_kept_arrays_for_others() -> None:
    """Dropping kept arrays helps a waiting block only when that lets it in now; a large block
    that must wait for running ones anyway leaves them, and a block of their size reuses
    one meanwhile (instead of faulting in fresh pages)."""
    budget = Budget(limit=100, keep=2)
    running, _ = budget.acquire(30, 30)  # a block still running
    kept = np.empty(30, np.uint8)
    first, _ = budget.acquire(30, 30)
    budget.release(first, kept)  # a finished block leaves its array: 60 in flight
    entered = threading.Event()

    def large() -> None:
        cost, _ = budget.acquire(90, 60)  # needs the running block gone too
        entered.set()
        budget.release(cost)

    waiter = threading.Thread(target=large)
    waiter.start()
    assert not entered.wait(0.2)
    assert budget._kept == [kept]  # not dropped: it would not have let the block in
    cost, reused = budget.acquire(30, 30)
    assert reused is kept
    budget.release(cost)
    budget.release(running)
    waiter.join(timeout=10)
    assert entered.is_set() and budget.in_flight == 0


def test_blocks_waiting_for_room_do_not_hold_kept_arrays_from_each_other() -> None:
    """Two blocks that each take a kept array and then must wait: when the running block
    ends, one of them goes on (before, each kept its array while waiting, counted in flight,
    and both waited for room the other held: a conversion hung with nothing running)."""
    budget = Budget(limit=100, keep=2)
    running, _ = budget.acquire(30, 30)
    arrays = [np.empty(30, np.uint8), np.empty(30, np.uint8)]
    costs = [budget.acquire(30, 30)[0] for _ in arrays]
    for cost, array in zip(costs, arrays, strict=True):
        budget.release(cost, array)  # 30 running, 60 kept
    assert budget.in_flight == 90 and len(budget._kept) == 2
    done = []

    def block() -> None:
        cost, reused = budget.acquire(80, 30)  # a kept array fits it, the room does not yet
        done.append(reused)
        budget.release(cost, reused)

    waiters = [threading.Thread(target=block, daemon=True) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.2)
    assert not done
    budget.release(running)
    for waiter in waiters:
        waiter.join(timeout=10)
    assert len(done) == 2 and not any(waiter.is_alive() for waiter in waiters)
    assert budget.in_flight == sum(kept.nbytes for kept in budget._kept)
