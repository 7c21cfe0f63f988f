"""Every example in the README runs: Python blocks in order, shell lines in real processes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from suture import open as suture_open
from suture.cli.examples import write_examples

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def make_files(root: Path) -> None:
    """The checkpoints the README's examples name, as `suture demo --examples` writes them."""
    write_examples(root)


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
        if line.startswith("suture ") and not line.startswith("suture demo --examples")
    ]
    assert len(commands) >= 8
    for command in commands:
        arguments = shlex.split(command.split("  #")[0])
        done = subprocess.run(
            [sys.executable, "-m", "suture", *arguments[1:]], capture_output=True, text=True
        )
        expected = 1 if arguments[1] == "diff" else 0  # the two checkpoints do differ
        assert done.returncode == expected, f"{command}\n{done.stdout}\n{done.stderr}"


def test_the_readme_runs_as_pasted_after_suture_demo_examples(tmp_path: Path) -> None:
    """In a fresh folder: the command the README gives first, then its Python blocks as one
    script in a fresh interpreter, then its shell lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *arguments], cwd=tmp_path, capture_output=True, text=True, env=env
        )

    first = [
        line for block in blocks("bash") for line in block.splitlines() if "--examples" in line
    ]
    assert first == ["suture demo --examples ."]
    made = run("-m", "suture", "demo", "--examples", ".")
    assert made.returncode == 0, made.stderr
    (tmp_path / "tour.py").write_text("\n".join(blocks("python")))
    toured = run("tour.py")
    assert toured.returncode == 0, toured.stdout + toured.stderr
    for line in [line for block in blocks("bash") for line in block.splitlines()]:
        if not line.startswith("suture ") or "--examples" in line:
            continue
        arguments = shlex.split(line.split("  #")[0])
        done = run("-m", "suture", *arguments[1:])
        expected = 1 if arguments[1] == "diff" else 0  # the two checkpoints do differ
        assert done.returncode == expected, f"{line}\n{done.stdout}\n{done.stderr}"


def test_the_examples_recipe_and_merge_config_are_the_readmes() -> None:
    from suture.cli.examples import MERGE, RECIPE

    assert RECIPE in blocks("yaml") and MERGE in blocks("yaml")
