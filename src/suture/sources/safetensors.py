"""safetensors files, and Hugging Face folders of shards, as lazy trees.

A tensor name is split into a tree path on a separator (``.`` by default), so
``model.layers.0.mlp.up_proj.weight`` becomes ``model/layers/0/mlp/up_proj/weight``. Only
the header is read when opening; every tensor is read with positional reads of just the
rows a view needs. The header is checked before use: a malformed file is a
`CorruptCheckpointError`, never a crash.

Example:
    >>> import numpy as np, suture, tempfile, os
    >>> from safetensors.numpy import save_file
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> save_file({"model.embed.weight": np.ones((4, 2), np.float32)}, path)
    >>> suture.open(path)["model/embed/weight"].shape
    (4, 2)
"""

from __future__ import annotations

import contextvars
import math
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import (
    ArgumentError,
    CorruptCheckpointError,
    NotACheckpointError,
    SurgeryError,
    SutureWarning,
    check_shape,
)
from .._hf import local_side_file
from .._json import loads as loads_json
from .._lazy.array import LazyArray
from .._location import (
    MAX_METADATA_BYTES,
    LocalLocation,
    Location,
    RemoteLocation,
    head_ahead,
    location_of,
    read_ahead,
)
from .._quant.scheme import scheme_of
from .._quant.tensors import dequantize_tensors
from .checkpoint import Checkpoint
from .filesource import FileRangeSource, local_identity
from .names import tree_of_paths, tree_path_of

DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
    "F4": "uint8",  # E2M1 pairs: the header counts values, the bytes hold two each
}
PACKED_FP4 = "F4"
INDEX_SUFFIX = ".index.json"
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
SINGLE_NAMES = (f"model.safetensors{INDEX_SUFFIX}", "model.safetensors")  # Hugging Face's
REMOTE_OPENS = 16  # remote shards whose headers are read at once (each waits on round trips)
# Bytes read first from a file: its header's length and, for most files, the header itself
# (a shard of a few hundred tensors has a header of a few tens of KiB), in one round trip.
HEADER_GUESS = 64 << 10
MAX_SHARDS_AHEAD = 1024  # headers read ahead at most (64 KiB each, kept while opening)


def open_safetensors(
    path: Any, separator: str = ".", dequantize: bool | str = False, dtype: Any = "bfloat16"
) -> Checkpoint:
    """Opens a ``.safetensors`` file, an ``*.index.json``, or a folder of shards.

    With `dequantize` (``"auto"``: only if the folder is quantized), the quantized tensors of
    a folder whose ``config.json`` has a ``quantization_config`` are read dequantized to
    `dtype`, under their plain names, and their scales are hidden (`suture._quant`).
    """
    path = location_of(path)
    files, index = _files_of(path)
    tensors, weight_map, metadata, packed_fp4 = _read_tensors(files, path)
    layout: dict[str, Any] = {}
    if index is not None:
        _check_index(index, tensors, path)
        layout = {"weight_map": weight_map, "index_metadata": index.get("metadata", {})}
    quantization = quantization_config(path)
    if quantization is not None:
        layout["quantization_config"] = quantization
    if dequantize and (quantization is not None or dequantize is True):
        tensors = _dequantized(tensors, quantization, path, to_dtype(dtype), packed_fp4)
        layout["dequantized"] = True
    tree = _tree(tensors, separator, path)
    return Checkpoint(
        tree, location=str(path), format="safetensors", custom_metadata=metadata, layout=layout
    )


def quantization_config(path: Location) -> Any:
    """The ``quantization_config`` of the ``config.json`` beside `path`'s tensors (or of its
    ``text_config``, where Kimi K2.5 keeps it), or None."""
    folder = path.parent if path.name.endswith((INDEX_SUFFIX, ".safetensors")) else path
    config_file = folder / "config.json"
    try:
        if isinstance(folder, LocalLocation):  # under the side-file rule: no links out
            found = local_side_file(folder.path, "config.json")
            if isinstance(found, str):
                return None
            config_file = LocalLocation(found)
        elif not config_file.is_file():
            return None
        config = loads_json(config_file.read_bytes(MAX_METADATA_BYTES, "the model's config"))
    except (OSError, ValueError, SurgeryError):
        return None  # an unreadable config is the family recipes' to report
    found = config.get("quantization_config") if isinstance(config, dict) else None
    text = config.get("text_config") if isinstance(config, dict) else None
    if found is None and isinstance(text, dict):  # a multimodal folder's (Kimi K2.5, K2.6)
        found = text.get("quantization_config")
    return found if found is not None else _modelopt_config(folder)


