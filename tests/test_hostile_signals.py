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


# --- an interrupt at any moment of a cold start (issue 37, item 16) ------------------------


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a SIGTERM handler (Python sets SIGINT's alone at start-up; the
    first statement of `import suture` in the `suture` command sets SIGTERM's too)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def _convert_interrupted(tmp_path: Path, signum: int, delay: float) -> subprocess.CompletedProcess:
    """A cold `suture convert` of `tmp_path/src`, sent `signum` `delay` seconds after suture's
    first statement ran (before it, the interpreter's own start-up prints its traceback)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "suture", "convert", "src", "out", "--no-progress"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not _catches_sigterm(process.pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_an_interrupt_during_the_lazy_imports_of_a_cold_start_is_one_line(tmp_path: Path) -> None:
    """The interrupt once landed in `import tensorstore` (ImportError: initialization failed,
    a traceback): Ctrl-C at each moment of the first seconds (suture's own imports, the
    command's lazy ones, the write, the exit) ends with one line and 130, or, once the output
    is whole, with the command's own status."""
    suture.save({f"l{i}": np.ones(4096, np.float32) for i in range(64)}, tmp_path / "src")
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3, 1.6):
        ran = _convert_interrupted(tmp_path, signal.SIGINT, delay)
        assert "Traceback" not in ran.stderr, f"after {delay} s: {ran.stderr}"
        if ran.returncode == 0:  # finished before the signal: a whole output
            assert suture.open(tmp_path / "out")["l3"].read().sum() == 4096
            suture._location.publish.LocalLocation(tmp_path / "out").remove()
            continue
        assert ran.returncode == 130, f"after {delay} s: {ran.returncode} {ran.stderr}"
        lines = ran.stderr.strip().splitlines()
        assert lines and lines[-1].startswith("Stopped by Ctrl-C (SIGINT)"), (
            f"after {delay} s: stderr {ran.stderr!r}, stdout {ran.stdout!r}"
        )
        if lines[-1].endswith("was written in full; it is kept."):  # landed at the commit
            assert suture.open(tmp_path / "out")["l3"].read().sum() == 4096
            suture._location.publish.LocalLocation(tmp_path / "out").remove()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], f"after {delay} s"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
@pytest.mark.parametrize("delay", [0.0, 0.1, 0.4, 0.8])
def test_sigterm_at_a_cold_start_exits_143_and_is_never_called_ctrl_c(
    tmp_path: Path, delay: float
) -> None:
    suture.save({f"l{i}": np.ones(4096, np.float32) for i in range(64)}, tmp_path / "src")
    ran = _convert_interrupted(tmp_path, signal.SIGTERM, delay)
    assert "Traceback" not in ran.stderr and "Ctrl-C" not in ran.stderr, ran.stderr
    if ran.returncode != 0:
        assert ran.returncode == 143, ran.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


WRAPPING_RECIPE = """
import suture


def transform(tree):
    try:
        {inner}
    except BaseException as inner:
        raise {outer} from inner
"""


@pytest.mark.parametrize(
    ("inner", "outer", "code", "line"),
    [
        # what an extension module reports when Ctrl-C lands in its initialization
        (
            "raise KeyboardInterrupt",
            'ImportError("initialization failed")',
            130,
            "Stopped by Ctrl-C",
        ),
        ("raise suture._interrupts.Terminated", "RuntimeError('pool')", 143, "Stopped by SIGTERM"),
        (
            "suture.open('missing_folder')",
            "RuntimeError('a worker failed')",
            2,
            "Error: No such file or folder",
        ),
        (
            "suture.open('missing_folder')",
            "ExceptionGroup('reads', [ValueError('x'), inner])",
            2,
            "Error: No such file or folder",
        ),
    ],
)
def test_a_surgery_error_or_an_interrupt_wrapped_by_another_exception_is_reported_as_itself(
    tmp_path: Path, inner: str, outer: str, code: int, line: str
) -> None:
    """Item 15: whatever wraps them, a SurgeryError is one `Error:` line with exit 2, and an
    interrupt exits 130 (SIGTERM: 143), never a traceback."""
    suture.save({"w": np.ones(4, np.float32)}, tmp_path / "src")
    (tmp_path / "wrap.py").write_text(WRAPPING_RECIPE.format(inner=inner, outer=outer))
    ran = subprocess.run(
        [sys.executable, "-m", "suture", "apply", "wrap.py", "src", "-o", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == code, ran.stderr
    assert "Traceback" not in ran.stderr
    assert ran.stderr.strip().splitlines()[-1].startswith(line), ran.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "wrap.py"]


def test_a_bug_raised_while_handling_a_surgery_error_still_shows_its_traceback(
    tmp_path: Path,
) -> None:
    """Only explicit causes count: an error raised *while handling* one is a failure of its
    own and is not hidden behind the SurgeryError it interrupted."""
    suture.save({"w": np.ones(4, np.float32)}, tmp_path / "src")
    recipe = WRAPPING_RECIPE.format(inner="suture.open('missing_folder')", outer="TypeError('bug')")
    (tmp_path / "bug.py").write_text(recipe.replace(" from inner", ""))
    ran = subprocess.run(
        [sys.executable, "-m", "suture", "apply", "bug.py", "src", "-o", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1 and "TypeError: bug" in ran.stderr, ran.stderr
