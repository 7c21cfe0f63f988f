"""A remote file replaced while a command reads it: every command ends in one `Error:` line
and exit 2 (or, when it read one version whole, a correct result), never a traceback.

The HTTP range server of `tests/remote_servers.py` serves a shard whose bytes change from
its N-th request on (a new ETag), for each N over the requests a command makes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import suture
from tests.remote_servers import Hostile

SHARD = "model-00001-of-00002.safetensors"


def _folder(path: Path, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tree = {name: rng.random((200, 1000), dtype=np.float32) for name in ("a", "b")}
    suture.save(tree, path, format="safetensors", max_shard_size="1MB", progress=False)
    return tree


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "URL"],
        ["convert", "URL", "out"],
        ["convert", "URL", "out", "--format", "safetensors", "--max-memory", "1MB"],
        ["diff", "URL", "first", "--values"],
    ],
    ids=["inspect", "convert", "convert-safetensors", "diff"],
)
def test_a_file_replaced_during_a_command_is_one_error_line(
    http, tmp_path: Path, command: list[str]
) -> None:
    first = _folder(tmp_path / "first", 1)
    second = _folder(tmp_path / "second", 2)
    name = f"replaced-{command[0]}-{len(command)}"
    url = http.publish(tmp_path / "first", name)
    replaced_at = []
    for after in (1, 2, 3):  # 0 reads the replacement whole, as any later opening would
        http.server.hostile[f"/{name}/{SHARD}"] = Hostile(
            after=after, body=(tmp_path / "second" / SHARD).read_bytes()
        )
        arguments = [url if part == "URL" else part for part in command]
        ran = subprocess.run(
            [sys.executable, "-m", "suture", *arguments],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in ran.stderr, ran.stderr
        if ran.returncode == 2:
            replaced_at.append(after)
            assert ran.stderr.startswith("Error: ") and "changed since it was opened" in ran.stderr
            assert not (tmp_path / "out").exists()
        else:
            # diff: 1 when it read the replaced version whole (the values differ)
            assert ran.returncode in ((0, 1) if command[0] == "diff" else (0,)), ran.stderr
            if command[0] == "convert":  # read whole from one version: never a mixture
                written = suture.open(tmp_path / "out")
                values = {key: written[key].read() for key in ("a", "b")}
                # 'a' is the replaced shard's, read from one version; 'b' the other shard's
                assert any(np.array_equal(values["a"], v["a"]) for v in (first, second))
                np.testing.assert_array_equal(values["b"], first["b"])
                suture._location.LocalLocation(tmp_path / "out").remove()
    assert replaced_at, "the replacement was never seen: the test does not test anything"
