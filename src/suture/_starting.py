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


def _stop_at_once(signum: int, frame: object) -> None:
    terminated = signum == _signal.SIGTERM
    line = STOPPED.format("SIGTERM" if terminated else "Ctrl-C (SIGINT)")
    os.write(2, (line + "\n").encode())
    os._exit(143 if terminated else 130)
