"""The errors suture raises on bad input.

Every error caused by what a user passed in (a path, a file, a rule, a shape) is a
`SurgeryError`, so that one ``except suture.SurgeryError`` catches them all and the CLI can
print them without a traceback. A `SurgeryError` is a ``ValueError`` (a value the user gave
is wrong); the kinds where Python has a closer word are also that: a missing checkpoint is a
``FileNotFoundError``, a missing leaf a ``KeyError``, a bad index an ``IndexError``, a
destination that cannot be written an ``OSError`` (one that already exists a
``FileExistsError``), a failed collective an ``OSError``. Each kind of mistake has one class, all of them here and
exported by `suture`. Messages name the leaf or path, what was expected, what was found,
and the fix.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from ._redact import redact_text


class SurgeryError(ValueError):
    """Base class of every error suture raises on bad input; a ``ValueError``.

    Example:
        >>> import suture
        >>> try:
        ...     suture.open("/no/such/checkpoint")
        ... except suture.SurgeryError as error:
        ...     print(type(error).__name__)
        CheckpointNotFoundError

    A URL in the message loses its user info and query values (``http://***@host/x``):
    messages reach terminals and CI logs.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact_text(arg) if isinstance(arg, str) else arg for arg in args))


class CheckpointNotFoundError(SurgeryError, FileNotFoundError):
    """The path given as a checkpoint does not exist."""


class NotACheckpointError(SurgeryError):
    """The path exists but holds no checkpoint suture can read."""


class UnfinishedCheckpointError(SurgeryError):
    """The checkpoint's save never completed (a temporary Orbax folder)."""


class CorruptCheckpointError(SurgeryError):
    """A checkpoint's metadata or data could not be parsed, or declares what no checkpoint
    can (a negative size, a tree nested hundreds of levels deep); also a written result that
    ``verify=True`` read back differently from what was written."""


class MissingLeafError(SurgeryError, KeyError):
    """A leaf path that the tree does not hold."""

    def __str__(self) -> str:  # KeyError would quote the whole message.
        return str(self.args[0]) if self.args else ""


class InvalidIndexError(SurgeryError, IndexError):
    """An index, axis or operation that does not fit a LazyArray's shape.

    Both an IndexError and a ValueError, like numpy's ``AxisError``: numpy raises either
    for the mistakes it covers.
    """


class ShapeMismatchError(SurgeryError):
    """Arrays whose shapes or dtypes cannot be combined as asked."""


class TreeMismatchError(SurgeryError):
    """A target, model or template whose tree does not fit the checkpoint's: leaf paths it
    has no place for (without ``partial=True``), no leaf path in common, or a placeholder
    on what the checkpoint holds as a subtree. Leaf paths the checkpoint lacks are a
    `MissingLeafError`."""


class PathConflictError(SurgeryError):
    """Two leaves that would get the same path or stored name (a key that holds the
    separator, names that differ only where a format joins keys), or a path that is both a
    leaf and a subtree. Rename one, or use another separator."""


class ArgumentError(SurgeryError):
    """An argument value, or a combination of arguments, that suture does not accept: an
    unknown format or dtype name, a size string such as ``max_memory="lots"``, ``step=`` on
    a source that has no steps, options that contradict each other, arguments in the wrong
    order, a ``max_memory`` too small for a leaf's smallest block, a bad setting in the
    environment."""


class UnsupportedError(SurgeryError):
    """Something a format, a storage scheme or this setup cannot do: a leaf type or dtype a
    format cannot hold, a leaf name it cannot store, a collective save to a remote path, a
    recorded sharding this process cannot rebuild, a URL scheme suture does not speak, a
    PyTorch file that is not local."""


class DestinationError(SurgeryError, OSError):
    """An output path that cannot be written: its folder does not exist, its scheme is
    read-only (``http://``), it holds a source the save reads, another writer holds its
    lock, ``overwrite=True`` would replace something that is not a checkpoint, or the write
    itself failed (a full disk). Also an ``OSError``, like the file-system error it is."""


class DestinationExistsError(DestinationError, FileExistsError):
    """The output path already exists and ``overwrite=True`` was not passed (or it appeared
    while writing). Also a ``FileExistsError``."""


