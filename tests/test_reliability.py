"""Crashes, corruption, full disks, concurrent writers and verification."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.orbax_writers import save_standard

CRASH_RUNS = int(os.environ.get("SUTURE_CRASH_RUNS", "3"))


def tree_digest(folder: Path) -> str:
    """A digest of every file (names and contents) under `folder`."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_verify_passes_for_both_formats(tmp_path: Path) -> None:
    tree = {
        "w": np.arange(4096, dtype=np.float32).reshape(64, 64),
        "b": np.ones(3, np.int8),
        "scalar": np.asarray(1.5),
    }
    suture.save(tree, tmp_path / "out", verify=True, progress=False, chunk_bytes="4KiB")
    suture.save(
        tree, tmp_path / "out.safetensors", format="safetensors", verify=True, progress=False
    )
    np.testing.assert_array_equal(suture.open(tmp_path / "out")["w"].read(), tree["w"])


def test_verify_names_the_axis_of_a_block_of_layers(tmp_path: Path, monkeypatch) -> None:
    """Layers stacked on axis 1 are written a few whole layers at a time; a block read back
    wrong is named by its positions along that axis."""
    from safetensors.numpy import save_file

    from suture.sinks import orbax as sink

    layers = {f"w.{i}": np.full((512, 384), i, np.float32) for i in range(12)}
    save_file(layers, str(tmp_path / "model.safetensors"))
    ckpt = suture.open(tmp_path / "model.safetensors")
    tree = {"kernel": suture.stack([ckpt[f"w/{i}"].T for i in range(12)], axis=1)}
    original = sink.OrbaxArrayWriter.write_along

    def corrupting(self, axis, rows, values):
        damaged = np.array(values, copy=True)
        if axis:
            damaged.reshape(-1)[:1] += 1
        original(self, axis, rows, damaged)

    monkeypatch.setattr(sink.OrbaxArrayWriter, "write_along", corrupting)
    with pytest.raises(
        suture.SurgeryError,
        match=r"Verification failed: positions of axis 1 0 to \d+ of 'kernel' read back",
    ):
        suture.save(tree, tmp_path / "bad", max_memory="2MiB", verify=True, progress=False)
    assert not (tmp_path / "bad").exists()


def test_verify_catches_a_corrupting_writer(tmp_path: Path, monkeypatch) -> None:
    from suture.sinks import safetensors as sink

    original = sink.SafetensorsTensorWriter.write

    def corrupting(self, rows, values):
        damaged = np.array(values, copy=True)
        damaged.reshape(-1)[:1] += 1
        original(self, rows, damaged)

    monkeypatch.setattr(sink.SafetensorsTensorWriter, "write", corrupting)
    with pytest.raises(
        suture.SurgeryError, match=r"Verification failed: rows 0 to .* of 'w' read back differently"
    ):
        suture.save(
            {"w": np.zeros(8, np.float32)},
            tmp_path / "bad.safetensors",
            format="safetensors",
            verify=True,
            progress=False,
        )
    assert not (tmp_path / "bad.safetensors").exists()
    assert list(tmp_path.iterdir()) == []