def _modelopt_config(folder: Location) -> Any:
    """ModelOpt's ``hf_quant_config.json`` as a ``quant_method: modelopt`` config, or None."""
    try:
        if isinstance(folder, LocalLocation):
            found = local_side_file(folder.path, "hf_quant_config.json")
            if isinstance(found, str):
                return None
            side = LocalLocation(found)
        else:
            side = folder / "hf_quant_config.json"
            if not side.is_file():
                return None
        config = loads_json(side.read_bytes(MAX_METADATA_BYTES, "hf_quant_config.json"))
    except (OSError, ValueError, SurgeryError):
        return None
    if not isinstance(config, dict) or not isinstance(config.get("quantization"), dict):
        return None
    return {"quant_method": "modelopt", **config}


def _dequantized(
    tensors: dict[str, LazyArray],
    quantization: Any,
    path: Location,
    dtype: np.dtype,
    packed_fp4: frozenset[str],
) -> dict[str, LazyArray]:
    where = repr(str(path))
    if quantization is None:
        raise ArgumentError(
            f"{where} has no config.json with a quantization_config, so there is nothing to "
            f"dequantize (suture reads the scheme from it). Open it without dequantize."
        )
    return dequantize_tensors(tensors, scheme_of(quantization, where), dtype, where, packed_fp4)


def tensors_by_name(path: Any) -> dict[str, LazyArray]:
    """Every tensor of a file, index or folder of shards, by its name (no tree is built)."""
    path = location_of(path)
    files, _ = _files_of(path)
    return _read_tensors(files, path)[0]


def _read_tensors(
    files: list[Location], path: Location
) -> tuple[dict[str, LazyArray], dict[str, str], dict[str, str], frozenset[str]]:
    """Every tensor of `files` (lazy), the shard of each, the first file's metadata, and
    the names of the tensors stored ``F4`` (read as their bytes)."""
    tensors: dict[str, LazyArray] = {}
    weight_map: dict[str, str] = {}
    metadata: dict[str, str] = {}
    packed_fp4: set[str] = set()

    def opened(file: Location) -> tuple[Any, dict[str, Any], int]:
        identity = local_identity(file)  # before the header: a swap in between fails the reads
        return (identity, *read_header(file))

    for file, (identity, header, data_start) in zip(files, _each(opened, files), strict=True):
        metadata = metadata or header.get("__metadata__") or {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if name in tensors:
                raise CorruptCheckpointError(
                    f"Tensor {name!r} appears in two shards of {str(path)!r}."
                )
            shape, dtype, begin = _entry(name, entry, file)
            tensors[name] = LazyArray(
                FileRangeSource(file, data_start + begin, shape, dtype, name, identity), path=name
            )
            weight_map[name] = file.name
            if isinstance(entry, dict) and entry.get("dtype") == PACKED_FP4:
                packed_fp4.add(name)
    return tensors, weight_map, metadata, frozenset(packed_fp4)


def _say_slashed_names(tensors: dict[str, LazyArray], separator: str, path: Location) -> None:
    """Warns where a name holds a ``/`` that is not the separator: tree paths join levels
    with ``/``, so the name becomes levels and is written back with the separator."""
    if separator == "/":
        return
    slashed = [name for name in tensors if "/" in name]
    if not slashed:
        return
    levels = slashed[0].replace(separator, "/").split("/") if separator else []
    written = separator.join(levels) if levels and all(levels) else ""
    warnings.warn(
        f"Tensor {slashed[0]!r} of {str(path)!r} ({len(slashed)} name(s) with a '/'): a '/' "
        f"separates the levels of a tree path, so the name becomes levels"
        + (f" and is written back as {written!r}" if written else "")
        + ". Open it with separator='/' to keep such names whole.",
        SutureWarning,
        stacklevel=4,
    )


def _files_of(path: Location) -> tuple[list[Location], dict | None]:
    is_folder = not path.is_file() if path.is_remote else path.is_dir()
    if is_folder and not path.name.endswith(INDEX_SUFFIX):
        names = _folder_names(path)
        indexes = [name for name in names if name.endswith(f".safetensors{INDEX_SUFFIX}")]
        if indexes:
            return _files_of(path / _the_index(indexes, path))
        files = [path / name for name in names if name.endswith(".safetensors")]
        if not files:
            raise NotACheckpointError(f"{str(path)!r} holds no .safetensors file and no index.")
        for file in files:
            if not file.is_remote and not file.is_file():  # opening a pipe would wait forever
                what = (
                    "a link to nothing (a download that did not finish?)"
                    if not file.exists()
                    else "not a regular file (a pipe, socket, device or folder)"
                )
                raise NotACheckpointError(
                    f"{str(file)!r} is named like a safetensors file but is {what}. Remove or "
                    f"replace it, or open the shards you mean one by one."
                )
        return files, None
    if path.name.endswith(INDEX_SUFFIX):
        if path.is_remote:
            _open_ahead(path)
        index = _read_index(path)
        names = sorted(set(index["weight_map"].values()))
        present = _each(lambda name: (path.parent / name).is_file(), names, path.is_remote)
        missing = [name for name, there in zip(names, present, strict=True) if not there]
        if missing:
            raise CorruptCheckpointError(
                f"{str(path)!r} lists shard {missing[0]!r}, which is not in {str(path.parent)!r}. "
                f"Download the missing shards."
            )
        return [path.parent / name for name in names], index
    return [path], None


def _open_ahead(index: Location) -> None:
    """On remote storage, within `metadata_read_once`: what opening a sharded folder reads
    next, asked at once instead of one round trip after another: the index and the
    config.json beside it, whole, and where the folder's listing is known already (it was
    opened as a folder), the header of each shard named as the index names its shards
    (``model-00001-of-00005.safetensors`` beside ``model.safetensors.index.json``)."""
    if not isinstance(index, RemoteLocation):
        return
    folder = index.parent
    config = folder / "config.json"
    labels = {index: "the index", config: "the model's config"}
    stem = index.name.removesuffix(f".safetensors{INDEX_SUFFIX}")
    listed = folder.listed_already()
    shards = [
        folder / name
        for name in listed or []
        if "/" not in name and name.startswith(f"{stem}-") and name.endswith(".safetensors")
    ]
    asks = [
        lambda: read_ahead([index, config], MAX_METADATA_BYTES, labels),
        lambda: head_ahead(shards[:MAX_SHARDS_AHEAD], HEADER_GUESS, REMOTE_OPENS),
    ]
    _each(lambda ask: ask(), asks, remote=True)  # side by side, in this context's copies


def _each(function: Any, items: list, remote: bool | None = None) -> list:
    """``[function(item) for item in items]``; for remote files side by side, since each
    call waits on round trips (the first error raised, as the loop would)."""
    if remote is None:
        remote = any(getattr(item, "is_remote", False) for item in items)
    if not remote or len(items) < 2:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(REMOTE_OPENS, len(items))) as pool:
        # each in a copy of this context, so that `metadata_read_once` holds in the pool's
        # threads too (a shard's presence is then answered by the folder's listing)
        calls = [pool.submit(contextvars.copy_context().run, function, item) for item in items]
        return [call.result() for call in calls]


