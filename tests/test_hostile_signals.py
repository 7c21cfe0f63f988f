"""Ctrl-C and SIGTERM during a write: the work stops at once, nothing is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import suture

# Each block sleeps 0.2 s (a map with its shape given runs only when read), so the 160
# blocks take seconds: running the queue out (what Ctrl-C used to wait for) shows plainly.
SLOW_RECIPE = """
import time
from pathlib import Path

import suture

STARTED = Path(__file__).with_name("started")


def slow(x):
    STARTED.touch()
    time.sleep(0.2)
    return x + 1


def transform(tree):
    return {key: suture.map(slow, leaf, shape=leaf.shape, dtype=leaf.dtype) for key, leaf in tree.items()}
"""


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_write_within_a_second(tmp_path: Path, signum: int, code: int) -> None:
    """Item 11: queued blocks used to run to the end (seconds to hours) after Ctrl-C."""
    suture.save(
        {f"l{i}": np.ones(256, np.float32) for i in range(160)}, tmp_path / "src", progress=False
    )
    (tmp_path / "slow.py").write_text(SLOW_RECIPE)
    process = subprocess.Popen(
        [sys.executable, "-m", "suture", "apply", "slow.py", "src", "-o", "out", "--no-progress"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)  # a few blocks written, most still queued
    sent = time.monotonic()
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    elapsed = time.monotonic() - sent
    assert process.returncode == code, stderr.decode()
    assert "no output was written and the temporary files were removed" in stderr.decode()
    assert elapsed < 1.5, f"stopped {elapsed:.2f} s after the signal"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.py", "src", "started"]
