"""What a rule recipe's forward run read, recorded in its output, and the checks of a reverse.

`suture apply RECIPE SOURCE -o OUT` records in OUT's custom metadata (`RECORD_KEY`) the
name, shape and dtype of every leaf of SOURCE, the ``--dtype`` it added, and whether its
casts were checked (``--strict-casts``). ``suture apply RECIPE OUT --reverse`` then needs no
``--like``, and a ``--like`` that is not SOURCE (another model, another size, the same
model in another dtype) is refused instead of giving a different tree. Any like, recorded
or not, must also give OUT when the recipe runs forward on it.

The record comes from a file, so it is checked, not trusted: a malformed one is a
`CorruptCheckpointError` naming the key.

Example:
    >>> import numpy as np
    >>> metadata = forward_metadata({"w": np.ones((2, 3), np.float32)})
    >>> recorded = read_record({"custom_metadata": metadata}["custom_metadata"], "out")
    >>> recorded.leaves
    {'w': ((2, 3), 'float32')}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import CorruptCheckpointError, SurgeryError, TreeMismatchError, check_shape
from .._format import first_and_more
from .._paths import flatten, unflatten
from .rule_set import Rule, apply_rules

RECORD_KEY = "suture.recipe_input"
MAX_RECORD_BYTES = 1 << 20  # about 15,000 leaves; a larger tree is not recorded

Signature = tuple[tuple[int, ...] | None, str]  # (shape, dtype), or (None, type) off arrays


@dataclass(frozen=True)
class Recorded:
    """A forward run's input, as its output records it."""

    leaves: dict[str, Signature]
    dtype: str | None = None  # the --dtype the forward run cast floating leaves to
    strict_casts: bool = False  # its lossy casts were checked value by value

    def tree(self) -> Any:
        """The recorded input as a tree of read-free arrays (zero strides: no memory)."""
        return unflatten(
            {
                path: _stand_in(shape, dtype) if shape is not None else None
                for path, (shape, dtype) in self.leaves.items()
            }
        )


def _stand_in(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(
        np.zeros((), to_dtype(dtype)), shape=shape, strides=(0,) * len(shape)
    )


def signature(tree: Any) -> dict[str, Signature]:
    """``{path: (shape, dtype name)}`` of a tree's leaves; reads nothing."""
    found: dict[str, Signature] = {}
    for path, leaf in flatten(getattr(tree, "tree", tree)).items():
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            found[path] = (tuple(int(n) for n in leaf.shape), to_dtype(leaf.dtype).name)
        else:
            found[path] = (None, type(leaf).__name__)
    return found


def forward_metadata(
    source: Any, dtype: str | None = None, strict_casts: bool = False
) -> dict[str, str] | None:
    """The custom metadata that records `source` (a tree or checkpoint) in a forward output.

    None when the record would be over `MAX_RECORD_BYTES`.
    """
    leaves = {
        path: [None if shape is None else list(shape), kind]
        for path, (shape, kind) in signature(source).items()
    }
    record = {"version": 1, "leaves": leaves, "dtype": dtype, "strict_casts": strict_casts}
    text = json.dumps(record, separators=(",", ":"))
    return {RECORD_KEY: text} if len(text) <= MAX_RECORD_BYTES else None


def read_record(custom_metadata: dict[str, Any], where: str) -> Recorded | None:
    """The record in a checkpoint's custom metadata, checked; None when it has none."""
    text = custom_metadata.get(RECORD_KEY)
    if text is None:
        return None

    def corrupt(what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"The {RECORD_KEY!r} custom metadata of {where!r} is not what suture records "
            f"({what}). Pass --like with the recipe's input (like=), or remove the key."
        )

    try:
        record = (
            json.loads(text) if isinstance(text, str) and len(text) <= MAX_RECORD_BYTES else None
        )
    except (ValueError, RecursionError):
        raise corrupt("not JSON") from None
    if not isinstance(record, dict) or record.get("version") != 1:
        raise corrupt("not a version 1 record")
    raw, dtype, strict = record.get("leaves"), record.get("dtype"), record.get("strict_casts")
    if not isinstance(raw, dict) or not isinstance(strict, bool):
        raise corrupt("no leaves, or strict_casts not true or false")
    if dtype is not None and not isinstance(dtype, str):
        raise corrupt(f"dtype {dtype!r:.40}")
    leaves: dict[str, Signature] = {}
    for path, entry in raw.items():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str)):
            raise corrupt(f"leaf {path!r:.80} is {entry!r:.80}")
        shape, kind = entry
        if shape is None:
            leaves[path] = (None, kind)
            continue
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**62 for n in shape
        ):
            raise corrupt(f"leaf {path!r:.80} has shape {shape!r:.80}")
        try:
            dtype_of_leaf = to_dtype(kind)
        except SurgeryError:
            dtype_of_leaf = None
        if dtype_of_leaf is None or dtype_of_leaf.kind not in "biufcV":
            raise corrupt(f"leaf {path!r:.80} has dtype {kind!r:.40}")
        check_shape(tuple(shape), dtype_of_leaf, f"{where}: {RECORD_KEY} leaf {path!r:.80}")
        leaves[path] = (tuple(shape), dtype_of_leaf.name)
    return Recorded(leaves, dtype, strict)


def check_like(like: Any, recorded: Recorded, like_name: str, output_name: str) -> None:
    """Refuses a like= (``--like``) that is not the input `output_name` records."""
    difference = _difference(signature(like), recorded.leaves, "--like", "the record")
    if difference:
        raise TreeMismatchError(
            f"--like {like_name!r} is not the input that the forward run read: {difference}. "
            f"{output_name!r} records what the recipe read ({len(recorded.leaves)} leaves): "
            f"pass that checkpoint as --like, or leave --like out to use the record."
        )


def check_gives(
    forward: list[Rule], like: Any, output: Any, like_name: str, output_name: str
) -> None:
    """Refuses a like whose forward run would not give `output` (names, shapes, dtypes).

    `like_name` says what the like is (``"--like 'ckpt'"``, ``"the recorded input"``).
    """
    try:
        ran = apply_rules(forward, getattr(like, "tree", like))
    except SurgeryError as error:
        raise TreeMismatchError(
            f"{like_name} is not the recipe's input: the recipe does not apply to it "
            f"({error}). Reverse with the checkpoint the recipe was applied to."
        ) from None
    difference = _difference(signature(ran), signature(output), "the forward result", "the source")
    if difference:
        raise TreeMismatchError(
            f"{like_name} is not the input of {output_name!r}: run forward on it, the recipe "
            f"gives another tree ({difference}). Reverse with the checkpoint the recipe was "
            f"applied to, and that run's output as the source."
        )


def _difference(
    found: dict[str, Signature], wanted: dict[str, Signature], found_name: str, wanted_name: str
) -> str | None:
    """The first difference between two signatures, in words; None when they are equal."""
    missing = [path for path in wanted if path not in found]
    if missing:
        leaves = first_and_more(missing, 1, repr)
        return f"{wanted_name} has leaf {leaves}, which {found_name} lacks"
    extra = [path for path in found if path not in wanted]
    if extra:
        return f"{found_name} has leaf {first_and_more(extra, 1, repr)}, which {wanted_name} lacks"
    for path, (shape, kind) in found.items():
        if (shape, kind) != wanted[path]:
            return (
                f"leaf {path!r} is {_shown(shape, kind)} in {found_name} but "
                f"{_shown(*wanted[path])} in {wanted_name}"
            )
    return None


def _shown(shape: tuple[int, ...] | None, kind: str) -> str:
    return kind if shape is None else f"{kind}{list(shape)}"
