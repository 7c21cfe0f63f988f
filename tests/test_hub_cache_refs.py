"""A Hugging Face cache's ref file (``refs/main``, a commit) read with a cap, in a cache made here.

A model id (``org/name``) or an offline ``hf://org/name`` opens the snapshot its ref names;
the ref is read no further than a commit needs, and one that holds anything else is an
error naming the file, not a multi-gigabyte read nor a "not in the cache".
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import suture
from suture.cli import app

runner = CliRunner()
COMMIT = "0123456789abcdef0123456789abcdef01234567"
WEIGHT = np.arange(6.0, dtype=np.float32).reshape(2, 3)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding ``org/model`` at `COMMIT` (its ref not yet written), offline."""
    root = tmp_path / "hf-cache"
    snapshot = root / "models--org--model" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    save_file({"w": WEIGHT}, snapshot / "model.safetensors")
    (root / "models--org--model" / "refs").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # `org/model` is no local path here
    return root / "models--org--model" / "refs" / "main"


def test_a_ref_naming_a_commit_opens_its_snapshot(cache: Path) -> None:
    cache.write_text(COMMIT + "\n")
    np.testing.assert_array_equal(suture.open("org/model")["w"].read(), WEIGHT)
    np.testing.assert_array_equal(suture.open("hf://org/model")["w"].read(), WEIGHT)


def test_a_huge_ref_is_refused_after_a_few_bytes(cache: Path) -> None:
    with open(cache, "wb") as stream:  # 64 MiB, sparse: made at once, never read whole
        stream.write(COMMIT.encode())
        os.truncate(stream.fileno(), 64 << 20)
    for name in ("org/model", "hf://org/model"):
        with pytest.raises(suture.CorruptCheckpointError, match=r"holds more than 256 bytes"):
            suture.open(name)
    shown = runner.invoke(app, ["inspect", "org/model"])
    assert shown.exit_code == 2 and "Traceback" not in shown.output
    assert "refs/main" in shown.output and "should hold a commit (40 hex digits)" in shown.output
    assert "hf download org/model" in shown.output
    assert cache.stat().st_size == 64 << 20  # the cache is left as it was


def test_a_ref_holding_something_else_says_what(cache: Path) -> None:
    cache.write_text("not-a-commit\n")
    with pytest.raises(suture.CorruptCheckpointError, match=r"holds 'not-a-commit'\. The cache is"):
        suture.open("org/model")
    assert cache.read_text() == "not-a-commit\n"
