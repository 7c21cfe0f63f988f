"""Checkpoint: an opened source, its lazy tree, and lookups by '/' path."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from .._errors import MissingLeafError, did_you_mean
from .._format import human_bytes
from .._lazy.array import LazyArray
from .._paths import flatten, map_leaves_with_path


class Checkpoint:
    """A checkpoint opened lazily: structure, shapes and dtypes known, no array data read.

    Attributes:
        tree: the nested tree; arrays are `LazyArray` leaves, other leaves (strings, Python
            numbers, None) keep their values.
        location: where it was opened from (a path, or ``"<memory>"``).
        format: ``"orbax"``, ``"memory"``, ...
        step: the CheckpointManager step that was opened, if any.
        custom_metadata: the user's metadata saved with the checkpoint (Orbax's
            ``custom_metadata``, safetensors' ``__metadata__``), or an empty dict. For the
            tree's own metadata (shapes, dtypes), use `abstract`.
        layout: how the source was laid out on disk, where a writer can reproduce it (the
            ``weight_map`` of a sharded safetensors folder; the ``quantization_config`` of a
            quantized Hugging Face folder, and ``dequantized: True`` when it was opened with
            ``dequantize=True``), or an empty dict.

    Example:
        >>> import numpy as np, suture
        >>> ckpt = suture.open({"params": {"w": np.zeros((2, 3), np.float32)}})
        >>> ckpt["params/w"]
        LazyArray(path='params/w', shape=(2, 3), dtype=float32)
        >>> ckpt.paths(), ckpt.nbytes
        (['params/w'], 24)
    """

    def __init__(
        self,
        tree: Any,
        *,
        location: str,
        format: str,  # noqa: A002 (the public word for it)
        step: int | None = None,
        custom_metadata: dict[str, Any] | None = None,
        layout: dict[str, Any] | None = None,
    ) -> None:
        self.tree = tree
        self.location = location
        self.format = format
        self.step = step
        self.custom_metadata = custom_metadata or {}
        self.layout = layout or {}

    @cached_property
    def _flat(self) -> dict[str, Any]:
        return flatten(self.tree)

    def paths(self) -> list[str]:
        """Every leaf's '/' path, in tree order."""
        return list(self._flat)

    def flat(self) -> dict[str, Any]:
        """``{path: leaf}`` for every leaf (a new dict each call)."""
        return dict(self._flat)

    def arrays(self) -> dict[str, LazyArray]:
        """``{path: LazyArray}`` for the array leaves only."""
        return {path: leaf for path, leaf in self._flat.items() if isinstance(leaf, LazyArray)}

    @property
    def nbytes(self) -> int:
        """Total bytes of all arrays, as they would be in memory."""
        return sum(leaf.nbytes for leaf in self.arrays().values())

    def __getitem__(self, path: str) -> Any:
        """A leaf, or a subtree, by its '/' path."""
        path = path.strip("/")
        if path in self._flat:
            return self._flat[path]
        subtree = self._subtree(path)
        if subtree is not None:
            return subtree
        raise MissingLeafError(
            f"{self.location} has no leaf {path!r}.{did_you_mean(path, self._flat)} "
            f"List the paths with ckpt.paths() or `suture inspect {self.location} --flat`."
        )

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        path = path.strip("/")
        return path in self._flat or self._subtree(path) is not None

    def _subtree(self, path: str) -> Any:
        prefix = path + "/"
        if not path or not any(key.startswith(prefix) for key in self._flat):
            return None
        node = self.tree
        for key in path.split("/"):
            node = node[int(key)] if isinstance(node, (list, tuple)) else node[key]
        return node

    def abstract(self) -> Any:
        """The tree with every array as a ``jax.ShapeDtypeStruct``; reads no array data.

        Example:
            >>> import numpy as np, suture
            >>> suture.open({"w": np.zeros(3, np.int8)}).abstract()
            {'w': ShapeDtypeStruct(shape=(3,), dtype=int8)}
        """
        import jax  # heavy: loaded on first use, not at import

        def describe(_: str, leaf: Any) -> Any:
            if isinstance(leaf, LazyArray):
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
            return leaf

        return map_leaves_with_path(describe, self.tree)

    def __repr__(self) -> str:
        step = f", step={self.step}" if self.step is not None else ""
        return (
            f"Checkpoint({self.location!r}, format={self.format!r}{step}, "
            f"{len(self.arrays())} arrays, {human_bytes(self.nbytes)})"
        )
