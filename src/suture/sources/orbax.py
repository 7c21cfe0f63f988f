"""Orbax checkpoints as lazy trees, opened from metadata alone.

The tree comes from ``_METADATA`` (keys, key kinds, value types); shapes and dtypes come
from each array's zarr metadata (``.zarray`` or ``zarr.json``), read all at once: from
the files when OCDBT is off, through TensorStore's OCDBT key-value store when it is on.
No array data is read until a LazyArray is. Importing this module does not import jax.
"""

from __future__ import annotations

import base64
import functools
from dataclasses import replace
from typing import Any

import numpy as np

from .._dtypes import from_zarr
from .._errors import (
    CorruptCheckpointError,
    NotACheckpointError,
    SurgeryError,
    UnsupportedError,
    check_shape,
    did_you_mean,
)
from .._json import loads as loads_json
from .._lazy.array import LazyArray
from .._location import (
    MAX_METADATA_BYTES,
    Location,
    location_of,
    remote_context,
    too_large,
    wait,
)
from .._paths import check_depth
from . import orbax_layout
from .checkpoint import Checkpoint
from .orbax_layout import PYTREE_METADATA, resolve
from .tensorstore import TensorStoreSource

ARRAY_VALUE_TYPES = {"jax.Array", "np.ndarray", "scalar"}
EMPTY_VALUE_TYPES = {"None": None, "Dict": {}, "List": [], "Tuple": ()}
_SEQUENCE_KEY = 1
_ZARR_METADATA_FILES = (".zarray", "zarr.json")


def open_orbax(path: Any, step: int | None = None, item: str | None = None) -> Checkpoint:
    """Opens the Orbax checkpoint at `path` (a path, URL or Location) lazily (see `suture.open`)."""
    location = location_of(path)
    layout = resolve(location, step)
    if item is not None:
        layout = _only_item(layout, item, location)
    trees = {
        name: read_item(folder, prefix="" if name is None else f"{name}/")
        for name, folder in layout.items.items()
    }
    tree = trees[None] if list(trees) == [None] else {**trees, **layout.json_items}
    return Checkpoint(
        tree,
        location=str(location),
        format="orbax",
        step=layout.step,
        custom_metadata=layout.custom_metadata,
    )


def _only_item(layout: Any, item: str, location: Any) -> Any:
    """The layout with `item` alone, as the whole tree."""
    named = {name: folder for name, folder in layout.items.items() if name is not None}
    lone = layout.items.get(None)
    if item in named:
        return replace(layout, items={None: named[item]}, json_items={})
    if lone is not None and lone.name == item:
        return replace(layout, items={None: lone}, json_items={})
    if item in layout.json_items:
        raise UnsupportedError(
            f"Item {item!r} of {str(location)!r} is a JSON item, not a tree of arrays; open the "
            f"step without item= to see its values."
        )
    names = sorted(named) or ([lone.name] if lone is not None else [])
    in_step = f" in step {layout.step}" if layout.step is not None else ""
    raise NotACheckpointError(
        f"{str(location)!r} has no item {item!r}{in_step}.{did_you_mean(item, names)} Items: "
        f"{', '.join(names) or 'none'}."
    )


is_orbax_folder = orbax_layout.is_orbax_folder


