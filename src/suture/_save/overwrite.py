"""The overwrite policy: what ``overwrite=True`` may replace.

Overwrite replaces only what suture would itself have written at the destination: a
checkpoint (an Orbax folder, a safetensors file or folder) and the side files that travel
with a model (``config.json``, tokenizer files ...). A folder that also holds anything else
(``.git``, ``src/train.py``, ``notes.txt``) is somebody's project, not an output, and is
refused with the first foreign entry named; so is anything suture cannot open as a
checkpoint. The same rule holds on every object store, where "the folder" is the prefix.
The replacement itself (atomic, never a moment without a result) is
`suture._location.publish.replace`.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "model.safetensors").write_bytes(b"")
    >>> _ = (folder / "config.json").write_text("{}")
    >>> (folder / "src").mkdir(); _ = (folder / "src" / "train.py").write_text("")
    >>> first_foreign_entry(LocalLocation(folder))
    'src/train.py'
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from .._errors import DestinationError, SurgeryError
from .._location import LocalLocation, Location
from .._location.publish import is_unfinished
from ..sources.detect import detect

# What an Orbax save writes (orbax-checkpoint 0.12: PyTreeCheckpointer, CheckpointManager
# steps and items, with and without OCDBT) and what suture's safetensors writer writes.
_CHECKPOINT_FILES = {
    "_METADATA",
    "_CHECKPOINT_METADATA",
    "_ROOT_METADATA",
    "_sharding",
    "_strings.json",
    "manifest.ocdbt",
    "commit_success.txt",
    ".zarray",
    ".zattrs",
    ".zgroup",
    "zarr.json",
}
_CHECKPOINT_FILE_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
# Folders whose whole content is Orbax's or TensorStore's own.
_DATA_FOLDERS = re.compile(r"d|array_metadatas|descriptor|ocdbt\.process_\d+")
# The side files of a Hugging Face model folder, as the Hub and its libraries name them.
KNOWN_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "*.model",
    "chat_template*",
    "params.json",
    "modules.json",
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "README.md",
    "LICENSE*",
    "NOTICE*",
    "USE_POLICY.md",
    "mergekit_config.yml",
)
# sentence-transformers' module folders (``1_Pooling/config.json``, ``2_Normalize``).
_MODULE_FOLDER = re.compile(r"\d+_[A-Za-z]+")
_MAX_DEPTH = 4  # a CheckpointManager root / step / item / leaf folder


def check_replaceable(destination: Location) -> None:
    """Refuses to overwrite anything that is not wholly a checkpoint suture could have written.

    An unfinished Orbax save (no commit) may be replaced deliberately, as long as it holds
    nothing else: that is how a dead writer's leftovers are taken over.

    Raises:
        DestinationError: `destination` is not a checkpoint, or holds foreign entries.
    """
    if not is_unfinished(destination):
        try:
            detect(destination)
        except (SurgeryError, OSError) as error:
            raise DestinationError(
                f"--overwrite replaces only a checkpoint, and {str(destination)!r} is not one "
                f"that suture recognizes ({error}). Remove it yourself if it should go, or "
                f"write elsewhere."
            ) from None
    foreign = first_foreign_entry(destination)
    if foreign is not None:
        raise DestinationError(
            f"--overwrite replaces only what suture writes (a checkpoint and its side files "
            f"such as config.json), and {str(destination)!r} also holds {foreign!r}, which "
            f"suture did not write. Nothing was changed. Write elsewhere, or move the "
            f"checkpoint's files out and remove the rest yourself."
        )


def first_foreign_entry(destination: Location) -> str | None:
    """The first entry (a path relative to `destination`) suture would never have written there.

    A file destination has none; a folder or prefix is walked (at most a few levels deep,
    as deep as a CheckpointManager's leaf folders).
    """
    if not destination.is_dir():
        return None
    return _foreign_in(destination, "", 0)


def _foreign_in(folder: Location, prefix: str, depth: int) -> str | None:
    subfolders = set(folder.subfolders())
    for name in folder.children():
        entry = folder / name
        relative = f"{prefix}{name}"
        if _is_link(entry):
            return relative  # suture never writes links
        if name not in subfolders and not (isinstance(entry, LocalLocation) and entry.is_dir()):
            if not _is_checkpoint_file(name, depth):
                return relative
            continue
        if _DATA_FOLDERS.fullmatch(name) or _is_zarr_array(entry):
            continue
        if depth == 0 and _MODULE_FOLDER.fullmatch(name):
            found = _foreign_in(entry, f"{relative}/", _MAX_DEPTH)  # side files only
        elif depth + 1 < _MAX_DEPTH and entry.children():
            found = _foreign_in(entry, f"{relative}/", depth + 1)
        else:
            return f"{relative}/"  # empty, or deeper than any checkpoint goes
        if found is not None:
            return found
    return None


def _is_checkpoint_file(name: str, depth: int) -> bool:
    if name in _CHECKPOINT_FILES or _matches(name, _CHECKPOINT_FILE_PATTERNS):
        return True
    # side files sit at the top of a model folder (or in a sentence-transformers module)
    return (depth == 0 or depth == _MAX_DEPTH) and _matches(name, KNOWN_SIDE_FILES)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _is_zarr_array(folder: Location) -> bool:
    """A leaf folder of an Orbax checkpoint without OCDBT (zarr metadata and chunks)."""
    return (folder / ".zarray").is_file() or (folder / "zarr.json").is_file()


def _is_link(entry: Any) -> bool:
    return isinstance(entry, LocalLocation) and entry.path.is_symlink()
