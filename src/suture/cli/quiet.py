"""The AWS libraries' log lines, kept off the command line's standard error.

TensorStore's S3 driver logs through absl what the AWS credential chain tries and misses
(``E... AuthCredentialsProvider:6146] Failed to build config profile collection from file
at (~/.aws/config)``), at error level, on every ``s3://`` command of a machine without
that file, though the chain then finds its credentials elsewhere. absl writes them to file
descriptor 2 and TensorStore sets its threshold at import, so they are filtered there: the
command line's descriptor 2 becomes a pipe read by a thread that passes every other line
on. Python's own ``sys.stderr`` keeps the original descriptor, so errors, warnings and
progress bars (which look for a terminal) go straight out. ``suture --debug`` keeps them.

Example:
    >>> bool(AWS_LINE.match(b"E1125 13:20:25.082837   26562 AuthCredentialsProvider:6146] x"))
    True
    >>> bool(AWS_LINE.match(b"I1125 13:20:25.649268   26570 google_auth_provider.cc:136] x"))
    False
"""

from __future__ import annotations

import atexit
import faulthandler
import io
import os
import re
import sys
import threading

# absl's prefix, then a location that is an AWS log subject (a name with no source-file
# extension, or aws_api.cc where the subject has none); fatal lines always pass
AWS_LINE = re.compile(
    rb"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ (?:aws_api\.cc|[A-Za-z][A-Za-z0-9_-]*):\d+\] "
)
_installed: list[int] = []


def quiet_native_logs() -> None:
    """Filters the AWS libraries' lines out of descriptor 2 for the rest of the process."""
    if _installed:
        return
    try:
        terminal = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no standard error to filter
        return
    sys.stderr.flush()
    sys.stderr = io.TextIOWrapper(
        io.FileIO(os.dup(terminal), "w"),
        encoding=sys.stderr.encoding,
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )
    if faulthandler.is_enabled():  # a crash report must not wait in the pipe
        faulthandler.enable(file=sys.stderr)
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=_forward, args=(read_end, terminal), daemon=True)
    thread.start()
    _installed.append(terminal)

    @atexit.register
    def restore() -> None:  # the pipe's last writer closes: the thread reads to its end
        os.dup2(terminal, 2)
        thread.join(timeout=1)


def _forward(read_end: int, terminal: int) -> None:
    pending = b""
    with open(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 16):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            _write(terminal, b"".join(line + b"\n" for line in lines if not AWS_LINE.match(line)))
    if pending and not AWS_LINE.match(pending):
        _write(terminal, pending)


def _write(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(descriptor, view) :]
        except OSError:  # the terminal went away: nothing left to show
            return
