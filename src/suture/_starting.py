"""The `suture` command's first moments: Ctrl-C or SIGTERM while it imports stops it at once.

`suture/__init__.py` calls `install_while_starting` as its first statement, before the
fifth of a second its imports take, where an interrupt would print an import's traceback;
the command line's own handlers (`_interrupts.install`) take over once it runs. Only the
interpreter's own modules are used here (``_signal``: ``signal`` imports ``enum`` first), so
that the window before it is as short as Python allows.

Example:
    >>> install_while_starting()  # a library import: nothing changes
"""

from __future__ import annotations

import _signal
import os
import sys

STOPPED = "Stopped by {}; no output was written and the temporary files were removed."


def install_while_starting() -> None:
    """When this process is the `suture` command, stops it at once, in one line, on Ctrl-C or
    SIGTERM until the command line's handlers take over: before the command runs there is
    nothing to clean up.

    Nothing changes for a program that imports suture as a library, or that set handlers.
    """
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    as_module = list(getattr(sys, "orig_argv", []))[1:3] == ["-m", "suture"]
    if not (program in ("suture", "suture.exe") or as_module):
        return
    for signum in (_signal.SIGINT, _signal.SIGTERM):
        try:
            if _signal.getsignal(signum) in (_signal.default_int_handler, _signal.SIG_DFL):
                _signal.signal(signum, _stop_at_once)
        except ValueError:  # not the main thread: the program's own business
            return


def stopped_line(signum: int, finished: tuple[str, ...] = ()) -> str:
    """The one line the command line prints when `signum` stops it, after the outputs
    `finished` were put in place whole, if any.

    Example:
        >>> stopped_line(_signal.SIGINT, ("out",))
        "Stopped by Ctrl-C (SIGINT) after 'out' was written in full; it is kept."
    """
    name = "SIGTERM" if signum == _signal.SIGTERM else "Ctrl-C (SIGINT)"
    if not finished:
        return STOPPED.format(name)
    named = ", ".join(repr(output) for output in finished)
    kept = "it is kept" if len(finished) == 1 else "they are kept"
    return f"Stopped by {name} after {named} was written in full; {kept}."


def stopped_status(signum: int) -> int:
    """The exit status of a command `signum` stopped: 143 for SIGTERM, 130 for Ctrl-C."""
    return 143 if signum == _signal.SIGTERM else 130


def _stop_at_once(signum: int, frame: object) -> None:
    os.write(_standard_error(), (stopped_line(signum) + "\n").encode())
    os._exit(stopped_status(signum))


def _standard_error() -> int:
    """Where `sys.stderr` writes: once the command line filters descriptor 2 through a pipe
    (`suture.cli.quiet`), a line written there would die with the process unforwarded."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no stderr, or not a file
        return 2