class _ItemStore:
    """One pytree item folder: its TensorStore context and how to open each array."""

    def __init__(self, folder: Location, use_ocdbt: bool, fill_missing: bool = True) -> None:
        """`fill_missing`: whether a chunk missing from the store reads as the fill value (a
        checkpoint that stored only chunks unequal to it) rather than failing."""
        import tensorstore as ts  # heavy: loaded on first use, not at import

        self.folder = folder.resolve()
        try:
            str(self.folder).encode("utf-8")
        except UnicodeEncodeError:
            raise UnsupportedError(
                f"{str(folder)!r} is not a UTF-8 path, and TensorStore (which reads Orbax "
                f"checkpoints) takes only UTF-8 paths. Rename the folder or link it from a UTF-8 "
                f"path."
            ) from None
        self.use_ocdbt, self.fill_missing = use_ocdbt, fill_missing
        self.context = ts.Context(
            {
                "cache_pool": {"total_bytes_limit": 0},
                "cache_pool#ocdbt": {"total_bytes_limit": 64 * 1024 * 1024},
                "file_io_concurrency": {"limit": 64},
            },
            parent=remote_context() if folder.is_remote else None,
        )
        self._kvstore: Any = None

    def kvstore_spec(self, name: str = "") -> dict:
        base = self.folder.kvstore_spec()
        if self.use_ocdbt:
            return {"driver": "ocdbt", "base": base, "path": name, "cache_pool": "cache_pool#ocdbt"}
        return (self.folder / name).kvstore_spec() if name else base

    def read_zarr_metadata(
        self, names: list[str], zarr3_first: bool
    ) -> dict[str, tuple[str, dict]]:
        """``{name: (driver, zarr metadata)}`` for every array name, read concurrently.

        Each array's metadata is read under the key `_METADATA`'s ``use_zarr3`` predicts,
        and under the other spelling only where that is missing: no listing of the store,
        whose size grows with the number of chunks.
        """
        spellings = list(zip(_ZARR_METADATA_FILES, ("zarr", "zarr3"), strict=True))
        if zarr3_first:
            spellings.reverse()
        read = self._read_from_ocdbt if self.use_ocdbt else self._read_from_files
        found: dict[str, tuple[str, dict]] = {}
        remaining = names
        for filename, driver in spellings:
            for name, raw in read([f"{name}/{filename}" for name in remaining], remaining):
                found[name] = (driver, _parse_json(raw, f"{self.folder}/{name}/{filename}"))
            remaining = [name for name in remaining if name not in found]
        return found

    def _read_from_files(self, keys: list[str], names: list[str]) -> list[tuple[str, bytes]]:
        if self.folder.is_remote:
            return self._read_all(keys, names, "the array metadata")
        found = []
        for key, name in zip(keys, names, strict=True):
            candidate = self.folder / key
            if candidate.is_file():
                raw = candidate.read_bytes(MAX_METADATA_BYTES, "the array metadata")
                found.append((name, raw))
        return found

    def _read_from_ocdbt(self, keys: list[str], names: list[str]) -> list[tuple[str, bytes]]:
        return self._read_all(keys, names, "the OCDBT database")

    def _read_all(self, keys: list[str], names: list[str], what: str) -> list[tuple[str, bytes]]:
        """Reads `keys` through the item's kvstore, all requests in flight at once."""
        import tensorstore as ts  # heavy: loaded on first use, not at import

        def result(future: Any) -> Any:
            return wait(future, self.folder) if self.folder.is_remote else future.result()

        try:
            if self._kvstore is None:
                self._kvstore = result(ts.KvStore.open(self.kvstore_spec(), context=self.context))
            futures = [self._kvstore.read(key.encode()) for key in keys]
            results = [result(future) for future in futures]
        except SurgeryError:
            raise
        except ValueError as error:
            raise CorruptCheckpointError(
                f"Cannot read {what} of {str(self.folder)!r}: {error}. The checkpoint "
                f"is damaged or incomplete; restore it from a copy."
            ) from error
        found = []
        for key, name, read in zip(keys, names, results, strict=True):
            if read.state == "value":
                value = read.value  # each access of `.value` makes a new copy
                if len(value) > MAX_METADATA_BYTES:
                    raise too_large(self.folder / key, MAX_METADATA_BYTES, "the array metadata")
                found.append((name, value))
        return found

    def opener(self, name: str, driver: str) -> Any:
        spec = {
            "driver": driver,
            "kvstore": self.kvstore_spec(name),
            "recheck_cached_data": False,
            "fill_missing_data_reads": self.fill_missing,
        }

        def open_store() -> Any:
            import tensorstore as ts  # heavy: loaded on first use, not at import

            return ts.open(spec, read=True, context=self.context)

        return open_store


def read_item(folder: Any, prefix: str = "") -> Any:
    """The tree of one pytree item folder; its leaves' paths start with `prefix` (the item's
    name in a CheckpointManager step, ``"model/"``), so plans and errors name real paths."""
    folder = location_of(folder)
    try:
        return _read_item_unchecked(folder, prefix)
    except SurgeryError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise CorruptCheckpointError(
            f"The metadata of {str(folder)!r} does not describe a consistent tree ({type(error).__name__}: "
            f"{error}). The checkpoint is damaged; restore it from a copy."
        ) from error


