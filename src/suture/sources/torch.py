"""PyTorch state dicts (``torch.save`` files: ``.bin``, ``.pt``, ``.pth``), behind ``allow_pickle``.

A PyTorch file is a pickle, and unpickling can run code, so it is opened only with
``allow_pickle=True`` (CLI ``--allow-pickle``), and then with ``weights_only=True``, PyTorch's
restricted unpickler, and ``mmap=True``, so tensors are paged in as they are read. Tensor
names split into tree paths on a separator, as for safetensors. Needs the ``torch`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import ArgumentError, CorruptCheckpointError, UnsupportedError
from .._lazy.array import LazyArray
from .._lazy.graph import Node, SourceNode
from .._lazy.selection import Selection, outer_index
from .._paths import flatten, unflatten
from .checkpoint import Checkpoint

_VIEWED = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


class TorchTensorSource(SourceNode):
    """A CPU tensor (memory-mapped from its file) read as a numpy array."""

    def __init__(self, tensor: Any, dtype: np.dtype, path: str, origin: str) -> None:
        self.tensor, self.dtype = tensor, dtype
        self.shape = tuple(int(n) for n in tensor.shape)
        self.path, self.origin = path, origin

    def read(self, selection: Selection) -> np.ndarray:
        import torch  # heavy: loaded on first use, not at import

        tensor = self.tensor.contiguous()
        if self.dtype.name in _VIEWED:  # numpy has no such dtype: move the raw bits
            array = tensor.view(getattr(torch, _VIEWED[self.dtype.name])).numpy().view(self.dtype)
        else:
            array = tensor.numpy()
        return np.array(outer_index(array, selection), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


def open_torch(path: Path, allow_pickle: bool, separator: str = ".") -> Checkpoint:
    if not allow_pickle:
        raise ArgumentError(
            f"{str(path)!r} is a PyTorch pickle; unpickling can run code hidden in the file. "
            f"Open it only if you trust it, with allow_pickle=True (CLI: --allow-pickle), or "
            f"convert it to safetensors first."
        )
    try:
        import torch  # heavy: loaded on first use, not at import
    except ImportError as error:
        raise UnsupportedError(
            "Reading PyTorch files needs the torch extra: pip install 'suture[torch]'."
        ) from error
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises many kinds on damaged or unsafe input
        raise CorruptCheckpointError(
            f"{str(path)!r} could not be loaded as a PyTorch state dict with weights_only=True: "
            f"{type(error).__name__}: {error}."
        ) from error
    flat: dict[str, Any] = {}
    for key, value in flatten(state, sep="\\x00").items():
        name = separator.join(part for part in key.split("\\x00"))
        tree_path = "/".join(name.split(separator)) if separator else name
        if isinstance(value, torch.Tensor):
            dtype = to_dtype(str(value.dtype).removeprefix("torch."))
            value = LazyArray(TorchTensorSource(value, dtype, tree_path, str(path)), path=tree_path)
        flat[tree_path] = value
    return Checkpoint(unflatten(flat), location=str(path), format="torch")
