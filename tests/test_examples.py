"""The scripts in examples/ run, each in its own process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(script: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()


def test_there_are_examples() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "linen_to_nnx",
        "add_lora",
        "eval_params_only",
        "many_hosts",
    }


def test_many_hosts_save_to_a_bucket(tmp_path: Path, gcs: str) -> None:
    """The guide's "many hosts, one bucket" example, with two processes and a gs:// prefix."""
    script = Path(__file__).resolve().parent.parent / "examples" / "many_hosts.py"
    url = f"{gcs}/many-hosts/stacked"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{url}: params/layers (4, 256, 256) bfloat16" in done.stdout
    assert "process 1: wrote" in done.stdout
