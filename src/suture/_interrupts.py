"""Ctrl-C and SIGTERM on the command line: raised where Python can unwind, held over native calls.

The CLI turns SIGINT into `KeyboardInterrupt` and SIGTERM into `Terminated`, raised in the
main thread, so a write drops its queued blocks, removes its temporary output and exits
(130 or 143). Raised inside a native call that runs Python (jax tracing) or that keeps
working in the background once interrupted (TensorStore creating an array), the exception
would abort the process or let files appear after the cleanup; so inside `native_call()`
it waits until the call returns.

Example:
    >>> with native_call():
    ...     pass
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ._starting import stopped_line as stopped_line
from ._starting import stopped_status as stopped_status

_held: dict[str, Any] = {"depth": 0, "pending": None}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so that a write cleans up and stops."""


def install() -> None:
    """Routes SIGINT and SIGTERM through the handler (main thread only; the CLI calls it)."""
    _finished.clear()  # a command's own outputs only
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)


_done: dict[str, int | None] = {"code": None}
# the latest outputs finished; bounded, as a program may save many times in one process
_finished: collections.deque[str] = collections.deque(maxlen=16)


def record_finished(output: str) -> None:
    """Notes that `output` is written in full and in place (a save's commit): an interruption
    after it says so on the command line, instead of that nothing was written."""
    _finished.append(output)


def finished_outputs() -> tuple[str, ...]:
    """The outputs this process finished (`record_finished`), oldest first."""
    return tuple(_finished)


def exit_promptly_when_done() -> None:
    """Registers the command line's last step (call it before the command runs, so that the
    libraries' exit handlers registered meanwhile run first): once `install_when_done` gave
    the status, the process ends with it after the threads and those handlers, skipping the
    interpreter's teardown, during which a signal would kill it with no word (Python resets
    the handlers first)."""
    atexit.register(_exit_if_done)


def install_when_done(code: int) -> None:
    """Once a command's work is done, Ctrl-C or SIGTERM ends the process at once with the
    command's own status `code`: its output is finished, and an interrupt that landed in the
    libraries' exit handlers would otherwise make a success look stopped."""
    _done["code"] = code
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_with_status)


def _exit_with_status(signum: int, frame: Any) -> None:
    _exit_if_done()


def _exit_if_done() -> None:
    code = _done["code"]
    if code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _handler(signum: int, frame: Any) -> None:
    interruption = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    if _held["depth"]:
        _held["pending"] = _held["pending"] or interruption
        return
    raise interruption


@contextlib.contextmanager
def native_call() -> Iterator[None]:
    """Holds an interruption that arrives inside the block until the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        pending = _held["pending"]
        if not _held["depth"] and pending is not None:
            _held["pending"] = None
            raise pending
