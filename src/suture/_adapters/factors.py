"""A LoRA pair through a family recipe's operations, factor by factor.

A Hugging Face weight is ``(out, in)`` and its LoRA delta ``B @ A`` (``A`` (r, in), ``B``
(out, r)). A recipe turns the weight into its target kernel by transposes, axis
permutations, head splits, rotary reorders and scales; each of those acts on the input axes
or on the output axes alone, so it can act on ``A`` or on ``B`` alone. The target's factors
are ``a`` (input axes..., r) and ``b`` (r, output axes...), as NNX's ``LoRA`` and qwix keep
them, and ``a @ b`` (contracted over r, reshaped) is the recipe's image of ``B @ A``. A
scale goes to ``b``.

Example:
    >>> import numpy as np
    >>> from suture.families._ops import Transpose
    >>> A, B = np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)
    >>> a, b = to_target((Transpose(),), {}, A, B)
    >>> a.shape, b.shape
    ((3, 2), (2, 4))
    >>> [x.shape for x in to_hf((Transpose(),), {}, a, b)]
    [(2, 3), (4, 2)]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._errors import ConfigMismatchError, UnsupportedError
from ..families._ops import InterleaveRope, Permute, Scale, SplitAxis, Transpose

IN, OUT = "in", "out"


def target_roles(operations: tuple[Any, ...], names: dict[str, Any]) -> list[str]:
    """Which of the HF weight's axes (``out`` or ``in``) each target axis comes from."""
    roles = [OUT, IN]
    for op in operations:
        roles = _roles_after(op, roles, names)
    return roles


def target_shapes(
    operations: tuple[Any, ...], names: dict[str, Any]
) -> tuple[tuple[int | None, ...], tuple[int | None, ...]]:
    """The target kernel's input and output axes' lengths (None: the HF axis, unsplit)."""
    roles: list[str] = [OUT, IN]
    sizes: list[int | None] = [None, None]
    for op in operations:
        if isinstance(op, SplitAxis):
            sizes[op.axis : op.axis + 1] = list(op._sizes(names))
        elif isinstance(op, Transpose):
            sizes = sizes[::-1]
        elif isinstance(op, Permute):
            sizes = [sizes[a] for a in op.axes]
        roles = _roles_after(op, roles, names)
    pick = lambda role: tuple(s for s, r in zip(sizes, roles, strict=True) if r == role)  # noqa: E731
    return pick(IN), pick(OUT)


def _roles_after(op: Any, roles: list[str], names: dict[str, Any]) -> list[str]:
    if isinstance(op, Transpose):
        return roles[::-1]
    if isinstance(op, Permute):
        return [roles[a] for a in op.axes]
    if isinstance(op, SplitAxis):
        return roles[: op.axis] + [roles[op.axis]] * len(op.sizes) + roles[op.axis + 1 :]
    if isinstance(op, InterleaveRope | Scale):
        return roles
    raise UnsupportedError(
        f"A LoRA factor cannot go through the recipe operation {op.describe(names)!r}: it "
        f"does not act on the input or output axes alone. LoRA of this tensor (an "
        f"embedding, a norm, a padded vocabulary) is not supported; leave it out of the "
        f"adapter's target modules."
    )


def _check_order(roles: list[str], where: str) -> None:
    count = roles.count(IN)
    if roles != [IN] * count + [OUT] * (len(roles) - count):
        raise UnsupportedError(
            f"{where}: the target kernel's axes are {roles} (from the HF weight's output and "
            f"input axes); a LoRA pair a @ b needs the input axes first. This leaf cannot "
            f"carry LoRA factors."
        )


