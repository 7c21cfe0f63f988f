"""The acceptance checks of remote storage: the README tour on gs://, one row fetches about
one row, and a save killed halfway leaves nothing that looks finished.

The row test uses a 64 MiB tensor rather than 1 GiB, to keep uploads to three servers
cheap; the bound it checks (bytes fetched for one row, not for the tensor) does not depend
on the size.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from safetensors.numpy import save_file
from typer.testing import CliRunner

import suture
from suture._iostats import count_bytes_read
from suture._location import location_of
from suture.cli import app
from tests.remote_servers import upload
from tests.test_readme import blocks, make_files

runner = CliRunner()
ROWS, COLUMNS = 4096, 4096  # float32: 64 MiB, 16 KiB a row


def test_readme_tour_on_a_gcs_copy(gcs: str, tmp_path: Path, monkeypatch) -> None:
    make_files(tmp_path)
    monkeypatch.chdir(tmp_path)  # nothing the tour names may land in the repository
    base = f"{gcs}/tour"
    for name in (
        "ckpt",
        "runs",
        "finetuned_a",
        "finetuned_b",
        "image_ckpt",
        "text_ckpt",
        "hf_model",
        "base.safetensors",
        "lora.safetensors",
    ):
        upload(tmp_path / name, f"{base}/{name}")
    remote_names = [
        "runs/my_model/checkpoints", "ckpt_for_scan", "ckpt_bf16", "ckpt", "hf_out", "image_ckpt",
        "text_ckpt", "finetuned_a", "finetuned_b", "soup", "hf_model", "hf_as_orbax",
        "hf_again", "merged", "hf_copy", "base.safetensors", "lora.safetensors",
        "merged.safetensors",
    ]  # fmt: skip
    quoted = re.compile(r'"(' + "|".join(re.escape(n) for n in remote_names) + r')"')
    namespace: dict = {}
    for code in blocks("python"):
        code = quoted.sub(lambda m: f'"{base}/{m.group(1)}"', code)
        exec(compile(code, "README.md (on gs://)", "exec"), namespace)  # noqa: S102
    assert namespace["run"].step == 2000 and namespace["for_scan"]["params"]["layers"]
    assert location_of(f"{base}/ckpt_for_scan/commit_success.txt").is_file()
    assert suture.open(f"{base}/hf_out").format == "safetensors"
    assert location_of(f"{base}/soup/_METADATA").is_file()
    assert location_of(f"{base}/hf_copy").children() == ["config.json", "model.safetensors"]
    assert suture.open(f"{base}/merged.safetensors")["w"].shape == (2048, 1024)

    merge_config = (tmp_path / "merge.yaml").read_text()
    for name in ("finetuned_a", "finetuned_b", "ckpt"):
        merge_config = re.sub(rf"\b{name}\b", f"{base}/{name}", merge_config)
    (tmp_path / "merge.yaml").write_text(merge_config)
    commands = [line for block in blocks("bash") for line in block.splitlines()]
    commands = [line for line in commands if line.startswith("suture ")]
    commands = [line for line in commands if not line.startswith("suture demo --examples")]
    assert len(commands) >= 8
    for command in commands:
        arguments = [
            f"{base}/{word}" if word in remote_names else word
            for word in shlex.split(command.split("  #")[0])[1:]
        ]
        done = runner.invoke(app, arguments)
        expected = 1 if arguments[0] == "diff" else 0
        assert done.exit_code == expected, f"{arguments}\n{done.output}"
    with ocp.StandardCheckpointer() as checkpointer:
        merged = checkpointer.restore(epath.Path(f"{base}/merged"))
    assert merged["params"]["linear0"]["kernel"].shape == (64, 64)


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    values = np.zeros((ROWS, COLUMNS), np.float32)
    values[100] = np.arange(COLUMNS)
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    save_file({"w": values}, path)
    return path


@pytest.mark.parametrize("server", ["gs", "s3", "http"])
def test_one_row_of_a_big_tensor_fetches_one_row(server: str, big_file: Path, request) -> None:
    row_bytes = COLUMNS * 4
    served_bytes = None
    if server == "http":
        http = request.getfixturevalue("http")
        url = http.publish(big_file, "big/big.safetensors")
        served_bytes = lambda: http.bytes_sent  # noqa: E731
    else:
        url = upload(
            big_file,
            f"{request.getfixturevalue('gcs' if server == 'gs' else 's3')}/big.safetensors",
        )
    ckpt = suture.open(url)
    before = served_bytes() if served_bytes else 0
    with count_bytes_read() as counter:
        row = ckpt["w"][100].read()
    np.testing.assert_array_equal(row, np.arange(COLUMNS, dtype=np.float32))
    assert counter.bytes == row_bytes, counter.bytes  # TensorStore's count of bytes fetched
    if served_bytes:
        deadline = time.monotonic() + 5  # the server counts a block just after sending it
        while served_bytes() - before < row_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert served_bytes() - before == row_bytes  # the server's own count


def test_one_row_of_a_big_orbax_array_on_gcs_fetches_one_chunk(gcs: str) -> None:
    values = np.random.default_rng(0).random((1024, 4096), dtype=np.float32)  # 16 MiB
    url = f"{gcs}/big/orbax"
    suture.save({"w": values}, url, chunk_bytes="1MiB", progress=False)
    ckpt = suture.open(url)
    with count_bytes_read() as counter:
        row = ckpt["w"][500].read()
    np.testing.assert_array_equal(row, values[500])
    chunk = 1 << 20
    assert counter.bytes <= chunk + 64 * 1024, counter.bytes  # a chunk, plus OCDBT's index nodes


KILLED_SAVE = """
import numpy as np, suture, sys
tree = {f"layer{i}": np.random.default_rng(i).random((512, 1024), dtype=np.float32) for i in range(48)}
suture.save(tree, sys.argv[1], chunk_bytes="64KiB", max_memory="4MiB", progress=False)
"""


def test_save_to_gcs_killed_halfway_leaves_nothing_finished(gcs: str) -> None:
    url = f"{gcs}/killed/ckpt"
    writer = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, url])
    try:
        deadline = time.monotonic() + 120
        data = location_of(url)
        while time.monotonic() < deadline and writer.poll() is None:
            if (data / "_CHECKPOINT_METADATA").is_file() and len(data.subfolders()) > 0:
                break
            time.sleep(0.05)
        assert writer.poll() is None, "the save finished before it could be killed"
        time.sleep(0.5)  # well into the array data
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    assert not (data / "commit_success.txt").is_file()
    recorded = json.loads((data / "_CHECKPOINT_METADATA").read_bytes())
    assert recorded["commit_timestamp_nsecs"] is None
    with pytest.raises(suture.UnfinishedCheckpointError, match="unfinished Orbax save"):
        suture.open(url)
    with (
        pytest.raises(ValueError, match="Found incomplete checkpoint"),
        ocp.StandardCheckpointer() as checkpointer,
    ):
        checkpointer.restore(epath.Path(url))

    tree = {f"layer{i}": np.full((4, 4), i, np.float32) for i in range(3)}
    with pytest.warns(suture.StaleLockWarning, match="Took over the lock"):
        suture.save(tree, url, progress=False)  # the dead writer's lock and leftovers go
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(epath.Path(url))
    assert sorted(restored) == ["layer0", "layer1", "layer2"]
    assert not location_of(f"{gcs}/killed/.ckpt.suture-lock").is_file()
