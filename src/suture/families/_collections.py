"""Leaves MaxText keeps in a variable collection of their own, beside ``params/params``.

A Flax model's variables of another kind than ``nnx.Param`` are saved under their own
collection: DeepSeek-V4's hash-routing table (``Tid2EidVar``) and router bias
(``MoEBiasVar``) sit at ``params/Tid2EidVar/decoder/...``, not ``params/params/decoder/...``.
A table leaf says so with ``collection: Tid2EidVar``; its path is written below that
collection, and on the way back the collection's leaves are read where the others are.

Example:
    >>> gathered({"params/Tid2EidVar/decoder/t": 1, "params/params/decoder/w": 2}, {"Tid2EidVar"})
    {'params/params/decoder/w': 2, 'params/params/decoder/t': 1}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._errors import ConfigMismatchError

ROOT = "params/"
PARAMS = "params/params/"


def root_of(collection: str | None) -> str:
    """Where a leaf of `collection` (None: MaxText's parameters) sits: ``params/NAME/``."""
    return PARAMS if collection is None else f"{ROOT}{collection}/"


def gathered(flat: dict[str, Any], collections: Iterable[str]) -> dict[str, Any]:
    """`flat` (a MaxText tree's paths) with the leaves of `collections` moved under
    ``params/params/``, as the table's paths name them; a path in both is an error."""
    out = {}
    moved = {}
    for path, leaf in flat.items():
        collection = next((c for c in collections if path.startswith(root_of(c))), None)
        if collection is None:
            out[path] = leaf
        else:
            target = PARAMS + path.removeprefix(root_of(collection))
            if target in moved:  # one leaf of the table in two collections
                _refuse(moved[target][0], path)
            moved[target] = (path, leaf)
    for path, (was, leaf) in moved.items():
        if path in out:
            _refuse(was, path)
        out[path] = leaf
    return out


def _refuse(one: str, other: str) -> None:
    raise ConfigMismatchError(
        f"The MaxText checkpoint has both {one!r} and {other!r}; the recipe reads that "
        f"leaf from its collection only. Remove the other one."
    )
