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


def time_left(elapsed: float, done: float, total: float) -> float | None:
    """Seconds left at the average speed so far; None until it means something (a second
    and 2% in), since the first blocks (opening files, starting threads) are no guide:
    rich's own estimate said minutes for a six-second write.

    Example:
        >>> time_left(0.3, 10, 100) is None, time_left(3.0, 50, 100)
        (True, 3.0)
    """
    if elapsed < 1.0 or total <= 0 or done < 0.02 * total:
        return None
    return elapsed * (total - done) / done


class Eta:
    """Time left at the speed since the first bytes were written (`time_left` of what came
    after them): the time before them (opening files, reading the first blocks, compiling)
    says nothing of the speed, and counted in it made early estimates far too long.

    Example:
        >>> eta = Eta()  # 5 s before the first 10 bytes, then 10 bytes a second
        >>> eta(5.0, 10, 100), eta(7.0, 30, 100)
        (None, 7.0)
    """

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None

    def __call__(self, elapsed: float, done: float, total: float) -> float | None:
        if done <= 0:
            return None
        if self.first is None:
            self.first = (elapsed, done)
            return None
        started, before = self.first
        return time_left(elapsed - started, done - before, total - before)


def human_seconds(seconds: float) -> str:
    """``7 s``, ``2 min 5 s``, ``1 h 3 min``.

    Example:
        >>> human_seconds(6.4), human_seconds(125), human_seconds(3780)
        ('7 s', '2 min 5 s', '1 h 3 min')
    """
    whole = int(seconds + 0.999)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


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
        ProgressColumn,
        TextColumn,
    )
    from rich.progress import Progress as RichProgress  # loaded only when a bar is shown
    from rich.text import Text  # loaded only when a bar is shown

    eta = Eta()

    class Remaining(ProgressColumn):
        """Time left at the speed since the first bytes were written (`Eta`)."""

        def render(self, task: object) -> Text:
            left = eta(task.elapsed or 0.0, task.completed, task.total or 1)  # type: ignore[attr-defined]
            return Text("" if left is None else f"{human_seconds(left)} left", style="cyan")

    total = human_bytes(total_bytes)
    bar = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[done]} / " + total),
        TextColumn("{task.fields[leaves]}"),
        TextColumn("{task.fields[speed]}"),
        Remaining(),
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
