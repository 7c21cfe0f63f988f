"""Flax msgpack checkpoints (``flax.serialization.to_bytes`` / ``msgpack_serialize``).

This covers legacy Linen checkpoints, ``flax.training.checkpoints`` files and old
``flax.optim`` states. The format is one msgpack document with no index, so it is not
random-access: the file is read once, whole, when opened, and the arrays are served from
memory. Flax's encoding is decoded here directly (arrays as ``(shape, dtype name, bytes)``,
arrays over 1 GiB split into ``__msgpack_chunked_array__`` parts), so Flax is not needed.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from .._dtypes import to_dtype
from .._errors import CorruptCheckpointError, SurgeryError, check_shape
from .._iostats import record_read
from .._location import Location
from .._paths import MAX_DEPTH
from .checkpoint import Checkpoint
from .memory import wrap_arrays

_NDARRAY, _COMPLEX, _SCALAR = 1, 2, 3
_CHUNKED = "__msgpack_chunked_array__"


def open_msgpack(path: Location) -> Checkpoint:
    """Reads a Flax msgpack file (whole: the format has no index) as a tree."""
    raw = path.read_bytes()
    if not path.is_remote:  # remote reads are counted by TensorStore
        record_read(len(raw))
    try:
        tree = msgpack.unpackb(raw, ext_hook=_decode_ext, raw=False, strict_map_key=False)
    except SurgeryError:
        raise
    except Exception as error:  # msgpack raises many kinds on damaged input
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a valid Flax msgpack checkpoint: {type(error).__name__}: {error}."
        ) from error
    tree = _unchunk(tree, path)
    return Checkpoint(wrap_arrays(tree), location=str(path), format="msgpack")


def _decode_ext(code: int, data: bytes) -> Any:
    if code in (_NDARRAY, _SCALAR):
        try:
            shape, dtype_name, buffer = msgpack.unpackb(data, raw=True)
            dtype = to_dtype(dtype_name.decode() if isinstance(dtype_name, bytes) else dtype_name)
            if not isinstance(shape, (list, tuple)) or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in shape
            ):
                raise ValueError(f"shape {shape!r} is not a list of sizes")
            check_shape(tuple(shape), dtype, "An array in a Flax msgpack checkpoint")
            count = math.prod(shape)
            if count * dtype.itemsize != len(buffer):
                raise ValueError(f"{len(buffer)} bytes for shape {tuple(shape)} of {dtype}")
            array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        except SurgeryError:
            raise
        except Exception as error:
            raise CorruptCheckpointError(
                f"A damaged array in a Flax msgpack checkpoint: {error}."
            ) from error
        return array[()] if code == _SCALAR else array
    if code == _COMPLEX:
        real, imaginary = msgpack.unpackb(data)
        return complex(real, imaginary)
    raise CorruptCheckpointError(
        f"A Flax msgpack checkpoint holds an unknown extension type {code}."
    )


def _unchunk(node: Any, path: Location, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise CorruptCheckpointError(
            f"{str(path)!r} nests maps more than {MAX_DEPTH} levels deep; suture reads trees of "
            f"at most {MAX_DEPTH} levels. The file is damaged or hostile."
        )
    if isinstance(node, dict):
        if node.get(_CHUNKED) is True:
            return _join_chunks(node, path)
        tree: dict[str, Any] = {}
        for key, value in node.items():
            name = key if isinstance(key, str) else str(key)
            if name in tree or not isinstance(key, (str, int)) or isinstance(key, bool):
                raise CorruptCheckpointError(
                    f"{str(path)!r} holds a map with the key {key!r} ({type(key).__name__}), "
                    f"which {'collides with another key once written as a string' if name in tree else 'is not a string or integer'}. "
                    f"Flax writes string keys only; the file is damaged or was not written by Flax."
                )
            tree[name] = _unchunk(value, path, depth + 1)
        return tree
    if isinstance(node, list):
        return [_unchunk(value, path, depth + 1) for value in node]
    return node


def _join_chunks(node: dict, path: Location) -> np.ndarray:
    """Flax's ``__msgpack_chunked_array__``: ``{"shape": {"0": n, ...}, "chunks": {"0": array, ...}}``."""
    try:
        shape = tuple(node["shape"][str(i)] for i in range(len(node["shape"])))
        chunks = [node["chunks"][str(i)] for i in range(len(node["chunks"]))]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise ValueError(f"shape {shape!r} is not a list of sizes")
        if not chunks or not all(
            isinstance(chunk, np.ndarray) and not chunk.dtype.hasobject and chunk.ndim >= 1
            for chunk in chunks
        ):
            raise ValueError("its chunks must be numeric arrays")
        return np.concatenate(chunks).reshape(shape)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptCheckpointError(
            f"A damaged chunked array in {str(path)!r}: {error}. The file is damaged or was not "
            f"written by Flax."
        ) from error
