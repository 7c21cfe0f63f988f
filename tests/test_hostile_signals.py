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

# Each block sleeps 0.2 s, so the 160 blocks take about 8 s on 4 threads: long enough that
# running the queue out (what Ctrl-C used to wait for) is plain in the timing.
SLOW_RECIPE = """
import time
from pathlib import Path

import numpy as np
import suture
from suture import rules

STARTED = Path(__file__).with_name("started")


def slow(x):
    if isinstance(x, suture.LazyArray):
        np.asarray(x)  # refuses to read: the rule becomes a lazy map, run block by block
    if isinstance(x, np.ndarray):
        STARTED.touch()
        time.sleep(0.2)
    return x + 1


RULES = [rules.map_values(r"l\\d+", slow)]
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
