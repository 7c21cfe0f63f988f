"""One Hugging Face tensor feeding several target leaves, and written once on the way back.

Two leaves of a table may name the same ``hf`` tensor: a model whose keys and values share
one projection feeds it to both a key and a value kernel. To the target, each leaf reads it
and runs its own operations. Back to HF, each leaf gives the tensor back; it is written once,
and only if every leaf gives back the same bytes: when read (as it streams), the copies are
compared bit for bit, and copies that differ (a checkpoint whose key and value kernels were
trained apart) are a `ConfigMismatchError` naming the tensor and both leaves, not one leaf's
values silently kept.

.. code-block:: yaml

    leaves:
      - maxtext: decoder/layers/self_attention/key/kernel
        hf: model.layers.{layer}.self_attn.k_proj.weight
        ops: [transpose, {split_axis: {axis: 1, sizes: [num_key_value_heads, head_dim]}}]
      - maxtext: decoder/layers/self_attention/value/kernel
        hf: model.layers.{layer}.self_attn.k_proj.weight
        ops: [transpose, {split_axis: {axis: 1, sizes: [num_key_value_heads, head_dim]}}]

Example:
    >>> import numpy as np
    >>> from suture._lazy.array import as_lazy
    >>> given = GivenBack("my_table:maxtext", "MaxText")
    >>> given.give("k", as_lazy(np.ones(2)), "key/kernel")
    >>> given.give("k", as_lazy(np.ones(2)), "value/kernel")
    >>> given["k"].read().tolist(), given.sharers("k")
    ([1.0, 1.0], ['key/kernel', 'value/kernel'])
    >>> given.give("k", as_lazy(np.zeros(2)), "other/kernel")
    >>> given["k"].read()
    Traceback (most recent call last):
    ...
    suture._errors.ConfigMismatchError: Hugging Face tensor 'k' feeds MaxText leaves 'key/kernel' and 'other/kernel' (recipe 'my_table:maxtext'), which give it back different values: ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .._errors import ConfigMismatchError
from .._lazy.array import LazyArray
from .._lazy.array import map as lazy_map


class GivenBack(dict):  # type: ignore[type-arg]
    """``{key: LazyArray}`` given back by a recipe's leaves, each key written once.

    `what` names a key in messages (``Hugging Face tensor {!r}``; a fused tensor's part).
    """

    def __init__(self, recipe: str, label: str, what: str = "Hugging Face tensor {!r}") -> None:
        super().__init__()
        self.recipe, self.label, self.what = recipe, label, what
        self._copies: dict[Any, list[tuple[str, LazyArray]]] = {}

    def give(self, key: Any, tensor: LazyArray, leaf: str) -> None:
        """`tensor` as `key`, given back by target `leaf`; a second leaf's must agree."""
        copies = self._copies.setdefault(key, [])
        copies.append((leaf, tensor))
        if len(copies) == 1:
            self[key] = tensor
            return
        first_leaf, first = copies[0]
        if tensor.shape != first.shape or tensor.dtype != first.dtype:
            raise ConfigMismatchError(
                f"{self._both(key, first_leaf, leaf)}, which give it back as {first.shape} "
                f"{first.dtype} and {tensor.shape} {tensor.dtype}. {self._fix()}"
            )
        self[key] = _agreeing(copies, self._both, key, self._fix())

    def give_all(self, tensors: Iterable[tuple[Any, LazyArray]], leaf: str) -> None:
        for key, tensor in tensors:
            self.give(key, tensor, leaf)

    def sharers(self, key: Any) -> list[str]:
        """The target leaves that gave `key` back, in order."""
        return [leaf for leaf, _ in self._copies.get(key, [])]

    def _both(self, key: Any, first: str, other: str) -> str:
        return (
            f"{self.what.format(key)} feeds {self.label} leaves {first!r} and {other!r} "
            f"(recipe {self.recipe!r})"
        )

    @staticmethod
    def _fix() -> str:
        return (
            "It can be written only once: make those leaves hold the same values, or convert "
            "with a table that gives each leaf its own tensor."
        )


def shared_sources(leaves: Iterable[Any]) -> dict[str, list[str]]:
    """HF tensor -> the target leaves it feeds, for the tensors that feed more than one
    (a fused tensor's parts are not shared: each leaf reads its own part)."""
    feeds: dict[str, list[str]] = {}
    for leaf in leaves:
        if leaf.made is None and not leaf.always_fused:
            for name in dict.fromkeys(leaf.sources()):
                feeds.setdefault(name, []).append(leaf.maxtext)
    return {name: targets for name, targets in feeds.items() if len(targets) > 1}


def shared_note(leaf: Any, shared: dict[str, list[str]]) -> list[str]:
    """``also feeds decoder/...; written back once, if they agree`` for `suture recipes`."""
    others = [
        target
        for name in leaf.sources()
        for target in shared.get(name, [])
        if target != leaf.maxtext
    ]
    if not others:
        return []
    return [f"its source also feeds {', '.join(dict.fromkeys(others))}; written back once"]


def _agreeing(copies: list[tuple[str, LazyArray]], both: Any, key: Any, fix: str) -> LazyArray:
    """The first copy, read with every other compared to it bit for bit (block by block)."""
    leaves = [leaf for leaf, _ in copies]

    def agreed(first: np.ndarray, *others: np.ndarray) -> np.ndarray:
        for leaf, other in zip(leaves[1:], others, strict=True):
            differ = _differ(first, other)
            if differ.any():
                at = tuple(int(i) for i in np.argwhere(differ)[0]) if differ.ndim else ()
                raise ConfigMismatchError(
                    f"{both(key, leaves[0], leaf)}, which give it back different values: "
                    f"{int(differ.sum())} of a block of {differ.size} differ, the first "
                    f"{first[at]} from {leaves[0]!r} and {other[at]} from {leaf!r}. {fix}"
                )
        return first

    agreed.__name__ = "shared source check"
    first = copies[0][1]
    return lazy_map(
        agreed, *(t for _, t in copies), shape=first.shape, dtype=first.dtype, elementwise=True
    )


def _differ(first: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Where two arrays of one shape and dtype differ in their bits (NaNs compared too)."""
    size = first.dtype.itemsize
    if size in (1, 2, 4, 8):
        return np.asarray(first).view(f"u{size}") != np.asarray(other).view(f"u{size}")
    bytes_of = [
        np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (size,)) for a in (first, other)
    ]
    return (bytes_of[0] != bytes_of[1]).any(axis=-1)
