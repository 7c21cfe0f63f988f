"""suture under jax.distributed: real processes (2 and 4, 2 CPU devices each) on 127.0.0.1.

Each test starts tests/multihost_worker.py once per process, bounded by a timeout, and
reads what the processes report. A streamed surgery is also run here in one process, as
the reference for the bytes each process should read and write (1/N of it, within 1.2x).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy

import suture
from suture._location import location_of
from tests import multihost_worker as worker
from tests.remote_servers import upload

WORKER = Path(__file__).with_name("multihost_worker.py")
TIMEOUT = 120
TOLERANCE = 1.2
ROOT = Path(__file__).resolve().parent.parent


def write_source(path: Path) -> None:
    """A stock Orbax checkpoint: 8 layers, a head and Adam-like state, in 16 KiB chunks."""
    rng = np.random.default_rng(0)
    params = {f"layer{i}": rng.standard_normal((128, 256), dtype=np.float32) for i in range(8)}
    params["head"] = rng.standard_normal((512, 256), dtype=np.float32)
    tree = {"params": params, "opt_state": {"mu": {k: np.zeros_like(v) for k, v in params.items()}}}
    save_args = {
        "params": {k: ocp.SaveArgs(chunk_byte_size=16 << 10) for k in params},
        "opt_state": {"mu": {k: ocp.SaveArgs(chunk_byte_size=16 << 10) for k in params}},
    }
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(path, args=ocp.args.PyTreeSave(tree, save_args=save_args))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_processes(
    scenario: str, count: int, workdir: Path, **extra_environment: str
) -> list[subprocess.CompletedProcess]:
    """Runs `count` worker processes to completion (killing them all after TIMEOUT s)."""
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "SUTURE_BARRIER_TIMEOUT": "60"}
    environment |= extra_environment
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                scenario,
                str(index),
                str(count),
                str(port),
                str(workdir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=ROOT,
            text=True,
        )
        for index in range(count)
    ]
    results = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=TIMEOUT)
            results.append(subprocess.CompletedProcess(process.args, process.returncode, output))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def reports(scenario: str, count: int, workdir: Path) -> list[dict]:
    return [
        json.loads((workdir / f"report-{scenario}-{index}.json").read_text())
        for index in range(count)
    ]


def assert_all_succeeded(results: list[subprocess.CompletedProcess]) -> None:
    for index, result in enumerate(results):
        assert result.returncode == 0, f"process {index} failed:\n{result.stdout[-4000:]}"


def single_process_reference(source: Path, output: Path) -> tuple[int, int]:
    """Bytes read and written by the same streamed surgery in this (single) process."""
    before = worker.io_bytes()
    suture.save(worker.surgery(source), output, chunk_bytes=16 << 10, progress=False)
    after = worker.io_bytes()
    return after[0] - before[0], after[1] - before[1]


def restore_in_one_process(workdir: Path) -> None:
    """Stock Orbax, in this single process, restores what the processes wrote."""
    expected = worker.expected_surgery(workdir / "source")
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(workdir / "lazy_out")
        global_restored = checkpointer.restore(workdir / "global_out")
    assert sorted(restored["params"]) == sorted(expected)
    for name, value in expected.items():
        assert restored["params"][name].dtype == value.dtype
        np.testing.assert_array_equal(restored["params"][name], value)
    for name, value in worker.global_values().items():
        np.testing.assert_array_equal(global_restored[name], value)
    assert int(global_restored["step"]) == 7


@pytest.mark.parametrize("count", [2, 4])
def test_every_process_writes_its_share_and_orbax_restores_it(tmp_path: Path, count: int) -> None:
    write_source(tmp_path / "source")
    results = run_processes("save", count, tmp_path)
    assert_all_succeeded(results)
    found = reports("save", count, tmp_path)

    # Values: stock Orbax restores both outputs in `count` processes and in one.
    for report in found:
        assert all(report["restored"].values()), report["restored"]
    restore_in_one_process(tmp_path)
    tensors = safetensors.numpy.load_file(tmp_path / "out.safetensors")
    for name, value in worker.expected_surgery(tmp_path / "source").items():
        np.testing.assert_array_equal(tensors[f"params.{name}"], value)

    # Each process read and wrote about 1/count of what one process does alone.
    read, written = single_process_reference(tmp_path / "source", tmp_path / "reference")
    for report in found:
        assert report["lazy"]["read"] <= TOLERANCE * read / count, (report, read)
        assert report["lazy"]["written"] <= TOLERANCE * written / count, (report, written)
        assert report["lazy"]["read"] >= read / count / TOLERANCE, (report, read)
    global_bytes = sum(value.nbytes for value in worker.global_values().values())
    for report in found:
        assert report["global"]["written"] <= TOLERANCE * global_bytes / count, report

    # suture.load onto global shardings: right values, and no more bytes than stock Orbax
    # reads for the same shards (a stored chunk that two local devices need is read once).
    for report in found:
        for name, load in report["load"].items():
            assert load["correct"], (name, load)
            assert load["read"] <= TOLERANCE * load["orbax_read"], (name, load)

    # suture.load of the in-memory global arrays onto other shardings and dtypes.
    for report in found:
        assert all(report["reshard"].values()), report["reshard"]


def test_a_process_killed_halfway_leaves_no_output(tmp_path: Path) -> None:
    write_source(tmp_path / "source")
    results = run_processes("kill", 2, tmp_path)
    assert results[1].returncode == -signal.SIGKILL, results[1].stdout[-2000:]
    assert results[0].returncode != 0, results[0].stdout[-2000:]
    assert not (tmp_path / "killed_out").exists()
    assert not (tmp_path / "report-kill-0.json").exists()
    # The survivor stopped on JAX's report of the dead process, or at suture's barrier.
    assert "killed" not in results[0].stdout or "Terminating process" in results[0].stdout
    assert any(
        text in results[0].stdout
        for text in ("another task died", "stopped sending heartbeats", "abandoned", "waited")
    ), results[0].stdout[-2000:]


def test_errors_reach_every_process_and_leave_nothing(tmp_path: Path) -> None:
    write_source(tmp_path / "source")
    results = run_processes("errors", 2, tmp_path)
    assert_all_succeeded(results)
    first, second = reports("errors", 2, tmp_path)
    # Process 1's bad leaf stops process 0 too, with process 1's own message.
    assert "'params/bad' is a set" in second["one_fails"]
    assert "abandoned on every process because process 1 failed" in first["one_fails"]
    assert "'params/bad' is a set" in first["one_fails"]
    for report in (first, second):
        assert "sharded across processes" in report["safetensors"]
        assert "Save as Orbax" in report["safetensors"]
        assert "verify=True reads blocks back by rows" in report["verify"]
        assert "'rows' is a jax.Array sharded across processes" in report["numpy_target"]
        assert "process_allgather" in report["numpy_target"]
    assert "process 1 did not within 2 s" in first["alone"], first["alone"]
    leftovers = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("report-"))
    assert leftovers == ["source"], leftovers


def test_barrier_timeout_must_be_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    from suture._exec.distributed import barrier_timeout

    monkeypatch.setenv("SUTURE_BARRIER_TIMEOUT", "soon")
    with pytest.raises(suture.SurgeryError, match=r"SUTURE_BARRIER_TIMEOUT='soon' is not a number"):
        barrier_timeout()
    monkeypatch.setenv("SUTURE_BARRIER_TIMEOUT", "12.5")
    assert barrier_timeout() == 12.5


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_the_entry_grace_must_be_a_number_of_seconds(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from suture._exec.distributed import entry_grace

    monkeypatch.setenv("SUTURE_COLLECTIVE_GRACE", value)
    with pytest.raises(
        suture.ArgumentError, match=rf"SUTURE_COLLECTIVE_GRACE='{value}' is not a number of seconds"
    ):
        entry_grace()
    monkeypatch.setenv("SUTURE_COLLECTIVE_GRACE", "3")
    assert entry_grace() == 3.0


def test_a_lock_held_on_another_host_is_not_taken_over(tmp_path: Path) -> None:
    """On storage shared by several hosts, a pid from another host cannot be checked here."""
    lock = tmp_path / ".out.suture-lock"
    lock.write_text("999999999@another-host")  # no such pid here: it would look stale
    with pytest.raises(suture.SurgeryError) as caught:
        suture.save({"a": np.zeros(2)}, tmp_path / "out", progress=False)
    assert "pid 999999999 on host 'another-host'" in str(caught.value)
    assert f"remove {str(lock)!r}" in str(caught.value)
    assert not (tmp_path / "out").exists()
    lock.write_text(f"999999999@{socket.gethostname()}")  # this host, writer gone: stale
    with pytest.warns(suture.StaleLockWarning, match="pid 999999999"):
        suture.save({"a": np.zeros(2)}, tmp_path / "out", progress=False)
    assert (tmp_path / "out").exists() and not lock.exists()


@pytest.mark.parametrize("count", [2, 4])
def test_collective_saves_to_gcs_and_s3(tmp_path: Path, gcs: str, s3: str, count: int) -> None:
    """Every process writes about 1/N into its own database under the bucket prefix; stock
    Orbax restores the gs:// results in the same process group, suture reads both back."""
    write_source(tmp_path / "source")
    bases = f"{gcs}/multihost{count} {s3}/multihost{count}"
    for base in bases.split():
        upload(tmp_path / "source", f"{base}/source")
    results = run_processes(
        "remote",
        count,
        tmp_path,
        SUTURE_TEST_BASES=bases,
        GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
    )
    assert_all_succeeded(results)
    found = reports("remote", count, tmp_path)
    for base in bases.split():
        for report in found:
            assert all(report[base]["checks"].values()), report[base]["checks"]
        assert suture.open(f"{base}/lazy_out").format == "orbax"
        assert location_of(f"{base}/lazy_out/commit_success.txt").is_file()
        databases = location_of(f"{base}/lazy_out").subfolders()
        assert [f"ocdbt.process_{i}" for i in range(count)] == sorted(
            name for name in databases if name.startswith("ocdbt.process_")
        )
        alone = single_process_remote_reference(f"{base}/source", f"{base}/reference_out")
        for kind, bytes_alone in zip(("read", "written"), alone, strict=True):
            shares = [report[base]["lazy"][kind] for report in found]
            for share in shares:  # each process moved about 1/N of what one process does
                assert 0 < share <= 1.25 * bytes_alone / count, (kind, shares, bytes_alone)


