"""The operations a model-family recipe applies to one tensor, each with its exact inverse.

An operation turns a Hugging Face tensor (one layer's) into its MaxText form (`forward`) and
back (`backward`). All are lazy: they build `LazyArray` views and elementwise maps, so a
recipe streams like any other surgery.

| recipe word      | forward                                   | backward                     |
| ---------------- | ----------------------------------------- | ---------------------------- |
| ``transpose``    | reverse the axes (``w.T``)                | the same                     |
| ``permute``      | reorder the axes (``[0, 2, 1]``: ``(N, H, D) -> (N, D, H)``) | the inverse order |
| ``split_axis``   | one axis -> several (``(E, H*D) -> (E, H, D)``) | merge them again       |
| ``interleave_rope`` | last axis halves -> pairs (``[a|b] -> a0 b0 a1 b1``) | pairs -> halves  |
| ``scale``        | multiply or divide by a config expression | what the recipe says (MaxText's own inverse) |
| ``add``          | add a constant (Gemma's ``1 + w`` norms)  | subtract it                  |
| ``pad_rows``     | zero rows up to a size (a padded vocabulary) | drop them                 |
| ``fit_rows``     | cut or zero-pad rows to a size (MaxText's vocabulary) | back to the HF size (cut rows come back from ``like``) |

Structural operations are exact. ``scale`` and ``add`` change values: a round trip is exact
only when the factor is a power of two; otherwise it comes back within about 1 ulp, which
each operation's `describe` says and `suture recipes NAME --config` shows.

Example:
    >>> import numpy as np
    >>> from suture import LazyArray
    >>> op = parse_operation("interleave_rope", "q")
    >>> x = LazyArray.from_array(np.arange(4.0))
    >>> op.forward(x, {}).read().tolist(), op.backward(op.forward(x, {}), {}).read().tolist()
    ([0.0, 2.0, 1.0, 3.0], [0.0, 1.0, 2.0, 3.0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .._dtypes import to_dtype
from .._errors import ConfigMismatchError, ExpressionError, RecipeFormatError
from .._lazy.array import LazyArray, elementwise
from .._lazy.combine import fit_shape
from ._expr import evaluate, located, names_in, whole

# A padded vocabulary adds a few rows (to a multiple of 128, say): at most as many as the
# tensor has, or this many. A config asking for more is a mistake, and would write terabytes.
MAX_ADDED_ROWS = 1 << 16


class Operation:
    """One invertible step of a family recipe."""

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        raise NotImplementedError

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        raise NotImplementedError

    def describe(self, names: dict[str, Any]) -> str:
        raise NotImplementedError

    def expressions(self) -> tuple[Any, ...]:
        """The config expressions it reads (their fields are checked before any planning)."""
        return ()


@dataclass(frozen=True)
class Transpose(Operation):
    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        return array.T

    backward = forward

    def describe(self, names: dict[str, Any]) -> str:
        return "transpose"


@dataclass(frozen=True)
class Permute(Operation):
    axes: tuple[int, ...]

    def _check(self, array: LazyArray) -> None:
        if sorted(self.axes) != list(range(array.ndim)):
            raise ConfigMismatchError(
                f"Leaf {array.path!r}: permute {list(self.axes)} needs an array of "
                f"{len(self.axes)} axes; found shape {array.shape}. The recipe does not fit "
                f"this model."
            )

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        self._check(array)
        return array.transpose(self.axes)

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        self._check(array)
        return array.transpose(tuple(int(i) for i in np.argsort(self.axes)))

    def describe(self, names: dict[str, Any]) -> str:
        return f"permute axes to {list(self.axes)}"


@dataclass(frozen=True)
class SplitAxis(Operation):
    axis: int
    sizes: tuple[Any, ...]

    def _sizes(self, names: dict[str, Any]) -> tuple[int, ...]:
        return tuple(whole(size, names, "a size split_axis splits into") for size in self.sizes)

    def _check_rank(self, array: LazyArray, axes: int) -> None:
        """The table's axis (and the `axes` after it) exists in `array`; shapes are known only
        here, not when the table is loaded."""
        if self.axis + axes > array.ndim:
            raise ConfigMismatchError(
                f"Leaf {array.path!r}: split_axis splits axis {self.axis}"
                f"{f' (and merges {axes} axes from it)' if axes > 1 else ''}, and the array "
                f"has {array.ndim} axes (shape {array.shape}) there. The table's split_axis "
                f"does not fit this tensor: check its axis, counting the operations before it."
            )

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        self._check_rank(array, 1)
        sizes = self._sizes(names)
        if math.prod(sizes) != array.shape[self.axis]:
            raise ConfigMismatchError(
                f"Leaf {array.path!r}: axis {self.axis} has length {array.shape[self.axis]}, "
                f"expected {' x '.join(map(str, sizes))} = {math.prod(sizes)} from the config "
                f"({', '.join(map(str, self.sizes))}). The checkpoint does not fit its "
                f"config.json: check the head counts and head_dim."
            )
        shape = array.shape[: self.axis] + sizes + array.shape[self.axis + 1 :]
        return array.reshape(shape)

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        count = len(self.sizes)
        self._check_rank(array, count)
        sizes = self._sizes(names)
        found = array.shape[self.axis : self.axis + count]
        if found != sizes:
            # merging (2, 8) where the config says (4, 4) gives the right shape, wrong values
            raise ConfigMismatchError(
                f"Leaf {array.path!r} has shape {array.shape}: axes {self.axis}-"
                f"{self.axis + count - 1} are {found}, and the config says "
                f"{_fields(self.sizes, sizes, names)}. This checkpoint was not made with this "
                f"config: pass the config.json it was converted from (--config), or --like the "
                f"original Hugging Face folder."
            )
        merged = math.prod(sizes)
        return array.reshape(
            array.shape[: self.axis] + (merged,) + array.shape[self.axis + count :]
        )

    def describe(self, names: dict[str, Any]) -> str:
        return f"split axis {self.axis} into {self._sizes(names)}"

    def expressions(self) -> tuple[Any, ...]:
        return self.sizes


@dataclass(frozen=True)
class InterleaveRope(Operation):
    """Hugging Face's rotary layout (two halves) <-> MaxText's Llama 3.1 layout (pairs)."""

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        half = _even_half(array)
        order = np.stack([np.arange(half), np.arange(half) + half], axis=-1).reshape(-1)
        return array[..., order]

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        _even_half(array)
        order = np.concatenate([np.arange(0, array.shape[-1], 2), np.arange(1, array.shape[-1], 2)])
        return array[..., order]

    def describe(self, names: dict[str, Any]) -> str:
        return "interleave rope halves"


def _even_half(array: LazyArray) -> int:
    if array.shape[-1] % 2:
        raise ConfigMismatchError(
            f"Leaf {array.path!r}: the rotary layout needs an even last axis, found "
            f"{array.shape[-1]}. The recipe does not fit this model."
        )
    return array.shape[-1] // 2


def _tabulated(function: Any) -> Any:
    """`function` (elementwise, dtype-preserving), computed for float16 and bfloat16 arrays
    as a lookup in its own results for all 65536 bit patterns, made on first use: the same
    bits, for a third of the CPU of a float32 round trip (a float16 query kernel scaled by
    1/sqrt(head_dim) spent most of it rounding back to float16). A block holding a value
    large enough to overflow is computed as it is, so that numpy says so, as it did.

    Example:
        >>> halve = _tabulated(lambda v: (v.astype(np.float32) / 2).astype(v.dtype))
        >>> halve(np.full(1 << 16, 3.0, np.float16))[:2].tolist()
        [1.5, 1.5]
    """
    tables: dict[np.dtype, tuple[np.ndarray, int] | None] = {}  # None: not dtype-preserving

    def looked_up(values: np.ndarray) -> np.ndarray:
        if values.dtype not in _TABULATED or values.size < _TABLE_FROM:
            return function(values)
        if values.dtype not in tables:  # two threads may both make it: the same table
            tables[values.dtype] = _table_of(function, values.dtype)
        made = tables[values.dtype]
        bits = values.view(np.uint16)
        # the largest magnitude (as bits: they order as the values do) against the smallest
        # that does not come out finite; infinities and NaN are past it too
        if made is None or int(np.bitwise_and(bits, 0x7FFF).max()) >= made[1]:
            return function(values)
        out = np.empty(values.shape, values.dtype)
        np.take(made[0], bits, out=out.view(np.uint16), mode="clip")
        return out

    return looked_up


def _table_of(function: Any, dtype: np.dtype) -> tuple[np.ndarray, int] | None:
    """`function` of every `dtype` bit pattern (read-only uint16), and the smallest
    magnitude, as bits, of a finite value whose result is not finite (0x10000: none);
    None where `function` does not keep `dtype`."""
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    with np.errstate(all="ignore"):
        results = np.asarray(function(every))
    if results.dtype != dtype or results.shape != every.shape:
        return None
    with np.errstate(invalid="ignore"):
        finite_in = np.isfinite(every.astype(np.float32))
        lost = finite_in & ~np.isfinite(results.astype(np.float32))
    magnitudes = np.arange(1 << 16, dtype=np.int64) & 0x7FFF
    smallest = int(magnitudes[lost].min()) if lost.any() else 1 << 16
    table = results.view(np.uint16)
    table.flags.writeable = False
    return table, smallest


_TABULATED = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_TABLE_FROM = 1 << 16  # smaller arrays: computing them costs less than making the table
MAX_FACTOR = 2.0**24  # a scale is 1/sqrt(head_dim) or sqrt(hidden_size): far inside it


@dataclass(frozen=True)
class Scale(Operation):
    """Multiply or divide by a config expression, computed in `compute` precision."""

    forward_op: str  # "multiply" or "divide"
    forward_by: Any
    backward_op: str
    backward_by: Any
    compute: str = "float32"
    back_compute: str = "float32"
    factor_dtype: str | None = None  # round the factor first (Gemma 3: bfloat16(sqrt(hidden)))

    def _apply(self, array: LazyArray, op: str, by: Any, compute: str, names: dict) -> LazyArray:
        factor = np.dtype(compute).type(self._factor(by, names))
        dtype = array.dtype

        def scaled(values: np.ndarray) -> np.ndarray:
            wide = values.astype(compute)  # a copy: scaled in place, no second temporary
            (np.multiply if op == "multiply" else np.divide)(wide, factor, out=wide)
            return wide.astype(dtype, copy=False)

        return elementwise(_tabulated(scaled), array, name=f"{op} {float(factor):.6g}")

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        return self._apply(array, self.forward_op, self.forward_by, self.compute, names)

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        return self._apply(array, self.backward_op, self.backward_by, self.back_compute, names)

    def _factor(self, by: Any, names: dict[str, Any]) -> float:
        value = evaluate(by, names)
        if not isinstance(value, int | float) or not 1 / MAX_FACTOR <= abs(value) <= MAX_FACTOR:
            raise ExpressionError(
                f"{located(by)}scale by {str(by)!r} is {value!r:.40} with this config; a scale "
                f"factor is a number between 2**-24 and 2**24 in size (0 could not be undone, and "
                f"past those the values overflow or vanish). Check the expression and the config."
            )
        if self.factor_dtype is None:
            return float(value)
        return float(np.asarray(value, dtype=to_dtype(self.factor_dtype)))

    def exact_for(self, names: dict[str, Any]) -> bool:
        factor = self._factor(self.forward_by, names)
        mantissa, _ = math.frexp(factor)
        return mantissa == 0.5 and self._factor(self.backward_by, names) in (factor, 1 / factor)

    def describe(self, names: dict[str, Any]) -> str:
        factor = self._factor(self.forward_by, names)
        closeness = "exact round trip" if self.exact_for(names) else "round trip within 1 ulp"
        return f"{self.forward_op} by {self.forward_by} = {factor:.6g} ({closeness})"

    def expressions(self) -> tuple[Any, ...]:
        return (self.forward_by, self.backward_by)


@dataclass(frozen=True)
class Add(Operation):
    value: float

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        return elementwise(lambda x: x + np.asarray(self.value, x.dtype), array, name="add")

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        return elementwise(lambda x: x - np.asarray(self.value, x.dtype), array, name="subtract")

    def describe(self, names: dict[str, Any]) -> str:
        return f"add {self.value:g} (round trip within half an ulp of {self.value:g})"


@dataclass(frozen=True)
class PadRows(Operation):
    """Zero rows from `back_to` (the model's rows, ``vocab_size``) up to `to`, and back."""

    to: Any
    back_to: Any

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        rows, own = _rows(self.to, names), _rows(self.back_to, names)
        if array.shape[0] != own or rows < own:
            raise ConfigMismatchError(
                f"Leaf {array.path!r} has {array.shape[0]} rows; the config says {own} "
                f"({self.back_to}), padded to {rows} ({self.to}). Pass the config.json of "
                f"these weights."
            )
        return _grown(array, rows, self.to, names)

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        rows, own = _rows(self.to, names), _rows(self.back_to, names)
        if array.shape[0] != rows or rows < own:
            raise ConfigMismatchError(
                f"Leaf {array.path!r} has {array.shape[0]} rows; the config says {rows} "
                f"({self.to}), of which the model's own are {own} ({self.back_to}). Pass the "
                f"config.json of this model."
            )
        return fit_shape(array, (own,) + array.shape[1:])

    def describe(self, names: dict[str, Any]) -> str:
        return f"pad rows to {_rows(self.to, names)}"

    def expressions(self) -> tuple[Any, ...]:
        return (self.to, self.back_to)


@dataclass(frozen=True)
class FitRows(Operation):
    """Rows cut or zero-padded to `to` (MaxText's vocabulary), and back to `back_to`.

    Cut rows are lost to MaxText; back to HF they come back as zeros, or from the original
    checkpoint when the reverse conversion is given it (`like`).
    """

    to: Any
    back_to: Any

    def forward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        _check_rows(array, self.back_to, names)
        return _grown(array, _rows(self.to, names), self.to, names)

    def backward(self, array: LazyArray, names: dict[str, Any]) -> LazyArray:
        _check_rows(array, self.to, names)
        return _grown(array, _rows(self.back_to, names), self.back_to, names)

    def expressions(self) -> tuple[Any, ...]:
        return (self.to, self.back_to)

    def cut(self, names: dict[str, Any]) -> tuple[int, int]:
        """(rows MaxText keeps, rows HF has)."""
        return _rows(self.to, names), _rows(self.back_to, names)

    def describe(self, names: dict[str, Any]) -> str:
        kept, rows = self.cut(names)
        if kept >= rows:
            return f"pad rows to {kept}" if kept > rows else f"keep the {rows} rows"
        return (
            f"cut rows to {kept} ({rows - kept} rows past it are left out; --reverse --like "
            f"ORIGINAL restores them)"
        )


def _rows(expression: Any, names: dict[str, Any]) -> int:
    return whole(expression, names, "a count of rows")


def _check_rows(array: LazyArray, expression: Any, names: dict[str, Any]) -> None:
    """`array` has the rows the config says (`expression`): cutting or padding a vocabulary
    of another size would drop rows or invent them."""
    rows = _rows(expression, names)
    if array.ndim == 0 or array.shape[0] != rows:
        raise ConfigMismatchError(
            f"Leaf {array.path!r} has shape {array.shape}, and the config says {rows} rows "
            f"({_fields((expression,), (rows,), names)}). Pass the config.json of these weights "
            f"(--config), or --like the original Hugging Face folder."
        )


def _grown(array: LazyArray, rows: int, expression: Any, names: dict[str, Any]) -> LazyArray:
    """`array` cut or zero-padded to `rows` rows (`expression` of the config), refusing a
    size far past its own: the pad is lazy, but writing it is not."""
    have = array.shape[0] if array.ndim else 0
    most = have + max(have, MAX_ADDED_ROWS)
    if rows > most:
        raise ConfigMismatchError(
            f"Leaf {array.path!r} has {have} rows, and the config pads it to {rows} "
            f"({_fields((expression,), (rows,), names)}): a padded vocabulary adds a few "
            f"rows, at most {most} here. Fix that field of config.json, or "
            f"pass the model's own (--config)."
        )
    return fit_shape(array, (rows,) + array.shape[1:])


def _fields(expressions: tuple[Any, ...], values: tuple[int, ...], names: dict[str, Any]) -> str:
    """``num_attention_heads=4 x head_dim=4``: config expressions with their values."""
    shown = []
    for expression, value in zip(expressions, values, strict=True):
        read = sorted(names_in(expression))
        if read == [str(expression)]:
            shown.append(f"{expression}={value}")
        else:
            inputs = ", ".join(f"{name}={names.get(name)!r:.40}" for name in read)
            shown.append(f"{expression} = {value}" + (f" ({inputs})" if inputs else ""))
    return " x ".join(shown)


def parse_operation(spec: Any, where: str) -> Operation:
    """An `Operation` from its recipe form: a word, or a one-key mapping of word -> options."""
    if spec == "transpose":
        return Transpose()
    if spec == "interleave_rope":
        return InterleaveRope()
    if isinstance(spec, dict) and len(spec) == 1:
        ((word, options),) = spec.items()
        if word == "split_axis" and isinstance(options, dict):
            return SplitAxis(int(options.get("axis", 0)), tuple(options["sizes"]))
        if word == "scale" and isinstance(options, dict):
            return _scale(options, where)
        if word == "add" and isinstance(options, int | float):
            return Add(float(options))
        if word == "pad_rows" and isinstance(options, dict):
            return PadRows(options["to"], options["back_to"])
        if (
            word == "permute"
            and isinstance(options, list)
            and all(type(axis) is int for axis in options)
            and sorted(options) == list(range(len(options)))
        ):
            return Permute(tuple(options))
        if word == "fit_rows" and isinstance(options, dict):
            return FitRows(options["to"], options["back_to"])
    raise RecipeFormatError(
        f"{where}: {spec!r} is not an operation. Use transpose, interleave_rope, "
        "{split_axis: {axis, sizes}}, {scale: {multiply|divide, back_multiply|back_divide}}, "
        "{add: NUMBER}, {pad_rows: {to, back_to}}, {fit_rows: {to, back_to}} or "
        "{permute: [AXES]}."
    )


def _scale(options: dict[str, Any], where: str) -> Scale:
    forward = [op for op in ("multiply", "divide") if op in options]
    backward = [op for op in ("back_multiply", "back_divide") if op in options]
    if len(forward) != 1:
        raise RecipeFormatError(f"{where}: scale needs exactly one of multiply or divide.")
    op = forward[0]
    if backward:
        back_op, back_by = backward[0].removeprefix("back_"), options[backward[0]]
    else:
        back_op, back_by = ("divide" if op == "multiply" else "multiply"), options[op]
    compute = options.get("compute", "float32")
    back_compute = options.get("back_compute", compute)
    return Scale(
        op, options[op], back_op, back_by, compute, back_compute, options.get("factor_dtype")
    )
