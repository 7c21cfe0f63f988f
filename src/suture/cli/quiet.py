"""The native libraries' log lines, kept off the command line's standard error.

TensorStore's drivers log through absl what their credential lookups try and miss. The GCS
driver's ``E... google_auth_provider.cc:188] Could not find the credentials file ...`` comes
before every gs:// command's answer on a machine without gcloud credentials; the S3 driver
logs what the AWS credential chain tries and misses (``E... AuthCredentialsProvider:6146]
Failed to build config profile collection from file at (~/.aws/config)``), at error level, on every ``s3://`` command of a machine without
that file, though the chain then finds its credentials elsewhere. absl writes them to file
descriptor 2 and TensorStore sets its threshold at import, so they are filtered there: the
command line's descriptor 2 becomes a pipe read by a thread that passes every other line
on. Python's own ``sys.stderr`` keeps the original descriptor, so errors, warnings and
progress bars (which look for a terminal) go straight out. ``suture --debug`` keeps them.

Example:
    >>> bool(NATIVE_LINE.match(b"E1125 13:20:25.082837   26562 AuthCredentialsProvider:6146] x"))
    True
    >>> bool(NATIVE_LINE.match(b"E1128 09:12:01.000001   26570 google_auth_provider.cc:188] x"))
    True
    >>> bool(NATIVE_LINE.match(b"F1128 09:12:01.000001   26570 google_auth_provider.cc:188] x"))
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

# absl's prefix (severity, date, time, thread, file:line); fatal lines always pass
NATIVE_LINE = re.compile(rb"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ :\]]+:\d+\] ")
_installed: list[int] = []


def quiet_native_logs() -> None:
    """Filters the native libraries' lines out of descriptor 2 for the rest of the process."""
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
            _write(
                terminal, b"".join(line + b"\n" for line in lines if not NATIVE_LINE.match(line))
            )
    if pending and not NATIVE_LINE.match(pending):
        _write(terminal, pending)


def _write(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(descriptor, view) :]
        except OSError:  # the terminal went away: nothing left to show
            return
