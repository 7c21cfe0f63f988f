"""A rich progress bar for long writes: bytes, leaves and throughput, on a terminal only."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .._format import human_bytes
from .runner import Progress


def wants_progress(progress: bool | None) -> bool:
    """``progress=None`` means: show it when stderr is a terminal."""
    return sys.stderr.isatty() if progress is None else bool(progress)


@contextmanager
def progress_bar(
    description: str, total_bytes: int, enabled: bool
) -> Iterator[Callable[[Progress], None] | None]:
    """Yields a callback that updates a bar on stderr (or None when disabled)."""
    if not enabled:
        yield None
        return
    from rich.console import Console  # loaded only when a bar is shown
    from rich.progress import (  # loaded only when a bar is shown
        BarColumn,
        TextColumn,
        TimeRemainingColumn,
    )
    from rich.progress import Progress as RichProgress  # loaded only when a bar is shown

    total = human_bytes(total_bytes)
    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[done]} / " + total),
        TextColumn("{task.fields[leaves]}"),
        TextColumn("{task.fields[speed]}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )
    with bar:
        task = bar.add_task(description, total=max(total_bytes, 1), done="0 B", leaves="", speed="")

        def update(progress: Progress) -> None:
            bar.update(
                task,
                completed=progress.written_bytes,
                done=human_bytes(progress.written_bytes),
                leaves=f"{progress.written_leaves}/{progress.total_leaves} leaves",
                speed=f"{human_bytes(progress.throughput)}/s",
            )

        yield update


@contextmanager
def leaf_progress(
    description: str, total_bytes: int, total_leaves: int, enabled: bool
) -> Iterator[Callable[[int], None]]:
    """Yields ``done(nbytes)``, to call (from any thread) as each leaf is finished."""
    progress = Progress(total_bytes, total_leaves, started=time.perf_counter())
    lock = threading.Lock()
    with progress_bar(description, total_bytes, enabled) as update:

        def done(nbytes: int) -> None:
            with lock:
                progress.written_bytes += nbytes
                progress.written_leaves += 1
                if update is not None:
                    update(progress)

        yield done
