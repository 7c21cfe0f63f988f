"""Side files (config.json ...) are copied while the blocks are written, never after an abort.

On a bucket each side file is a round trip; copied beside the blocks, it no longer follows
the last block's. A save that fails waits for the copy before removing what it wrote, so
nothing of it appears afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import suture
from suture._location import location_of
from suture._save import writer


def _config(tmp_path: Path) -> dict:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama"}')
    return {"config.json": location_of(config)}


def test_side_files_are_copied_while_the_blocks_are_written(tmp_path: Path, monkeypatch) -> None:
    seen: dict[str, float | str] = {}
    copy, run_blocks = writer.copy_extra_files, writer.run_blocks

    def copying(*args):
        seen["copy_began"], seen["thread"] = time.perf_counter(), threading.current_thread().name
        copy(*args)

    def running(*args, **kwargs):
        progress = run_blocks(*args, **kwargs)
        time.sleep(0.3)  # the last block's write, slow
        seen["blocks_ended"] = time.perf_counter()
        return progress

    monkeypatch.setattr(writer, "copy_extra_files", copying)
    monkeypatch.setattr(writer, "run_blocks", running)
    out = tmp_path / "out"
    suture.save({"w": np.arange(6.0)}, out, progress=False, extra_files=_config(tmp_path))

    assert seen["copy_began"] < seen["blocks_ended"]
    assert seen["thread"] != threading.main_thread().name
    assert (out / "config.json").read_text() == '{"model_type": "llama"}'
    assert np.array_equal(suture.load(out)["w"], np.arange(6.0))


def test_a_side_file_that_cannot_be_read_fails_the_save_and_leaves_nothing(tmp_path: Path) -> None:
    missing = {"config.json": location_of(tmp_path / "gone.json")}
    out = tmp_path / "out"
    with pytest.raises(suture.SurgeryError, match="gone.json"):
        suture.save({"w": np.arange(6.0)}, out, progress=False, extra_files=missing)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_aborted_save_to_a_bucket_waits_for_its_side_files(
    gcs: str, tmp_path: Path, monkeypatch
) -> None:
    copy = writer.copy_extra_files

    def slow_copy(*args):
        time.sleep(0.5)  # still copying when the blocks fail
        copy(*args)

    def failing_blocks(*args, **kwargs):
        raise OSError("the disk went away")

    monkeypatch.setattr(writer, "copy_extra_files", slow_copy)
    monkeypatch.setattr(writer, "run_blocks", failing_blocks)
    url = f"{gcs}/side-files/aborted"
    with pytest.raises(suture.SurgeryError, match="the disk went away"):
        suture.save({"w": np.arange(6.0)}, url, progress=False, extra_files=_config(tmp_path))
    time.sleep(0.7)  # past the copy's end, had it gone on alone
    assert location_of(f"{gcs}/side-files").children() == []


# --- every config.json read is capped and follows the side-file rule (issue 37) -----------


def _hf_folder(folder: Path, value: float) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir()
    save_file({"w": np.full((4, 4), value, np.float32)}, str(folder / "model.safetensors"))
    return folder


def test_a_merge_refuses_a_config_json_past_the_metadata_cap(tmp_path: Path) -> None:
    """An HF merge reads the first model's config.json to write its own: a sparse 300 MiB
    one is refused from its size, unread, naming the file."""
    first, second = _hf_folder(tmp_path / "a", 1.0), _hf_folder(tmp_path / "b", 3.0)
    with open(first / "config.json", "wb") as stream:
        stream.truncate(300 << 20)
    (second / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "merge.yaml").write_text(
        "merge_method: linear\nmodels:\n  - model: a\n    parameters: {weight: 1.0}\n"
        "  - model: b\n    parameters: {weight: 1.0}\n"
    )
    ran = subprocess.run(
        [sys.executable, "-m", "suture", "merge", "merge.yaml", "-o", "merged"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert "config.json" in ran.stderr and "holds more than" in ran.stderr, ran.stderr
    assert not (tmp_path / "merged").exists()


def test_dequantize_does_not_read_a_config_linked_from_outside(tmp_path: Path) -> None:
    """The quantization_config is looked up under the side-file rule: a config.json that
    links out of the folder is not read, so the folder reads as not quantized."""
    from suture.sources.safetensors import quantization_config

    folder = _hf_folder(tmp_path / "model", 1.0)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"quantization_config": {"quant_method": "fp8"}, "api_token": "s"}')
    (folder / "config.json").symlink_to(elsewhere)
    assert quantization_config(location_of(folder)) is None
    (folder / "config.json").unlink()
    (folder / "config.json").write_text('{"quantization_config": {"quant_method": "fp8"}}')
    assert quantization_config(location_of(folder)) == {"quant_method": "fp8"}