def _the_index(indexes: list[str], folder: Location) -> str:
    """The index a folder is read through: Hugging Face's ``model.safetensors.index.json``
    where there are several (as transformers reads it), else the only one."""
    if SINGLE_NAMES[0] in indexes or len(indexes) == 1:
        return SINGLE_NAMES[0] if SINGLE_NAMES[0] in indexes else indexes[0]
    raise NotACheckpointError(
        f"{str(folder)!r} holds {len(indexes)} indexes ({', '.join(indexes[:4])}) and no "
        f"{SINGLE_NAMES[0]}: which shards make the model is ambiguous. Open the index you "
        f"mean (suture.open({str(folder / indexes[0])!r}))."
    )


def _folder_names(folder: Location) -> list[str]:
    """The folder's file names, sorted; remote: Hugging Face's usual names first, unlisted."""
    if folder.is_remote:
        for name in SINGLE_NAMES:
            if (folder / name).is_file():
                return [name]
    return folder.children()


def _read_index(path: Location) -> dict:
    try:
        raw = path.read_bytes(MAX_METADATA_BYTES, "the index")
    except OSError as error:
        raise CorruptCheckpointError(f"Cannot read {str(path)!r}: {error}.") from error
    try:
        index = loads_json(raw)
    except ValueError as error:
        raise CorruptCheckpointError(f"Cannot read {str(path)!r} as JSON: {error}.") from error
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(
            f"{str(path)!r} has no 'weight_map' of tensor names to shard files."
        )
    if any("/" in shard or shard.startswith("..") for shard in weight_map.values()):
        raise CorruptCheckpointError(
            f"{str(path)!r} names a shard outside its folder; refusing to read it."
        )
    return index


def _check_index(index: dict, tensors: dict[str, LazyArray], path: Location) -> None:
    listed = set(index["weight_map"])
    absent = sorted(listed - set(tensors))
    if absent:
        raise CorruptCheckpointError(
            f"{str(path)!r} lists tensor {absent[0]!r}, which no shard holds."
        )


