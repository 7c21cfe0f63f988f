"""Ctrl-C at each line of a save's set-up: nothing is left behind, whichever line it lands on.

A real SIGINT is sent to this process (handled as the command line handles it) when a traced
line is reached, once per line: the interrupt then lands exactly there, not at a moment a
timer happens to hit (as in `test_hostile_signals`, where these windows showed one run in
eight).
"""

from __future__ import annotations

import dis
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import suture
from suture import _interrupts
from suture._location import publish
from suture._location.base import LocalLocation
from suture._save import writer
from suture.sinks.orbax import OrbaxSink


def _interrupted_at_each_line(functions: list[Any], run: Callable[[], Any]) -> Iterator[str]:
    """Runs `run` once for each line that the code of `functions` executes, with SIGINT sent
    when that line is reached; yields ``name:line`` after each run (until a run ends first)."""
    codes = {getattr(f, "__wrapped__", f).__code__ for f in functions}
    previous_handler, previous_trace = signal.getsignal(signal.SIGINT), sys.gettrace()
    _interrupts.install()
    try:
        at = 1
        while True:
            state: dict[str, Any] = {"seen": 0, "where": None, "at": at}
            sys.settrace(_tracer(codes, state))
            try:
                run()
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(previous_trace)
            if state["where"] is None:
                return
            yield state["where"]
            at += 1
    finally:
        signal.signal(signal.SIGINT, previous_handler)


def _tracer(codes: set[Any], state: dict[str, Any]) -> Any:
    """A trace function sending SIGINT at the `state["at"]`-th line run in `codes`. A line
    that starts with a NOP (a ``try:``) is skipped: Python runs a signal's handler only at a
    call or a jump back, never there, and no exception handler covers that NOP."""

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and dis.opname[frame.f_code.co_code[frame.f_lasti]] != "NOP":
            state["seen"] += 1
            if state["seen"] == state["at"]:
                state["where"] = f"{frame.f_code.co_name}:{frame.f_lineno}"
                signal.raise_signal(signal.SIGINT)
        return on_line

    return lambda frame, event, arg: on_line if frame.f_code in codes else None


def _left_beside(folder: Path, *kept: str) -> list[str]:
    """What a save left in `folder` besides `kept`; a finished output is removed (an
    interrupt after the commit finds it whole)."""
    if (folder / "out").exists():
        LocalLocation(folder / "out").remove()
    return sorted(p.name for p in folder.iterdir() if p.name not in kept)


@pytest.mark.skipif(sys.platform == "win32", reason="raises SIGINT in this process")
def test_an_interrupt_while_the_arrays_are_created_leaves_no_temporary_folder(
    tmp_path: Path,
) -> None:
    """The arrays of an Orbax output are created in TensorStore's threads from the first
    leaf on; interrupted before the writer held the way to wait for them, the abort removed
    the temporary folder while they went on creating files in it."""
    tree = {name: np.arange(4096, dtype=np.float32) for name in ("a", "b")}
    save = lambda: suture.save(tree, tmp_path / "out", progress=False)  # noqa: E731
    lines = [writer.orbax_blocks, writer._sink_blocks, OrbaxSink._open, OrbaxSink.add_array]
    reached = []
    for where in _interrupted_at_each_line(lines, save):
        reached.append(where)
        assert _left_beside(tmp_path) == [], f"interrupted at {where}"
    time.sleep(0.2)  # what TensorStore still created after an abort shows by now
    assert _left_beside(tmp_path) == [], f"interrupted at one of {reached}"
    assert any(where.startswith("_open") for where in reached), reached


@pytest.mark.skipif(sys.platform == "win32", reason="raises SIGINT in this process")
@pytest.mark.parametrize("format", ["orbax", "safetensors"])
def test_an_interrupt_while_locking_or_unlocking_leaves_no_lock(
    tmp_path: Path, format: str
) -> None:
    """A lock left by a live process would refuse the next save of that destination."""
    save = lambda: suture.save({"a": np.ones(8, np.float32)}, tmp_path / "out", format=format)  # noqa: E731
    lines = [publish.exclusive, publish._try_create, publish._release]
    reached = []
    for where in _interrupted_at_each_line(lines, save):
        reached.append(where)
        assert _left_beside(tmp_path) == [], f"interrupted at {where}"
    assert any(where.startswith("_release") for where in reached), reached


def test_a_bad_leaf_after_the_arrays_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """The same window, reached by an error: the leaf that an Orbax checkpoint cannot hold
    comes after arrays whose creation has started."""
    tree: dict[str, Any] = {f"a{i}": np.ones(4096, np.float32) for i in range(32)}
    tree["z"] = object()
    for _ in range(3):
        with pytest.raises(suture.UnsupportedError, match="'z' is a object"):
            suture.save(tree, tmp_path / "out", progress=False)
    time.sleep(0.2)  # what TensorStore still created after the abort shows by now
    assert _left_beside(tmp_path) == []


STOPPED_WHILE_FILTERING = """
import signal
from suture._starting import _stop_at_once
from suture.cli.quiet import quiet_native_logs
quiet_native_logs()  # what the command line does first, before it installs its own handlers
_stop_at_once(signal.SIGINT, None)  # Ctrl-C in between, as the start-up handler takes it
"""


def test_ctrl_c_before_the_command_line_handlers_is_said_once_stderr_is_filtered() -> None:
    """Between the filtering of descriptor 2 and the command line's own handlers, the
    start-up handler wrote its line into the filter's pipe and exited before the thread that
    forwards it ran: exit 130 with nothing said (the cold-start test's empty stderr)."""
    ran = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_FILTERING], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 130
    assert ran.stderr.startswith("Stopped by Ctrl-C (SIGINT)"), ran.stderr