class SutureWarning(UserWarning):
    """Something suture did on the user's behalf that they should know of; the command line
    prints it as one ``Warning: ...`` line."""


class StaleLockWarning(SutureWarning):
    """A lock left by a writer that is gone (killed, its pid perhaps reused) was taken over."""


class PatternError(SurgeryError):
    """A pattern that is not a valid regular expression, or that takes too long to match."""


class RuleError(SurgeryError):
    """A rule (`suture.rules`) or an Orbax-style transformation that does not fit the tree.

    ``suture.TransformError`` is this class under the name Orbax users know.
    """


TransformError = RuleError  # the name of `suture.apply_transformations`' errors


class RecipeError(SurgeryError):
    """A recipe file that cannot be read, or whose rules or fields are invalid; a built-in
    recipe name that does not exist."""


SchemaError = RecipeError  # the former name of a recipe rule's field errors


class ConfigMismatchError(SurgeryError):
    """A model whose config.json does not fit the model-family recipe asked for (or whose
    weights do not fit its config.json), or a config.json that is missing or unreadable."""


class ExpressionError(RecipeError):
    """A recipe expression (``"1/sqrt(head_dim)"``) that cannot be evaluated against the
    model's config."""


RecipeFormatError = RecipeError  # a family recipe file that does not follow the schema


class MergeError(SurgeryError):
    """A merge that cannot be done as asked (method, parameters, models or config)."""


class LossyCastError(SurgeryError):
    """A cast that destroyed a value (300.0 to int8 wraps to 44) while strict casts were asked
    for (``strict_casts=True``, ``--strict-casts``)."""


class CollectiveError(SurgeryError, OSError):
    """Another process of a collective save failed or did not arrive; this one stopped too.

    Not a mistake in this process's input but a failure of the job around it, so also an
    OSError (like a timeout or a lost connection). `missing_process` is True when some
    process never arrived (it did not call the save, is stuck, or died).
    """

    missing_process = False


MAX_ARRAY_BYTES = 1 << 62  # TensorStore's index limit; numpy's is 2**63


def check_shape(shape: tuple[int, ...], dtype: Any, where: str) -> None:
    """Refuses a declared shape no array can have: negative sizes, or over 2**62 bytes.

    Example:
        >>> check_shape((2, 3), "float32", "x")
    """

    # the sizes other than 0 too: numpy and safetensors refuse their product's overflow even
    # where a 0 makes the array empty, so such a shape fails every reshape and read
    nonzero = math.prod(n for n in shape if n > 0)
    nbytes = nonzero * np.dtype(dtype).itemsize
    if any(n < 0 for n in shape) or nbytes >= MAX_ARRAY_BYTES:
        problem = (
            "a negative size"
            if any(n < 0 for n in shape)
            else "sizes multiplying to more than 2**62 bytes"
        )
        raise CorruptCheckpointError(
            f"{where}: declares shape {shape} of {np.dtype(dtype).name}, which has {problem}; no "
            f"array can. The checkpoint is damaged or hostile; restore it from a copy."
        )


def did_you_mean(wanted: str, candidates: Iterable[str], limit: int = 3) -> str:
    """Returns " Did you mean 'x'?" for the closest candidates, or "" when none is close.

    Example:
        >>> did_you_mean("params/layer_0", ["params/layer0", "opt_state"])
        " Did you mean 'params/layer0'?"
    """
    matches = difflib.get_close_matches(wanted, list(candidates), n=limit, cutoff=0.6)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(match) for match in matches) + "?"


def raise_problems(problems: list[str] | list[SurgeryError], subject: str = "The surgery") -> None:
    """Raises one `SurgeryError` listing every problem (nothing when there are none).

    A single problem given as an error is raised as it is, keeping its class.

    Example:
        >>> raise_problems([])
    """
    if len(problems) == 1:
        only = problems[0]
        raise only if isinstance(only, SurgeryError) else SurgeryError(only)
    if problems:
        listed = "\n".join(f"  {i}. {problem}" for i, problem in enumerate(problems, 1))
        raise SurgeryError(f"{subject} has {len(problems)} problems:\n{listed}")
