"""A Hugging Face tensor that folders store in two axis orders, told apart by its shape.

Qwen3-VL-MoE's published folders store each layer's experts as ``gate_up_proj`` (experts,
hidden, 2 x intermediate) and ``down_proj`` (experts, intermediate, hidden), while transformers
5.24's ``save_pretrained`` writes them with the last two axes swapped. A leaf's ``stored:`` entry
gives the shape in the table's order (expressions of the config) and the other order's axes
(``also_permuted``); a tensor of either shape is read in the table's order, lazily (a view),
before any other operation. A shape that is the same both ways (a square pair of axes) cannot
say which order it has, and is refused rather than guessed. Back to HF, the table's order is
written (the published one, which transformers loads), or the order of the ``like`` folder's
tensor of that name (`like_order`).

.. code-block:: yaml

    - maxtext: decoder/layers/moe_block/wo
      hf: model.layers.{layer}.mlp.experts.down_proj
      stored: {shape: [num_local_experts, moe_intermediate_size, hidden_size], also_permuted: [0, 2, 1]}
      axes: {expert: 0}

Example:
    >>> import numpy as np
    >>> from suture._lazy.array import as_lazy
    >>> order = StoredOrder(("experts", "rows", "cols"), (0, 2, 1))
    >>> names = {"experts": 1, "rows": 2, "cols": 3}
    >>> saved = as_lazy(np.arange(6).reshape(1, 3, 2), path="w")
    >>> order.read(saved, names, "r").read()[0].tolist()
    [[0, 2, 4], [1, 3, 5]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ConfigMismatchError, RecipeFormatError
from .._lazy.array import LazyArray, as_lazy
from ._expr import whole


@dataclass(frozen=True)
class StoredOrder:
    shape: tuple[Any, ...]  # expressions: the tensor's shape in the table's order
    permuted: tuple[int, ...]  # the other order, as the table's axes taken in this order

    def shapes(self, names: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the table's shape, the other order's) with this config."""
        table = tuple(whole(size, names, "a size of a stored tensor") for size in self.shape)
        return table, tuple(table[axis] for axis in self.permuted)

    def read(self, array: LazyArray, names: dict[str, Any], recipe: str) -> LazyArray:
        """`array` in the table's order, whichever of the two it is stored in."""
        table, other = self.shapes(names)
        if array.shape == table and table != other:
            return array
        if array.shape == other and table != other:
            return array.transpose(tuple(int(axis) for axis in np.argsort(self.permuted)))
        if table == other:
            raise ConfigMismatchError(
                f"Recipe {recipe!r}: Hugging Face tensor {array.path!r} has shape {array.shape}, "
                f"the same in both orders folders store it in (the table's {table}, and axes "
                f"{list(self.permuted)} of it), so its shape cannot tell which it is. Converting "
                f"would guess. Convert it with a table that names its one order (a copy of this "
                f"table without 'stored', its ops adjusted), or check the config's sizes."
            )
        raise ConfigMismatchError(
            f"Recipe {recipe!r}: Hugging Face tensor {array.path!r} has shape {array.shape}; "
            f"expected {table} (as published) or {other} (axes {list(self.permuted)}, as "
            f"transformers' save_pretrained writes it) from the config ("
            f"{', '.join(map(str, self.shape))}). Pass the config.json of these weights."
        )

    def describe(self, names: dict[str, Any]) -> str:
        table, other = self.shapes(names)
        return f"stored {table} or {other} (axes {list(self.permuted)}), read as {table}"

    def expressions(self) -> tuple[Any, ...]:
        return self.shape


def like_order(
    recipe: Any, original: dict[str, Any], out: dict[str, Any], names: dict, prefix: str | None
) -> None:
    """Each tensor of `out` that a leaf with two stored orders gives back, in the order the
    `original` folder (``like``) stores it, when that is the other one."""
    language_model = recipe.language_model
    for leaf in recipe._active(names):
        if leaf.stored is None:
            continue
        table, other = leaf.stored.shapes(names)
        indices = recipe._layer_indices(leaf.group, names) if leaf.group else [None]
        for index in indices:
            name = leaf.hf_name(None, index)
            if language_model is not None and prefix is not None:
                name = language_model.hf_name(name, prefix)
            if name not in out or name not in original or table == other:
                continue
            if tuple(as_lazy(original[name]).shape) == other and out[name].shape == table:
                out[name] = out[name].transpose(leaf.stored.permuted)


def parse_stored(spec: Any, where: str) -> StoredOrder:
    """A `StoredOrder` from its table form: ``{shape: [EXPRESSIONS], also_permuted: [AXES]}``."""
    rule = f"{where}: 'stored' needs {{shape: [sizes], also_permuted: [axes]}}, of one length"
    if not isinstance(spec, dict) or set(spec) != {"shape", "also_permuted"}:
        raise RecipeFormatError(f"{rule}; got {spec!r:.200}")
    shape, permuted = spec["shape"], spec["also_permuted"]
    if (
        not isinstance(shape, list)
        or not isinstance(permuted, list)
        or len(shape) != len(permuted)
        or not all(type(axis) is int for axis in permuted)
        or sorted(permuted) != list(range(len(permuted)))
        or permuted == sorted(permuted)
    ):
        raise RecipeFormatError(
            f"{rule}; also_permuted is another order of the axes; got {spec!r:.200}"
        )
    return StoredOrder(tuple(shape), tuple(permuted))
