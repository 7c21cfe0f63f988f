"""Every example in the README runs: Python blocks in order, shell lines in real processes."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import save_file

from suture import open as suture_open
from tests.orbax_writers import save_standard

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def make_files(root: Path) -> None:
    """The checkpoints the README's examples name."""
    rng = np.random.default_rng(0)

    def layers(prefix: str = "linear") -> dict:
        return {
            f"{prefix}{i}": {
                "kernel": rng.standard_normal((64, 64), dtype=np.float32),
                "bias": np.zeros(64, np.float32),
            }
            for i in range(4)
        }

    save_standard(
        root / "ckpt",
        {
            "params": layers(),
            "opt_state": {"mu": layers(), "nu": layers()},
            "step": np.asarray(7, np.int32),
        },
    )
    with ocp.CheckpointManager(root / "runs" / "my_model" / "checkpoints") as manager:
        for step in (1000, 2000):
            manager.save(step, args=ocp.args.StandardSave({"params": layers()}))
        manager.wait_until_finished()
    for name in ("finetuned_a", "finetuned_b"):
        save_standard(root / name, {"params": layers(), "step": np.asarray(7, np.int32)})
    save_standard(
        root / "image_ckpt", {"params": {"dense": {"kernel": np.ones((32, 32), np.float32)}}}
    )
    save_standard(
        root / "text_ckpt", {"params": {"dense": {"kernel": np.ones((16, 16), np.float32)}}}
    )
    hf = root / "hf_model"
    hf.mkdir()
    weight_map = {}
    for shard in (1, 2):
        filename = f"model-0000{shard}-of-00002.safetensors"
        tensors = {f"model.layers.{shard}.weight": rng.standard_normal((8, 8)).astype(np.float32)}
        save_file(tensors, hf / filename)
        weight_map.update({name: filename for name in tensors})
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 512}, "weight_map": weight_map})
    )
    (hf / "config.json").write_text("{}")
    save_file({"w": rng.standard_normal((2048, 1024), dtype=np.float32)}, root / "base.safetensors")
    save_file(
        {
            "a": rng.standard_normal((2048, 8), dtype=np.float32),
            "b": rng.standard_normal((8, 1024), dtype=np.float32),
        },
        root / "lora.safetensors",
    )
    (root / "recipe.yaml").write_text(next(b for b in blocks("yaml") if b.startswith("rules:")))
    (root / "merge.yaml").write_text(next(b for b in blocks("yaml") if b.startswith("method:")))


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    make_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_python_examples_run(workdir: Path) -> None:
    namespace: dict = {}
    for code in blocks("python"):
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 (the README's own code)
    assert namespace["for_scan"]["params"]["layers"]["kernel"].shape == (4, 64, 64)
    assert (workdir / "ckpt_for_scan" / "_METADATA").is_file()
    assert namespace["model"]["fusion"]["kernel"].shape == (48, 8)
    assert namespace["padded"]["params"]["linear0"]["kernel"].shape == (96, 64)
    assert namespace["renamed"]["params"]["layer_3"]["kernel"].shape == (64, 64)
    assert (workdir / "soup" / "_METADATA").is_file()
    assert namespace["tuned"]["params"]["linear0"]["kernel"] is not None
    assert 0 < namespace["reading"].bytes < namespace["ckpt"].nbytes / 2
    assert sorted(p.name for p in (workdir / "hf_copy").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    np.testing.assert_array_equal(
        namespace["mlp"].layer1.kernel[...], np.asarray(namespace["ckpt"]["params/linear1/kernel"])
    )
    assert sorted(namespace["variables"]["params"]) == ["linear0", "linear1"]
    assert sorted(namespace["resumed"]["opt_state"]["mu"]) == [f"layer{i}" for i in range(4)]
    assert namespace["ready"]["kernels"].shape == (4, 64, 64)
    assert namespace["ready"]["mean_bias"].shape == (64,)
    merged = suture_open(workdir / "merged.safetensors")["w"].read()
    base = suture_open(workdir / "base.safetensors")
    adapter = suture_open(workdir / "lora.safetensors")
    # the product is computed by blocks of rows, so BLAS may round it differently from one
    # whole matmul: within an ulp of its terms, not of a sum that cancels to near zero
    np.testing.assert_allclose(
        merged,
        base["w"].read() + 0.5 * (adapter["a"].read() @ adapter["b"].read()),
        rtol=1e-5,
        atol=1e-5,
    )


def test_the_lora_merge_streams_within_its_budget(workdir: Path) -> None:
    """The tour's LoRA block: its peak memory (numpy's, traced) stays under max_memory."""
    code = next(block for block in blocks("python") if "def merge_lora" in block)
    leaf_bytes = 2048 * 1024 * 4
    budget = 2 * 1024 * 1024
    assert 'max_memory="2MiB"' in code and budget < leaf_bytes
    namespace: dict = {"suture": __import__("suture"), "print": lambda *a: None}
    tracemalloc.start()
    try:
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 (the README's own code)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= budget, f"peak {peak} bytes over the budget of {budget}"


def test_shell_examples_run(workdir: Path) -> None:
    exec(
        compile(blocks("python")[2], str(README), "exec"),
        {
            "suture": __import__("suture"),
            "rules": __import__("suture").rules,
            "print": lambda *a: None,
        },
    )
    commands = [
        line
        for block in blocks("bash")
        for line in block.splitlines()
        if line.startswith("suture ")
    ]
    assert len(commands) >= 8
    for command in commands:
        arguments = shlex.split(command.split("  #")[0])
        done = subprocess.run(
            [sys.executable, "-m", "suture", *arguments[1:]], capture_output=True, text=True
        )
        expected = 1 if arguments[1] == "diff" else 0  # the two checkpoints do differ
        assert done.returncode == expected, f"{command}\n{done.stdout}\n{done.stderr}"