def test_apply_verify_on_the_command_line(tmp_path: Path) -> None:
    save_standard(tmp_path / "src", {"w": np.ones((8, 8), np.float32)})
    recipe = tmp_path / "r.yaml"
    recipe.write_text("- cast: {pattern: w, dtype: float16}\n")
    result = CliRunner().invoke(
        app,
        [
            "apply",
            str(recipe),
            str(tmp_path / "src"),
            "-o",
            str(tmp_path / "out"),
            "--verify",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "verified" in result.output


@pytest.mark.parametrize("compression", ["auto", "zstd", "none"])
def test_damaged_output_data_is_an_error_not_garbage(tmp_path: Path, compression: str) -> None:
    suture.save(
        {"w": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)},
        tmp_path / "out",
        progress=False,
        compression=compression,
    )
    data_files = [p for p in (tmp_path / "out" / "d").iterdir()]
    target = max(data_files, key=lambda p: p.stat().st_size)
    blob = bytearray(target.read_bytes())
    blob[len(blob) // 2] ^= 0x40  # one bit in the middle of the array's chunk
    target.write_bytes(bytes(blob))
    with pytest.raises(suture.CorruptCheckpointError, match=r"Leaf 'w' of .* cannot be read"):
        suture.open(tmp_path / "out")["w"].read()


def test_full_disk_during_an_orbax_write(small_tmpfs: Path) -> None:
    noise = (
        np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    )  # 4 MiB, incompressible
    with pytest.raises(suture.SurgeryError, match="No space left on the device"):
        suture.save({"w": noise}, small_tmpfs / "ckpt", progress=False)
    assert list(small_tmpfs.iterdir()) == []


STREAMING_WRITER = """
import sys, suture
from suture import rules
lazy = suture.transform([rules.stack(r"layer(?P<i>\\d+)", into="layers"), rules.cast(".*", "bfloat16")], sys.argv[1])
suture.save(lazy, sys.argv[2], max_memory="16MiB", chunk_bytes="64KiB", progress=False, overwrite=True)
print("done", flush=True)
"""


@pytest.fixture
def crash_source(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    save_standard(
        tmp_path / "source",
        {f"layer{i}": rng.standard_normal((512, 2048)).astype(np.float32) for i in range(16)},
    )
    return tmp_path / "source"


def test_sigkill_at_random_points_never_leaves_a_broken_checkpoint(
    tmp_path: Path, crash_source: Path
) -> None:
    before = tree_digest(crash_source)
    destination = tmp_path / "out"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import suture"], check=True)
    start_up = time.perf_counter() - started
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", STREAMING_WRITER, str(crash_source), str(destination)],
        check=True,
        capture_output=True,
    )
    full_run = time.perf_counter() - started
    outcomes = {"killed before commit": 0, "finished before kill": 0}
    chooser = random.Random(1234)
    for _ in range(CRASH_RUNS):
        process = subprocess.Popen(
            [sys.executable, "-c", STREAMING_WRITER, str(crash_source), str(destination)],
            stdout=subprocess.PIPE,
        )
        time.sleep(chooser.uniform(start_up, full_run * 0.95))  # while it writes
        process.send_signal(signal.SIGKILL)
        output = process.communicate()[0]
        outcomes["finished before kill" if b"done" in output else "killed before commit"] += 1
        if destination.exists():  # the previous complete result, or this run's: whole either way
            restored = ocp.StandardCheckpointer().restore(destination)
            assert restored["layers"].shape == (16, 512, 2048)
        assert tree_digest(crash_source) == before
    rerun = subprocess.run(
        [sys.executable, "-c", STREAMING_WRITER, str(crash_source), str(destination)],
        capture_output=True,
        text=True,
    )
    assert rerun.returncode == 0, rerun.stderr
    expected = np.stack([suture.open(crash_source)[f"layer{i}"].read() for i in range(16)]).astype(
        suture.open(destination)["layers"].dtype
    )
    np.testing.assert_array_equal(suture.open(destination)["layers"].read(), expected)
    assert sum(outcomes.values()) == CRASH_RUNS
    assert outcomes["killed before commit"] >= 1, outcomes
    report = os.environ.get("SUTURE_CRASH_REPORT")
    if report:
        Path(report).write_text(f"{CRASH_RUNS} runs, full write {full_run:.2f} s: {outcomes}\n")


def test_two_writers_of_one_destination(tmp_path: Path, crash_source: Path) -> None:
    writer = STREAMING_WRITER.replace("overwrite=True", "overwrite=False")
    first = subprocess.Popen(
        [sys.executable, "-c", writer, str(crash_source), str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    second = subprocess.Popen(
        [sys.executable, "-c", writer, str(crash_source), str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    results = [process.communicate() + (process.returncode,) for process in (first, second)]
    codes = sorted(code for _, _, code in results)
    assert codes[0] == 0 and codes[1] != 0, results
    loser_error = next(err for _, err, code in results if code != 0)
    assert "Another process" in loser_error or "already exists" in loser_error
    assert suture.open(tmp_path / "out")["layers"].shape == (16, 512, 2048)
