"""`suture.open`: the one entry point to every source."""

from __future__ import annotations

from typing import Any

from ._checkpoint import Checkpoint
from .sources import open_source


def open(source: Any, *, step: int | None = None, format: str | None = None) -> Checkpoint:  # noqa: A001,A002
    """Opens a checkpoint lazily: reads metadata only, never array data.

    Args:
        source: a path to an Orbax checkpoint (a v0 ``StandardCheckpointer`` or
            ``PyTreeCheckpointer`` folder, a v1 ``ocp.save`` folder, a CheckpointManager
            root or one of its steps), an in-memory pytree, or an opened `Checkpoint`.
        step: for a CheckpointManager root, which step to open (default: the newest).
        format: force a format instead of detecting it (``"orbax"``, ``"memory"``).

    Returns:
        A `Checkpoint` whose ``.tree`` holds `LazyArray` leaves.

    Raises:
        SurgeryError: the path does not exist, is empty, is not a checkpoint, or is an
            unfinished save; the message names the path and what was found.

    Example:
        >>> import numpy as np, suture
        >>> ckpt = suture.open({"params": {"kernel": np.ones((2, 2), np.float32)}})
        >>> ckpt["params/kernel"].shape
        (2, 2)
    """
    return open_source(source, step=step, format=format)