def single_process_remote_reference(source: str, url: str) -> tuple[int, int]:
    """Bytes one process alone reads from and writes to the bucket for the same surgery."""
    driver = url.split("://")[0].replace("gs", "gcs")
    before = worker.io_bytes(driver)
    suture.save(worker.surgery(source), url, chunk_bytes=16 << 10, progress=False)
    after = worker.io_bytes(driver)
    return after[0] - before[0], after[1] - before[1]


def test_a_process_killed_during_a_remote_save_leaves_nothing_finished(
    tmp_path: Path, s3: str
) -> None:
    write_source(tmp_path / "source")
    base = f"{s3}/killed-multihost"
    results = run_processes("remote_kill", 2, tmp_path, SUTURE_TEST_BASES=base)
    assert results[1].returncode == -signal.SIGKILL, results[1].stdout[-2000:]
    assert results[0].returncode != 0, results[0].stdout[-2000:]
    assert not location_of(f"{base}/killed_out/commit_success.txt").is_file()
    with pytest.raises(suture.SurgeryError):
        suture.open(f"{base}/killed_out")
    tree = {"w": np.arange(6.0)}  # a rerun succeeds, whatever process 0 managed to clean up
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", suture.StaleLockWarning)
        suture.save(tree, f"{base}/killed_out", progress=False)
    np.testing.assert_array_equal(suture.open(f"{base}/killed_out")["w"].read(), tree["w"])


