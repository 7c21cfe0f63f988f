"""Flax msgpack checkpoints (``flax.serialization.to_bytes`` / ``msgpack_serialize``).

This covers legacy Linen checkpoints, ``flax.training.checkpoints`` files and old
``flax.optim`` states. The format is one msgpack document with no index, so it is not
random-access: the file is read once, whole, when opened, and the arrays are served from
memory. Flax's encoding is decoded here directly (arrays as ``(shape, dtype name, bytes)``,
arrays over 1 GiB split into ``__msgpack_chunked_array__`` parts), so Flax is not needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._checkpoint import Checkpoint
from .._dtypes import to_dtype
from .._errors import CorruptCheckpointError, SurgeryError
from .._iostats import record_read
from .._location import Location
from .memory import wrap_arrays

_NDARRAY, _COMPLEX, _SCALAR = 1, 2, 3
_CHUNKED = "__msgpack_chunked_array__"


def open_msgpack(path: Location) -> Checkpoint:
    """Reads a Flax msgpack file (whole: the format has no index) as a tree."""
    import msgpack

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
    import msgpack

    if code in (_NDARRAY, _SCALAR):
        try:
            shape, dtype_name, buffer = msgpack.unpackb(data, raw=True)
            dtype = to_dtype(dtype_name.decode() if isinstance(dtype_name, bytes) else dtype_name)
            count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
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


def _unchunk(node: Any, path: Location) -> Any:
    if isinstance(node, dict):
        if node.get(_CHUNKED) is True:
            try:
                shape = tuple(node["shape"][str(i)] for i in range(len(node["shape"])))
                chunks = [node["chunks"][str(i)] for i in range(len(node["chunks"]))]
                return np.concatenate(chunks).reshape(shape)
            except (KeyError, TypeError, ValueError) as error:
                raise CorruptCheckpointError(
                    f"A damaged chunked array in {str(path)!r}: {error}."
                ) from error
        return {str(key): _unchunk(value, path) for key, value in node.items()}
    if isinstance(node, list):
        return [_unchunk(value, path) for value in node]
    return node
