"""Opening checkpoints: one module per format; `open_source` detects which one by content."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

from .._checkpoint import Checkpoint
from .._errors import CheckpointNotFoundError, NotACheckpointError, SurgeryError

FORMATS = ("orbax", "safetensors", "msgpack", "npz", "torch", "memory")


def open_source(
    source: Any,
    *,
    step: int | None = None,
    format: str | None = None,  # noqa: A002
    separator: str = ".",
    allow_pickle: bool = False,
) -> Checkpoint:
    """Opens `source` lazily; see `suture.open`."""
    if isinstance(source, Checkpoint):
        return source
    if format is not None and format not in FORMATS:
        raise SurgeryError(f"Unknown format {format!r}. Known formats: {', '.join(FORMATS)}.")
    if not isinstance(source, (str, os.PathLike)):
        if step is not None:
            raise SurgeryError("step= applies to CheckpointManager folders, not in-memory trees.")
        from .memory import open_memory

        return open_memory(source)
    if format == "memory":
        raise SurgeryError("format='memory' is for in-memory trees, not paths.")
    path = Path(source)
    if not path.exists():
        raise CheckpointNotFoundError(f"No such file or folder: {str(path)!r}. Check the path.")
    if not (path.is_dir() or path.is_file()):
        raise NotACheckpointError(
            f"{str(path)!r} is neither a regular file nor a folder (a pipe, socket or device), "
            f"so it cannot be read lazily, and reading it could wait forever. Save the stream "
            f"to a file first."
        )
    kind = format or detect(path)
    if step is not None and kind != "orbax":
        raise SurgeryError(f"step= applies to Orbax CheckpointManager folders, not {kind} files.")
    if kind == "orbax":
        from .orbax import open_orbax

        return open_orbax(path, step=step)
    if kind == "safetensors":
        from .safetensors import open_safetensors

        return open_safetensors(path, separator)
    if kind == "msgpack":
        from .msgpack import open_msgpack

        return open_msgpack(path)
    if kind == "npz":
        from .npz import open_npz

        return open_npz(path)
    from .torch import open_torch

    return open_torch(path, allow_pickle, separator)


def detect(path: Path) -> str:
    """The format of `path`, from its content (and, for folders, what they hold).

    Raises:
        NotACheckpointError: when no known format matches; the message says what was found.
    """
    if path.is_dir():
        from .orbax_layout import is_orbax_folder, resolve

        if is_orbax_folder(path):
            return "orbax"
        if any(path.glob("*.safetensors")) or any(path.glob("*.safetensors.index.json")):
            return "safetensors"
        resolve(path)  # raises the Orbax layout's own explanation of what the folder holds
        return "orbax"
    if path.name.endswith(".safetensors.index.json"):
        return "safetensors"
    with open(path, "rb") as stream:
        head = stream.read(16)
    if head[:4] == b"PK\x03\x04":
        return _zip_kind(path)
    if (
        len(head) >= 9
        and head[8:9] == b"{"
        and int.from_bytes(head[:8], "little") <= path.stat().st_size - 8
    ):
        return "safetensors"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] in (2, 3, 4, 5):
        return "torch"  # a legacy (non-zip) torch.save pickle
    if head[:1] and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return "msgpack"
    raise NotACheckpointError(
        f"{str(path)!r} is a file in no format suture knows (it starts with {head[:8]!r}). "
        f"suture reads Orbax folders, safetensors, Flax msgpack, npz and PyTorch files; pass "
        f"format= if the content is one of them."
    )


def _zip_kind(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile as error:
        raise NotACheckpointError(
            f"{str(path)!r} looks like a zip archive but cannot be read: {error}."
        ) from error
    if any(name.endswith("data.pkl") for name in names):
        return "torch"
    if names and all(name.endswith(".npy") for name in names):
        return "npz"
    raise NotACheckpointError(
        f"{str(path)!r} is a zip archive holding {', '.join(names[:5]) or 'nothing'}, neither an "
        f".npz nor a PyTorch file."
    )
