"""Opening checkpoints: one module per format, `open_source` picks the right one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .._checkpoint import Checkpoint
from .._errors import CheckpointNotFoundError, NotACheckpointError, SurgeryError

FORMATS = ("orbax", "memory")


def open_source(source: Any, *, step: int | None = None, format: str | None = None) -> Checkpoint:  # noqa: A002
    """Opens `source` lazily; see `suture.open`."""
    if isinstance(source, Checkpoint):
        return source
    if format is not None and format not in FORMATS:
        raise SurgeryError(f"Unknown format {format!r}. Known formats: {', '.join(FORMATS)}.")
    if isinstance(source, (str, os.PathLike)):
        if format == "memory":
            raise SurgeryError("format='memory' is for in-memory trees, not paths.")
        return _open_path(Path(source), step)
    if step is not None:
        raise SurgeryError("step= applies to CheckpointManager folders, not in-memory trees.")
    from .memory import open_memory

    return open_memory(source)


def _open_path(path: Path, step: int | None) -> Checkpoint:
    from .orbax import open_orbax

    if not path.exists():
        raise CheckpointNotFoundError(f"No such file or folder: {str(path)!r}. Check the path.")
    if path.is_file():
        raise NotACheckpointError(
            f"{str(path)!r} is a file in a format suture cannot read yet; suture reads Orbax "
            f"checkpoint folders (other formats: see the roadmap in docs/design.md)."
        )
    return open_orbax(path, step=step)
