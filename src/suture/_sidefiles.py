"""The files of a Hugging Face model folder that are not weights, safely.

``config.json``, ``generation_config.json`` and the tokenizer files travel with the weights
when a folder is converted or saved, so ``from_pretrained`` can load the output. Only
regular files directly inside the folder are taken: a symbolic link, or a name that leads
out of the folder, is skipped with a warning, so converting a folder someone else prepared
never copies a file from elsewhere on the machine (``tokenizer.json -> ~/.ssh/id_rsa``).

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text("{}")
    >>> _ = (folder / "model.safetensors").write_bytes(b"")
    >>> sorted(side_files(folder))
    ['config.json']
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any

from ._errors import SurgeryError
from ._location import LocalLocation, Location, RemoteLocation, location_of

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".ckpt", ".npz")
_CHECKPOINT_FILES = ("commit_success.txt", "manifest.ocdbt")


class SideFileWarning(UserWarning):
    """A file of a model folder that was not copied because it is not a plain file in it."""


def side_files(folder: Path | Location) -> dict[str, Any]:
    """``{name: path}`` of the folder's regular files that are not weights or indexes.

    A remote folder's are `RemoteLocation`s (none for an HTTP folder, which cannot be listed).
    """
    if isinstance(folder, RemoteLocation):
        return _remote_side_files(folder)
    folder = folder.path if isinstance(folder, LocalLocation) else folder
    if not folder.is_dir():
        return {}
    found = {}
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if (
            name.startswith((".", "_"))
            or name.endswith(_WEIGHT_SUFFIXES)
            or name.endswith(".index.json")
            or name in _CHECKPOINT_FILES
            or entry.is_dir()
        ):
            continue
        checked = side_file(folder, name)
        if checked is not None:
            found[name] = checked
    return found


def model_folder_side_files(location: str | os.PathLike | Location) -> dict[str, Any]:
    """`side_files` of a Hugging Face folder (or of the folder of its ``*.index.json``).

    Anything that is not such a folder has none.
    """
    where = location_of(location)
    if isinstance(where, RemoteLocation):
        folder_of = where.parent if where.name.endswith(".index.json") else where
        return side_files(folder_of) if not folder_of.name.endswith(".safetensors") else {}
    folder = Path(str(where))
    if folder.name.endswith(".index.json"):
        folder = folder.parent
    is_model_folder = folder.is_dir() and any(folder.glob("*.safetensors"))
    return side_files(folder) if is_model_folder else {}


def side_file(folder: Path | Location, name: str) -> Any:
    """`folder / name` when it is a regular file inside `folder`; otherwise None and a warning.

    `name` may come from a checkpoint's metadata, so it is checked as untrusted: it must be
    a plain file name, not a link, and resolve to a file inside `folder`.
    """
    if not name or name in (".", "..") or os.sep in name or "/" in name:
        _skip(folder / name, "its name is not a plain file name")
        return None
    if isinstance(folder, RemoteLocation):  # an object store has no links or special files
        return folder / name if (folder / name).is_file() else None
    folder = folder.path if isinstance(folder, LocalLocation) else folder
    path = folder / name
    try:
        status = path.lstat()
    except OSError:
        return None  # gone: nothing to copy
    if stat.S_ISLNK(status.st_mode):
        _skip(path, "it is a symbolic link")
        return None
    if not stat.S_ISREG(status.st_mode):
        _skip(path, "it is not a regular file")
        return None
    if path.resolve().parent != folder.resolve():
        _skip(path, "it resolves outside the model folder")
        return None
    return path


def _skip(path: Path, why: str) -> None:
    warnings.warn(
        f"Not copying {str(path)!r}: {why}. Only regular files inside the model folder are "
        f"copied; copy it by hand if you trust it.",
        SideFileWarning,
        stacklevel=4,
    )


def _remote_side_files(folder: RemoteLocation) -> dict[str, Any]:
    try:
        names, subfolders = folder.children(), set(folder.subfolders())
    except SurgeryError:  # an HTTP folder cannot be listed
        return {}
    if not any(name.endswith(".safetensors") for name in names):
        return {}
    return {
        name: folder / name
        for name in names
        if name not in subfolders
        and not name.startswith((".", "_"))
        and not name.endswith(_WEIGHT_SUFFIXES)
        and not name.endswith(".index.json")
        and name not in _CHECKPOINT_FILES
    }
