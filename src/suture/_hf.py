"""Hugging Face folder conventions: the side files beside the weights, and the layout record.

Side files, safely:

``config.json``, ``generation_config.json`` and the tokenizer files travel with the weights
when a folder is converted or saved, so ``from_pretrained`` can load the output. Only
regular files directly inside the folder are taken: a symbolic link, or a name that leads
out of the folder, is skipped with a warning, so converting a folder someone else prepared
never copies a file from elsewhere on the machine (``tokenizer.json -> ~/.ssh/id_rsa``).
The one kind of link followed is a Hugging Face cache snapshot's own, into the blobs of the
same cached repository (`hub_cache.trusted_cache_link`).

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text("{}")
    >>> _ = (folder / "model.safetensors").write_bytes(b"")
    >>> sorted(side_files(folder))
    ['config.json']
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import CorruptCheckpointError, SurgeryError, SutureWarning
from ._json import loads as loads_json
from ._location import MAX_METADATA_BYTES, LocalLocation, Location, location_of, too_large
from ._location.hub_cache import trusted_cache_link
from ._paths import flatten

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".ckpt", ".npz")
_CHECKPOINT_FILES = ("commit_success.txt", "manifest.ocdbt")


class SideFileWarning(SutureWarning):
    """A file of a model folder that was not copied because it is not a plain file in it."""


def side_files(folder: Path | Location) -> dict[str, Any]:
    """``{name: path}`` of the folder's regular files that are not weights or indexes.

    A remote folder's are remote Locations (none for an HTTP folder, which cannot be listed).
    """
    if isinstance(folder, Location) and folder.is_remote:
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
    for module in _module_folders(folder):
        for entry in sorted((folder / module).iterdir()):
            checked = side_file(folder, f"{module}/{entry.name}")
            if checked is not None:
                found[f"{module}/{entry.name}"] = checked
    return found


def _module_folders(folder: Path) -> list[str]:
    """The subfolders a sentence-transformers ``modules.json`` names (``1_Pooling``), which
    the model needs beside its weights; only plain, real folders inside `folder`."""
    listed = side_file(folder, "modules.json")
    if listed is None:
        return []
    try:
        modules = loads_json(listed.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    names = (
        [m.get("path") for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    )
    return [
        name
        for name in dict.fromkeys(names)
        if isinstance(name, str)
        and _plain(name)
        and not (folder / name).is_symlink()
        and (folder / name).is_dir()
    ]


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and os.sep not in name and "/" not in name


def model_folder_side_files(location: str | os.PathLike | Location) -> dict[str, Any]:
    """`side_files` of a Hugging Face folder (or of the folder of its ``*.index.json``).

    Anything that is not such a folder has none.
    """
    where = location_of(location)
    if where.is_remote:
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
    module, _, file_name = name.rpartition("/")
    if not _plain(file_name) or (module and not _plain(module)):
        _skip(folder / name, "its name is not a plain file name")
        return None
    if module:  # a file of a module's folder (sentence-transformers' 1_Pooling/config.json)
        if isinstance(folder, Location) and folder.is_remote:
            return None  # only local folders' modules are copied
        inside = folder.path if isinstance(folder, LocalLocation) else folder
        if (inside / module).is_symlink() or not (inside / module).is_dir():
            _skip(inside / module, "it is a symbolic link or not a folder")
            return None
        found = side_file(inside / module, file_name)
        return (
            found
            if found is not None and found.resolve().parent.parent == inside.resolve()
            else None
        )
    if isinstance(folder, Location) and folder.is_remote:  # no links or special files there
        return folder / name if (folder / name).is_file() else None
    folder = folder.path if isinstance(folder, LocalLocation) else folder
    found = local_side_file(folder, name)
    if isinstance(found, str):
        if found != GONE:
            _skip(folder / name, found)
        return None
    return found


GONE = "it does not exist"
NOT_REGULAR = "it is not a regular file"


def local_side_file(folder: Path, name: str) -> Path | str:
    """The path to read for the side file `name` of the local `folder`, or why there is none
    (`GONE`, or why it is refused: a link, not a regular file, outside the folder).

    The rule of every file suture takes from beside the weights, copied or read.
    """
    path = folder / name
    try:
        status = path.lstat()
    except OSError:
        return GONE
    if stat.S_ISLNK(status.st_mode):
        blob = trusted_cache_link(folder, name)  # a Hugging Face cache snapshot's own link
        return blob if blob is not None else "it is a symbolic link"
    if not stat.S_ISREG(status.st_mode):
        return NOT_REGULAR
    if path.resolve().parent != folder.resolve():
        return "it resolves outside the model folder"
    return path


def _skip(path: Path, why: str) -> None:
    warnings.warn(
        f"Not copying {str(path)!r}: {why}. Only regular files inside the model folder are "
        f"copied; copy it by hand if you trust it.",
        SideFileWarning,
        stacklevel=4,
    )


def _remote_side_files(folder: Location) -> dict[str, Any]:
    try:
        names, subfolders = folder.children_and_subfolders()
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


# The config.json fields transformers reads for the weights' dtype: `dtype` (transformers 5)
# and `torch_dtype` (transformers 4, still read by 5 when `dtype` is absent).
DTYPE_FIELDS = ("dtype", "torch_dtype")
_HF_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class _WrittenFile:
    """A side file whose content is made here (a config.json with the output's dtype)."""

    def __init__(self, origin: Location, data: bytes) -> None:
        self.origin, self.data = origin, data

    def read_bytes(self) -> bytes:
        return self.data

    def __str__(self) -> str:
        return str(self.origin)


def output_dtype(tree: Any) -> str | None:
    """The one floating-point dtype of `tree`'s array leaves, as transformers names it; None
    when they have several, none, or one transformers has no name for (float8)."""
    names = set()
    for leaf in flatten(tree).values():
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not hasattr(leaf, "shape"):
            continue
        dtype = np.dtype(dtype)
        if np.issubdtype(dtype, np.floating) or dtype.name in _HF_FLOAT_DTYPES:
            names.add(dtype.name)
    return names.pop() if len(names) == 1 and names <= set(_HF_FLOAT_DTYPES) else None


def _read_capped(source: Any) -> bytes:
    """A config.json's bytes: a file's read under the metadata cap, an edited one's as made."""
    if isinstance(source, Location):
        return source.read_bytes(MAX_METADATA_BYTES, "the model's config")
    return source.read_bytes()


def with_output_dtype(extra_files: Mapping[str, Any], tree: Any) -> dict[str, Any]:
    """`extra_files` with a ``config.json`` whose ``dtype`` and ``torch_dtype`` say the dtype
    of `tree`'s weights, where the copied config says another (a cast, a merge's ``dtype:``).

    transformers 5 loads weights in the config's ``dtype``: a bfloat16 output under a config
    saying float32 would load as float32 without a word. A config that names no dtype, or
    already the right one, is copied byte for byte.

    Example:
        >>> import tempfile, pathlib, ml_dtypes
        >>> config = pathlib.Path(tempfile.mkdtemp()) / "config.json"
        >>> _ = config.write_text('{"dtype": "float32", "torch_dtype": "float32"}')
        >>> tree = {"w": np.zeros(2, ml_dtypes.bfloat16)}
        >>> files = with_output_dtype({"config.json": location_of(config)}, tree)
        >>> json.loads(files["config.json"].read_bytes())
        {'dtype': 'bfloat16', 'torch_dtype': 'bfloat16'}
    """
    source = extra_files.get("config.json")
    if source is None:
        return dict(extra_files)
    try:
        raw = _read_capped(source)
        config = loads_json(raw)
    except (OSError, ValueError, SurgeryError):
        return dict(extra_files)  # not JSON: copied as it is
    # copied from the bytes read here: a remote config.json is not fetched a second time
    unchanged = {**extra_files, "config.json": _WrittenFile(source, raw)}
    if not isinstance(config, dict) or not any(field in config for field in DTYPE_FIELDS):
        return unchanged
    dtype = output_dtype(tree)
    if dtype is None or all(config.get(field, dtype) == dtype for field in DTYPE_FIELDS):
        return unchanged
    config.update(dict.fromkeys(DTYPE_FIELDS, dtype))
    text = json.dumps(config, indent=2, sort_keys=False) + "\n"
    return {**extra_files, "config.json": _WrittenFile(source, text.encode())}


# The layout of a Hugging Face safetensors folder, recorded in an Orbax conversion and
# reused by the conversion back (`suture convert`, family recipes).
LAYOUT_KEY = "suture.safetensors_layout"


def keep_safetensors_layout(ckpt: Any, source: Location, separator: str) -> dict[str, Any]:
    """Save options that record where `ckpt` came from: its shard map, ``__metadata__``,
    separator and side files, in the output's custom metadata (`LAYOUT_KEY`)."""
    folder = (
        source.parent
        if source.name.endswith(".index.json")
        else None
        if source.name.endswith(".safetensors")
        else source
        if source.is_dir()
        else None
    )
    side = side_files(folder) if folder is not None else {}
    layout = {
        "metadata": ckpt.custom_metadata,
        "weight_map": ckpt.layout.get("weight_map"),
        "separator": separator,
        "side_files": sorted(side),
    }
    return {"metadata": {LAYOUT_KEY: layout}, "extra_files": side}


def reuse_safetensors_layout(
    ckpt: Any, source: Location, separator: str, one_file: bool
) -> dict[str, Any]:
    """Options that write `ckpt` back as the safetensors it came from (shards, side files)."""
    if ckpt.format == "orbax":
        layout = ckpt.custom_metadata.get(LAYOUT_KEY)
        if not isinstance(layout, dict):
            return {}
        _check_layout(layout, source)
        options: dict[str, Any] = {
            "metadata": layout.get("metadata") or None,
            "separator": layout.get("separator", separator),
        }
        shard_map = layout.get("weight_map")
        names = layout.get("side_files", [])
        side = {name: side_file(source, name) for name in names if isinstance(name, str)}
        side_paths = {name: path for name, path in side.items() if path is not None}
    elif ckpt.format == "safetensors":
        options = {"metadata": ckpt.custom_metadata or None}
        shard_map = ckpt.layout.get("weight_map")
        side_paths = {}  # convert() takes them from the Hugging Face folder itself
    else:
        return {}
    if not one_file:
        if shard_map:
            options["shard_map"] = shard_map
        if side_paths:
            options["extra_files"] = side_paths
    return options


def _check_layout(layout: dict, source: Location) -> None:
    """The recorded layout comes from a checkpoint's metadata: its values are checked, not trusted."""
    expected = {
        "metadata": (dict, type(None)),
        "weight_map": (dict, type(None)),
        "separator": (str,),
        "side_files": (list,),
    }
    for key, types in expected.items():
        value = layout.get(key)
        strings = isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
        if (key in layout and not isinstance(value, types)) or (
            isinstance(value, dict) and not strings
        ):
            raise CorruptCheckpointError(
                f"The {LAYOUT_KEY!r} custom metadata of {str(source)!r} has {key} = "
                f"{value!r:.100}, which is not what suture records. Pass max_shard_size= "
                f"(--max-shard-size) to lay the output out afresh, or fix the metadata."
            )
    if not all(isinstance(name, str) for name in layout.get("side_files", [])):
        raise CorruptCheckpointError(
            f"The {LAYOUT_KEY!r} custom metadata of {str(source)!r} lists side files that are "
            f"not file names: {layout['side_files']!r:.100}."
        )
    if layout.get("separator") == "":
        raise CorruptCheckpointError(
            f"The {LAYOUT_KEY!r} custom metadata of {str(source)!r} records an empty separator."
        )


class InlineFile(Location):
    """A side file's new content, held in memory: a ``config.json`` rewritten for an output
    whose weights changed format (dequantized, quantized)."""

    def __init__(self, name: str, data: bytes) -> None:
        self._name, self._data = name, data

    def __str__(self) -> str:
        return f"<{self._name}, rewritten>"

    @property
    def name(self) -> str:
        return self._name

    def is_file(self) -> bool:
        return True

    def is_dir(self) -> bool:
        return False

    def read_bytes(self, limit: int | None = None, what: str = "") -> bytes:
        if limit is not None and len(self._data) > limit:
            raise too_large(self, limit, what)
        return self._data


class FetchedFile(InlineFile):
    """A side file's bytes as read from `origin` (a bucket's ``config.json``), kept so that
    the save copies them without asking the bucket again; errors name `origin`."""

    def __init__(self, origin: Location, data: bytes) -> None:
        super().__init__(origin.name, data)
        self.origin = origin

    def __str__(self) -> str:
        return str(self.origin)


def with_config_fetched(side: Mapping[str, Any]) -> dict[str, Any]:
    """`side` files with a remote ``config.json`` read now and held (`FetchedFile`).

    Called where the config was read already (within `metadata_read_once`), it costs no
    request, and the save that copies the file, and checks its dtype, asks none either: on
    a bucket that is two round trips (a size probe and the read) before the first block.
    A file that cannot be read is left as it is, for the save to read and report.

    Example:
        >>> side = {"config.json": InlineFile("config.json", b"{}")}
        >>> with_config_fetched(side) == side  # only remote files are read ahead
        True
    """
    source = side.get("config.json")
    if not isinstance(source, Location) or not source.is_remote:
        return dict(side)
    try:
        data = _read_capped(source)
    except (OSError, SurgeryError):
        return dict(side)
    return {**side, "config.json": FetchedFile(source, data)}


def with_config_edited(
    side: dict[str, Any], edit: Any, where: str = "the source's config.json"
) -> dict[str, Any]:
    """`side` files with ``config.json`` replaced by ``edit(config)`` (unchanged without one).

    Example:
        >>> side = {"config.json": InlineFile("config.json", b'{"a": 1, "b": 2}')}
        >>> edited = with_config_edited(side, lambda c: {**c, "b": 3})
        >>> edited["config.json"].read_bytes()
        b'{\\n  "a": 1,\\n  "b": 3\\n}\\n'
    """
    if "config.json" not in side:
        return dict(side)
    source = side["config.json"]
    try:
        config = loads_json(_read_capped(location_of(source)))
    except (OSError, ValueError, SurgeryError) as error:
        raise CorruptCheckpointError(f"Cannot read {where} as JSON: {error}.") from error
    if not isinstance(config, dict):
        raise CorruptCheckpointError(f"{where} holds no JSON object.")
    text = json.dumps(edit(config), indent=2) + "\n"
    return {**side, "config.json": InlineFile("config.json", text.encode())}