def _read_item_unchecked(folder: Location, prefix: str) -> Any:
    metadata_file = folder / PYTREE_METADATA
    metadata = _parse_json(metadata_file.read_bytes(MAX_METADATA_BYTES, "Orbax's"), metadata_file)
    entries = metadata.get("tree_metadata") if isinstance(metadata, dict) else None
    if not isinstance(entries, dict):
        raise CorruptCheckpointError(
            f"{str(folder / PYTREE_METADATA)!r} has no 'tree_metadata': it was not written by a "
            f"supported orbax-checkpoint version (0.5 or newer), or it is damaged."
        )
    use_ocdbt = bool(metadata.get("use_ocdbt", (folder / "manifest.ocdbt").is_file()))
    # Orbax stores every chunk, fill values included, where `_METADATA` says so, and then
    # restores a missing chunk as an error (its `raise_array_data_missing_error`), not zeros
    stored_all = bool(metadata.get("store_array_data_equal_to_fill_value", False))
    store = _ItemStore(folder, use_ocdbt, fill_missing=not stored_all)
    leaves = _parse_entries(entries, folder)
    strings = _read_strings(folder) if any(kind == "string" for _, kind in leaves.values()) else {}
    array_names = [
        ".".join(keys)
        for keys, (_, value_type) in leaves.items()
        if value_type in ARRAY_VALUE_TYPES
    ]
    if not use_ocdbt:
        for name in array_names:
            _check_plain_name(name, folder)
    zarr_metadata = store.read_zarr_metadata(array_names, bool(metadata.get("use_zarr3", False)))
    shardings = _RecordedShardings(folder)

    builder = _TreeBuilder()
    for keys, (key_kinds, value_type) in leaves.items():
        path = prefix + "/".join(keys)
        name = ".".join(keys)
        if value_type in ARRAY_VALUE_TYPES:
            if name not in zarr_metadata:
                raise CorruptCheckpointError(
                    f"Leaf {path!r}: _METADATA lists an array but {str(folder)!r} holds no array "
                    f"data for it (looked for {name}/.zarray and {name}/zarr.json). The "
                    f"checkpoint is incomplete; restore it from a copy."
                )
            driver, description = zarr_metadata[name]
            shape, dtype = _shape_and_dtype(description, path, folder)
            chunks = functools.partial(_read_chunk_shape, description, len(shape))  # needed rarely
            source = TensorStoreSource(
                store.opener(name, driver),
                shape,
                dtype,
                path,
                str(folder),
                chunks,
                remote=folder.is_remote,
            )
            source.recorded_sharding = functools.partial(shardings.get, name)
            leaf: Any = LazyArray(source, path=path, stored_as=value_type)
        elif value_type == "string":
            leaf = strings.get(name, strings.get(path))
        elif value_type in EMPTY_VALUE_TYPES:
            leaf = EMPTY_VALUE_TYPES[value_type]
        else:
            leaf = UnsupportedLeaf(path, value_type)
        builder.insert(keys, key_kinds, leaf)
    return builder.tree()


class UnsupportedLeaf:
    """A leaf saved by an Orbax handler that suture does not read (kept so paths stay whole)."""

    def __init__(self, path: str, value_type: str) -> None:
        self.path, self.value_type = path, value_type

    def __repr__(self) -> str:
        return f"UnsupportedLeaf(path={self.path!r}, value_type={self.value_type!r})"


def _parse_entries(
    entries: dict, folder: Location
) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    leaves = {}
    for entry in entries.values():
        try:
            keys = tuple(str(part["key"]) for part in entry["key_metadata"])
            kinds = tuple(int(part.get("key_type", 2)) for part in entry["key_metadata"])
            value_type = str(entry["value_metadata"]["value_type"])
        except (KeyError, TypeError, ValueError) as error:
            raise CorruptCheckpointError(
                f"{str(folder / PYTREE_METADATA)!r} has an entry without key_metadata or "
                f"value_metadata ({entry!r:.200}). The checkpoint is damaged."
            ) from error
        check_depth(len(keys), "/".join(keys))
        if keys in leaves:
            raise CorruptCheckpointError(
                f"{str(folder / PYTREE_METADATA)!r} lists the leaf {'/'.join(keys)!r} twice: "
                f"which entry holds it is ambiguous. The checkpoint is damaged; restore it "
                f"from a copy."
            )
        leaves[keys] = (kinds, value_type)
    return leaves


def _check_plain_name(name: str, folder: Location) -> None:
    """Without OCDBT an array's name is a folder name: it must stay inside the checkpoint."""
    if name in ("", ".", "..") or any(c in name for c in "/\\\0") or len(name.encode()) > 255:
        raise CorruptCheckpointError(
            f"{str(folder / PYTREE_METADATA)!r} lists an array named {name[:200]!r}, which is "
            f"not a plain folder name inside the checkpoint (it must not be empty, '.', '..', "
            f"hold '/', '\\' or NUL, or exceed 255 bytes). The checkpoint is damaged or "
            f"hostile; refusing to read outside it."
        )


class _RecordedShardings:
    """Orbax's ``_sharding`` file of an item: each array's recorded sharding, read on first use.

    Only a load that needs a sharding and was given none reads it, so opening and
    inspecting never do (it holds a device list per array: megabytes for big trees).
    """

    def __init__(self, folder: Location) -> None:
        self.folder = folder

    def get(self, name: str) -> str | None:
        """Orbax's JSON description of array `name`'s sharding, or None."""
        return self._by_name.get(name)

    @functools.cached_property
    def _by_name(self) -> dict[str, str]:
        sharding_file = self.folder / "_sharding"
        if not sharding_file.is_file():
            return {}
        parsed = _parse_json(sharding_file.read_bytes(MAX_METADATA_BYTES), sharding_file)
        if not isinstance(parsed, dict):
            return {}
        shardings = {}
        for encoded, description in parsed.items():
            try:
                name = base64.urlsafe_b64decode(encoded.encode()).decode()
            except (ValueError, UnicodeDecodeError):
                continue  # not an entry Orbax wrote: no recorded sharding for it
            if isinstance(description, str):
                shardings[name] = description
        return shardings