def read_header(file: Location) -> tuple[dict[str, Any], int]:
    """The parsed JSON header of a safetensors file and the offset of its data.

    One read of the first `HEADER_GUESS` bytes holds the length and, for most files, the
    header (a longer header is read in a second); a remote file's size is not asked for,
    the last byte its header names is read instead.
    """
    try:
        size = None if file.is_remote else file.size()
        prefix = file.read_head(HEADER_GUESS)
        if len(prefix) < 8:
            raise CorruptCheckpointError(
                f"{str(file)!r} is {len(prefix)} bytes, too short for a safetensors header."
            )
        length = int.from_bytes(prefix[:8], "little")
        if length > (MAX_HEADER_BYTES if size is None else min(size - 8, MAX_HEADER_BYTES)):
            shown = f"{size - 8} bytes" if size is not None else "a limit of 100 MiB"
            raise CorruptCheckpointError(
                f"{str(file)!r} claims a {length}-byte header, but the file has {shown} "
                f"after the length. The file is truncated or not safetensors."
            )
        if len(prefix) >= 8 + length:
            raw = bytes(prefix[8 : 8 + length])
        else:
            raw = bytes(file.read_range(8, length, "the header"))
    except OSError as error:
        raise CorruptCheckpointError(f"Cannot read {str(file)!r}: {error}.") from error
    try:
        header = loads_json(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptCheckpointError(
            f"The header of {str(file)!r} is not valid JSON: {error}."
        ) from error
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"The header of {str(file)!r} is not a JSON object.")
    metadata = header.get("__metadata__")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise CorruptCheckpointError(
            f"The __metadata__ of {str(file)!r} must map strings to strings."
        )
    data_start = 8 + length
    data_size = size - data_start if size is not None else _data_size(header, file, data_start)
    _check_layout(header, data_size, file)
    return header, data_start


def _data_size(header: dict, file: Location, data_start: int) -> int:
    """The data bytes a remote file's header claims, proven present by reading the last one."""
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__"
        and isinstance(entry, dict)
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and isinstance(entry["data_offsets"][1], int)
    ]
    end = max([0, *ends])
    if end:
        file.read_range(data_start + end - 1, 1, "the last tensor")
    return end


def _entry(name: str, entry: Any, file: Location) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and first data offset of a tensor entry (its offsets already checked)."""
    shape, dtype = _shape_and_dtype(name, entry, file)
    return shape, dtype, entry["data_offsets"][0]


def _shape_and_dtype(name: str, entry: Any, file: Location) -> tuple[tuple[int, ...], np.dtype]:
    if not isinstance(entry, dict):
        raise CorruptCheckpointError(
            f"Tensor {name!r} in {str(file)!r}: its header entry is not an object."
        )
    dtype_name = entry.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise CorruptCheckpointError(
            f"Tensor {name!r} in {str(file)!r} has dtype {dtype_name!r}; suture reads "
            f"{', '.join(DTYPES)}."
        )
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise CorruptCheckpointError(
            f"Tensor {name!r} in {str(file)!r} has shape {shape!r}; expected a list of sizes."
        )
    if dtype_name == PACKED_FP4:
        shape = _packed_fp4_shape(name, shape, file)
    dtype = to_dtype(DTYPES[dtype_name])
    check_shape(tuple(shape), dtype, f"Tensor {name[:200]!r} in {str(file)!r}")
    return tuple(shape), dtype


def _packed_fp4_shape(name: str, shape: list[int], file: Location) -> list[int]:
    """The bytes of an ``F4`` tensor: its header counts E2M1 values, two to a byte, so
    ``(rows, K)`` values are ``(rows, K / 2)`` bytes (read as uint8, low nibble first)."""
    if not shape or shape[-1] % 2:
        raise CorruptCheckpointError(
            f"Tensor {name!r} in {str(file)!r} is F4 of shape {shape}; expected a last axis "
            f"of even length (two E2M1 values a byte)."
        )
    return [*shape[:-1], shape[-1] // 2]


def _check_layout(header: dict, data_size: int, file: Location) -> None:
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape, dtype = _shape_and_dtype(name, entry, file)
        offsets = entry.get("data_offsets")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise CorruptCheckpointError(
                f"Tensor {name!r} in {str(file)!r} has data_offsets {offsets!r}; expected [begin, end] "
                f"within the {data_size} data bytes."
            )
        expected = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != expected:
            raise CorruptCheckpointError(
                f"Tensor {name!r} in {str(file)!r} spans {offsets[1] - offsets[0]} bytes, but shape "
                f"{tuple(shape)} of {DTYPES[entry['dtype']]} needs {expected}."
            )
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:], strict=False):
        if begin < end:
            raise CorruptCheckpointError(
                f"Tensors {first!r} and {second!r} overlap in {str(file)!r}."
            )


def _tree(tensors: dict[str, LazyArray], separator: str, path: Location) -> Any:
    flat, named = {}, {}
    for name, array in tensors.items():
        tree_path = tree_path_of(name, separator, named, path)
        array.path = tree_path
        array.node.path = tree_path
        flat[tree_path] = array
    tree = tree_of_paths(flat, separator, path)
    _say_slashed_names(tensors, separator, path)  # once the tree holds together
    return tree