class _Pair:
    """``a`` (input axes..., r) and ``b`` (r, output axes...) with the full tensor's roles."""

    def __init__(self, a: np.ndarray, b: np.ndarray, roles: list[str]) -> None:
        self.a, self.b, self.roles = a, b, list(roles)

    def _place(self, axis: int) -> tuple[str, int]:
        """(role, position in its factor's array) of the full tensor's `axis`."""
        role = self.roles[axis]
        index = self.roles[:axis].count(role)
        return role, index if role == IN else index + 1

    def _reorder(self, new_roles_order: list[int]) -> None:
        """The full tensor's axes become ``[old[i] for i in new_roles_order]``."""
        old = self.roles
        for role in (IN, OUT):
            positions = [i for i, r in enumerate(old) if r == role]
            order = [positions.index(i) for i in new_roles_order if old[i] == role]
            if role == IN:
                self.a = self.a.transpose([*order, len(order)])
            else:
                self.b = self.b.transpose([0, *(1 + k for k in order)])
        self.roles = [old[i] for i in new_roles_order]

    def _reshape(self, axis: int, count: int, sizes: tuple[int, ...] | None) -> None:
        """Splits the full `axis` into `sizes`, or merges `count` axes from it (sizes None)."""
        role, at = self._place(axis)
        array = self.a if role == IN else self.b
        if sizes is not None:
            shape = array.shape[:at] + sizes + array.shape[at + 1 :]
            self.roles[axis : axis + 1] = [role] * len(sizes)
        else:
            merged = math.prod(array.shape[at : at + count])
            shape = array.shape[:at] + (merged,) + array.shape[at + count :]
            self.roles[axis : axis + count] = [role]
        if role == IN:
            self.a = self.a.reshape(shape)
        else:
            self.b = self.b.reshape(shape)

    def _take_last(self, order: np.ndarray) -> None:
        role = self.roles[-1]
        if role == IN:  # the last input axis sits before r
            self.a = np.take(self.a, order, axis=self.a.ndim - 2)
        else:
            self.b = np.take(self.b, order, axis=-1)

    def _last_length(self) -> int:
        return self.a.shape[-2] if self.roles[-1] == IN else self.b.shape[-1]

    def forward(self, op: Any, names: dict[str, Any]) -> None:
        if isinstance(op, Transpose):
            self._reorder(list(range(len(self.roles)))[::-1])
        elif isinstance(op, Permute):
            self._reorder(list(op.axes))
        elif isinstance(op, SplitAxis):
            sizes = op._sizes(names)
            self._check_length(op.axis, math.prod(sizes), sizes)
            self._reshape(op.axis, 1, sizes)
        elif isinstance(op, InterleaveRope):
            half = self._last_length() // 2
            self._take_last(np.stack([np.arange(half), np.arange(half) + half], -1).reshape(-1))
        elif isinstance(op, Scale):
            self.b = _scaled(self.b, op.forward_op, op._factor(op.forward_by, names), op.compute)
        else:
            _roles_after(op, self.roles, names)  # raises

    def backward(self, op: Any, names: dict[str, Any]) -> None:
        if isinstance(op, Transpose):
            self._reorder(list(range(len(self.roles)))[::-1])
        elif isinstance(op, Permute):
            self._reorder([int(i) for i in np.argsort(op.axes)])
        elif isinstance(op, SplitAxis):
            sizes = op._sizes(names)
            role, at = self._place(op.axis)
            found = (self.a if role == IN else self.b).shape[at : at + len(sizes)]
            if found != sizes:
                raise ConfigMismatchError(
                    f"A LoRA factor's axes {at}-{at + len(sizes) - 1} are {found}, and the "
                    f"config says {sizes}: the adapter was not made for this config. Pass the "
                    f"base model's config.json (--config)."
                )
            self._reshape(op.axis, len(sizes), None)
        elif isinstance(op, InterleaveRope):
            n = self._last_length()
            self._take_last(np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)]))
        elif isinstance(op, Scale):
            factor = op._factor(op.backward_by, names)
            self.b = _scaled(self.b, op.backward_op, factor, op.back_compute)
        else:
            _roles_after(op, self.roles, names)

    def _check_length(self, axis: int, length: int, sizes: tuple[int, ...]) -> None:
        role, at = self._place(axis)
        found = (self.a if role == IN else self.b).shape[at]
        if found != length:
            raise ConfigMismatchError(
                f"A LoRA factor's {role}put axis has length {found}, and the config splits it "
                f"into {' x '.join(map(str, sizes))} = {length}: the adapter does not belong "
                f"to a model of this config. Pass the base model's config.json (--config)."
            )


def _scaled(values: np.ndarray, op: str, factor: float, compute: str) -> np.ndarray:
    """As the recipe's `Scale` computes it, on one factor."""
    wide = values.astype(compute)
    (np.multiply if op == "multiply" else np.divide)(wide, np.dtype(compute).type(factor), out=wide)
    return wide.astype(values.dtype, copy=False)


def to_target(
    operations: tuple[Any, ...], names: dict[str, Any], lora_a: np.ndarray, lora_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """PEFT's ``lora_A`` (r, in) and ``lora_B`` (out, r) as the target's ``a`` and ``b``."""
    pair = _Pair(np.asarray(lora_a).T, np.asarray(lora_b).T, [OUT, IN])
    for op in operations:
        pair.forward(op, names)
    _check_order(pair.roles, "LoRA export")
    return pair.a, pair.b


def to_hf(
    operations: tuple[Any, ...],
    names: dict[str, Any],
    a: np.ndarray,
    b: np.ndarray,
    where: str = "LoRA factors",
) -> tuple[np.ndarray, np.ndarray]:
    """The target's ``a`` (input axes..., r) and ``b`` (r, output axes...) as PEFT's
    ``lora_A`` (r, in) and ``lora_B`` (out, r). A factor whose input (output) axes come
    flattened into one, as NNX's ``LoRA`` of an einsum kernel keeps them, is unflattened."""
    roles = target_roles(operations, names)
    _check_order(roles, where)
    a, b = np.asarray(a), np.asarray(b)
    ins, outs = target_shapes(operations, names)
    a = _unflattened(a, ins, a.ndim - 1, True, where)
    b = _unflattened(b, outs, b.ndim - 1, False, where)
    if a.shape[-1] != b.shape[0]:
        raise ConfigMismatchError(
            f"{where}: a has shape {a.shape} and b {b.shape}; a's last axis and b's first are "
            f"the rank and must agree. The pair is not one adapter's."
        )
    pair = _Pair(a, b, roles)
    for op in reversed(operations):
        pair.backward(op, names)
    return pair.a.T, pair.b.T


def _unflattened(
    factor: np.ndarray, shape: tuple[int | None, ...], axes: int, is_a: bool, where: str
) -> np.ndarray:
    if axes == len(shape) or factor.ndim < 2:
        return factor
    known = math.prod(s for s in shape if s is not None)
    flat = factor.shape[:-1] if is_a else factor.shape[1:]
    if axes == 1 and shape.count(None) <= 1 and flat[0] % known == 0:
        full = tuple(flat[0] // known if s is None else s for s in shape)
        return factor.reshape(full + factor.shape[-1:] if is_a else factor.shape[:1] + full)
    raise ConfigMismatchError(
        f"{where}: factor {'a' if is_a else 'b'} has shape {factor.shape}; the recipe's "
        f"kernel has {len(shape)} {'input' if is_a else 'output'} axes {shape}. The factors "
        f"do not belong to this leaf, or the config is another model's (--config)."
    )