def _read_strings(folder: Location) -> dict[str, str]:
    strings_file = folder / "_strings.json"
    if not strings_file.is_file():
        return {}
    parsed = _parse_json(strings_file.read_bytes(MAX_METADATA_BYTES), strings_file)
    return parsed if isinstance(parsed, dict) else {}


def _shape_and_dtype(
    description: dict, path: str, folder: Location
) -> tuple[tuple[int, ...], np.dtype]:
    try:
        shape = description["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in shape
        ):
            raise TypeError(f"shape {shape!r} is not a list of integers")
        dtype_name = description.get("data_type", description.get("dtype"))
        if not isinstance(dtype_name, str):
            raise TypeError(f"dtype {dtype_name!r}")
        dtype = from_zarr(dtype_name)
    except (KeyError, TypeError, ValueError, SurgeryError) as error:
        raise CorruptCheckpointError(
            f"Leaf {path!r} in {str(folder)!r}: its zarr metadata has no readable shape and "
            f"dtype ({error}). The checkpoint is damaged; restore it from a copy."
        ) from error
    check_shape(tuple(shape), dtype, f"Leaf {path!r} in {str(folder)!r}")
    return tuple(shape), dtype


def _read_chunk_shape(description: dict, ndim: int) -> tuple[int, ...] | None:
    """The chunk a read decodes: zarr v2 ``chunks``, or zarr3's (inner, if sharded) chunk."""
    try:
        if "chunks" in description:
            chunk = description["chunks"]
        else:
            chunk = description["chunk_grid"]["configuration"]["chunk_shape"]
            for codec in description.get("codecs", []):
                if codec.get("name") == "sharding_indexed":
                    chunk = codec["configuration"]["chunk_shape"]
        chunk = tuple(int(n) for n in chunk)
    except (KeyError, TypeError, ValueError):
        return None
    return chunk if len(chunk) == ndim else None


class _TreeBuilder:
    """Builds the nested tree from (keys, key kinds) pairs; sequence-kind nodes become lists."""

    def __init__(self) -> None:
        self.root: dict = {}
        self._sequence_keys: dict[int, set[str]] = {}  # id(node) -> keys Orbax saw as indices
        self._leaves: set[tuple[str, ...]] = set()
        self._inner: set[tuple[str, ...]] = set()  # the keys of subtrees

    def insert(self, keys: tuple[str, ...], kinds: tuple[int, ...], leaf: Any) -> None:
        """Places `leaf` at `keys`; a leaf where a subtree is, or under another leaf, is a
        ValueError (a leaf that is an empty dict is no subtree)."""
        prefixes = {keys[:end] for end in range(len(keys))}
        if keys in self._inner or prefixes & self._leaves:
            shorter = min(prefixes & self._leaves, key=len, default=keys)
            raise ValueError(
                f"a leaf and a subtree at one key, {'/'.join(shorter) or '(the root)'!r}"
            )
        self._leaves.add(keys)
        self._inner |= prefixes
        if not keys:
            self.root[_ROOT] = leaf
            return
        node = self.root
        for key, kind in zip(keys[:-1], kinds[:-1], strict=True):
            self._note(node, key, kind)
            node = node.setdefault(key, {})
        self._note(node, keys[-1], kinds[-1])
        node[keys[-1]] = leaf

    def _note(self, node: dict, key: str, kind: int) -> None:
        if kind == _SEQUENCE_KEY:
            self._sequence_keys.setdefault(id(node), set()).add(key)

    def tree(self) -> Any:
        return self._finish(self.root)

    def _finish(self, node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if _ROOT in node:
            return node[_ROOT]
        if node and self._sequence_keys.get(id(node), set()) >= node.keys():
            ordered = sorted(node.items(), key=lambda item: int(item[0]))
            return [self._finish(child) for _, child in ordered]
        return {key: self._finish(child) for key, child in node.items()}


_ROOT = "__root__"


def _parse_json(raw: bytes, where: object) -> Any:
    try:
        return loads_json(raw)
    except ValueError as error:
        raise CorruptCheckpointError(
            f"Cannot parse {str(where)!r} as JSON ({error}). The checkpoint is damaged; "
            f"restore it from a copy."
        ) from error