def test_process_zero_alone_hears_why_within_the_grace_period(tmp_path: Path) -> None:
    """`if jax.process_index() == 0: suture.save(...)`: an error after the grace, not 1800 s."""
    write_source(tmp_path / "source")
    results = run_processes("lone", 2, tmp_path, SUTURE_COLLECTIVE_GRACE="3")
    assert_all_succeeded(results)
    report = reports("lone", 2, tmp_path)[0]
    assert "process 1 did not within 3 s" in report["error"], report
    assert "if jax.process_index() == 0:" in report["error"]
    assert report["waited"] < 3 + 10, report  # the barrier timeout here is 60 s
    leftovers = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("report-"))
    assert leftovers == ["source"], leftovers


def test_process_zero_cleans_up_within_one_barrier_timeout_when_a_process_dies(
    tmp_path: Path,
) -> None:
    """The survivor raises after one barrier timeout (6 s) and removes its temporary output and
    the lock at once, instead of waiting a second timeout until JAX's heartbeat aborts it."""
    write_source(tmp_path / "source")
    results = run_processes("kill_cleanup", 2, tmp_path, SUTURE_BARRIER_TIMEOUT="6")
    assert results[1].returncode == -signal.SIGKILL, results[1].stdout[-2000:]
    assert results[0].returncode == 0, results[0].stdout[-2000:]
    report = reports("kill_cleanup", 1, tmp_path)[0]
    assert "waited 6 s" in report["error"], report
    assert report["waited"] < 6 + 10, report
    assert report["left"] == [], report  # no temporary folder, no lock


def test_a_sharded_safetensors_folder_is_written_by_every_process(tmp_path: Path, s3: str) -> None:
    """Each process writes whole shard files (its share of the bytes), the primary the index,
    locally and to s3://; transformers-style readers see one folder."""
    write_source(tmp_path / "source")
    base = f"{s3}/multihost-safetensors"
    results = run_processes("safetensors", 2, tmp_path, SUTURE_TEST_BASES=base)
    assert_all_succeeded(results)
    found = reports("safetensors", 2, tmp_path)
    params = suture.open(tmp_path / "source")
    for destination in (str(tmp_path / "sharded_st"), f"{base}/sharded_st"):
        written = [report[destination] for report in found]
        assert all(share > 0 for share in written), written  # both processes wrote shards
        opened = suture.open(destination)
        assert opened.format == "safetensors"
        names = sorted(suture.flatten(opened.tree))
        assert len(names) == 9 and sum(written) == sum(
            leaf.nbytes for leaf in opened.arrays().values()
        )
        for name in names:
            expected = params[name.replace(".", "/")].read().astype("bfloat16")
            np.testing.assert_array_equal(opened[name].read(), expected)
    index = json.loads((tmp_path / "sharded_st" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
