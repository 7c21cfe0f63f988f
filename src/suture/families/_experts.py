"""Mixture-of-experts in a family recipe: expert stacking and fused Hugging Face tensors.

A leaf whose ``hf`` name holds ``{expert}`` beside ``{layer}`` gathers one tensor per expert
and layer into one MaxText array, with experts and layers on the axes the table names
(``axes: {expert: 0, layer: 1}``, MaxText's layout for scanned MoE weights; unscanned, the
layer axis goes and the experts stay in front, as in each layer of Tunix's Qwen3 MoE).

Hugging Face stores experts two ways, and a recipe reads both, telling them apart from the
files: one tensor per expert (``mlp.experts.{e}.gate_proj.weight``, as published
checkpoints store them) or transformers v5's fused 3-D tensors (``mlp.experts.gate_up_proj``
of shape (experts, 2 x intermediate, hidden)). A leaf's ``fused:`` entry says where its
tensor sits in the fused one: its name, and which part of the fused axis it is, in
``halves`` (gate = first half) or ``interleaved`` (gate = even columns) order. Back to HF,
the parts are joined again: concatenated (halves) or zipped (interleaved). Parts of unequal
lengths say them (``split: {axis: 0, sizes: [hc_mult, hc_mult, hc_mult * hc_mult], part: 2}``,
expressions of the config: DeepSeek-V4's hyper-connection weights, one HF tensor for MaxText's
pre, post and residual leaves). Everything is a lazy view, so nothing is read until written.

Example:
    >>> import numpy as np
    >>> from suture import LazyArray
    >>> fused = FusedSource("w", axis=1, mode="interleaved", part=1, parts=2)
    >>> x = LazyArray.from_array(np.arange(8).reshape(1, 2, 4))  # (experts, 2 x 2, 4)
    >>> fused.take(LazyArray.from_array(np.arange(8).reshape(1, 4, 2)), 0).read().tolist()
    [[2, 3], [6, 7]]
    >>> fused.join([x[:, :1], x[:, 1:]]).read()[0].tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigMismatchError, RecipeFormatError
from .._lazy.array import LazyArray
from .._lazy.combine import concatenate
from .._lazy.combine import stack as stack_arrays
from ._expr import evaluate

PER_EXPERT = "per-expert"
FUSED = "fused"
EXPERT_LAYOUTS = (PER_EXPERT, FUSED)
MODES = ("halves", "interleaved")


@dataclass(frozen=True)
class FusedSource:
    """Where one leaf's tensor sits in a fused Hugging Face tensor.

    `hf` names the fused tensor (with ``{layer}``); when the leaf has experts, they are its
    axis 0. `axis` (of the fused tensor, experts included) is split into `parts` pieces, of
    which this leaf is `part`; `axis` None takes the whole tensor (e.g. ``down_proj``).
    """

    hf: str
    axis: int | None = None
    mode: str = "halves"
    part: int = 0
    parts: int = 1
    sizes: tuple[str, ...] = ()  # expressions: the parts' lengths, when they differ

    def take(
        self,
        fused: LazyArray,
        expert: int | None,
        names: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> LazyArray:
        """This leaf's piece of `fused` (one layer's, the HF tensor `name`), for one expert or
        all; `names` (the config's fields) give the lengths of unequal parts."""
        piece = fused if expert is None else fused[expert]
        if self.axis is None:
            return piece
        axis = self.axis - (0 if expert is None else 1)
        if not 0 <= axis < piece.ndim:
            raise ConfigMismatchError(
                f"Leaf {fused.path!r}: the table splits axis {self.axis} of this fused tensor, "
                f"which has shape {fused.shape}. The table's fused split does not fit it: "
                f"check its axis (experts are axis 0)."
            )
        length = piece.shape[axis]
        if self.sizes:
            return _sized_part(piece, axis, self, names or {}, name or fused.path)
        if length % self.parts:
            raise ConfigMismatchError(
                f"Leaf {fused.path!r}: axis {self.axis} has length {length}, which does not "
                f"split into {self.parts} equal parts. The checkpoint is not this family's "
                f"fused layout."
            )
        size = length // self.parts
        index: list[Any] = [slice(None)] * piece.ndim
        if self.mode == "halves":
            index[axis] = slice(self.part * size, (self.part + 1) * size)
        else:
            index[axis] = slice(self.part, None, self.parts)
        return piece[tuple(index)]

    def join(self, pieces: Sequence[LazyArray]) -> LazyArray:
        """The fused tensor from its parts (in part order), each with the fused tensor's axes."""
        if self.axis is None:
            (whole,) = pieces
            return whole
        if self.mode == "halves":
            return concatenate(list(pieces), axis=self.axis)
        zipped = stack_arrays(list(pieces), axis=self.axis + 1)  # (..., n, parts, ...)
        shape = pieces[0].shape
        merged = shape[: self.axis] + (shape[self.axis] * len(pieces),) + shape[self.axis + 1 :]
        return zipped.reshape(merged)


def _sized_part(
    piece: LazyArray, axis: int, fused: FusedSource, names: dict[str, Any], path: Any
) -> LazyArray:
    """Part `fused.part` of `piece` along `axis`, the parts `fused.sizes` long."""
    lengths = [int(evaluate(size, names)) for size in fused.sizes]
    if sum(lengths) != piece.shape[axis] or min(lengths) < 0:
        raise ConfigMismatchError(
            f"Hugging Face tensor {path!r} has shape {piece.shape}; the table splits axis "
            f"{fused.axis} into parts of {' + '.join(map(str, lengths))} = {sum(lengths)} "
            f"({', '.join(fused.sizes)}), and it holds {piece.shape[axis]} (each part 0 or "
            f"more). Check that config.json belongs to these weights."
        )
    start = sum(lengths[: fused.part])
    index: list[Any] = [slice(None)] * piece.ndim
    index[axis] = slice(start, start + lengths[fused.part])
    return piece[tuple(index)]


def parse_fused(spec: Any, where: str) -> FusedSource:
    """A `FusedSource` from its table form: ``{hf: NAME, split: {axis, mode, part, parts}}``."""
    if not isinstance(spec, dict) or not isinstance(spec.get("hf"), str):
        raise RecipeFormatError(f"{where}: 'fused' needs {{hf: NAME[, split: {{...}}]}}.")
    split = spec.get("split")
    if split is None:
        return FusedSource(spec["hf"])
    if (
        not isinstance(split, dict)
        or split.get("mode", "halves") not in MODES
        or not isinstance(split.get("axis"), int)
    ):
        raise RecipeFormatError(
            f"{where}: 'split' needs {{axis: N, mode: halves|interleaved, part: K, parts: P}}."
        )
    sizes = tuple(str(size) for size in split.get("sizes") or ())
    parts = len(sizes) if sizes else int(split.get("parts", 2))
    part = int(split.get("part", 0))
    if not 0 <= part < parts:
        raise RecipeFormatError(f"{where}: split part {part} is not one of {parts} parts.")
    return FusedSource(spec["hf"], split["axis"], split.get("mode", "halves"), part, parts, sizes)


def stacked_axes(expert_axis: int, layer_axis: int | None) -> tuple[int, int | None]:
    """(axis to stack experts on within one layer, axis to stack layers on), in build order.

    Experts are stacked first (one layer's), then layers; an expert axis after the layer
    axis sits one lower before the layers are added.
    """
    if layer_axis is None:
        return expert_axis, None
    return (expert_axis - 1 if expert_axis > layer_axis else expert_axis), layer_axis


def member(stacked: LazyArray, at: dict[int, int]) -> LazyArray:
    """`stacked` with the given axes indexed (``{axis: index}``), lazily."""
    index: list[Any] = [slice(None)] * stacked.ndim
    for axis, position in at.items():
        index[axis] = position
    return stacked[tuple(index)]


def check_count(
    array: LazyArray, axis: int, expected: int, what: str, named: str, source: str
) -> None:
    """`array` (`named`: ``MaxText leaf 'x'``) holds `expected` `what` on `axis`, as the config
    says (`source`: ``config.json gives num_local_experts=2``); otherwise an error naming both."""
    if array.ndim <= axis or array.shape[axis] != expected:
        held = array.shape[axis] if array.ndim > axis else "no"
        raise ConfigMismatchError(
            f"{named} has shape {array.shape}; expected {expected} {what} on axis {axis}, as "
            f"{source}: it holds {held}. Converting would drop or invent {what}: pass the "
            f"config.json of these weights (--config)."
        )
