"""Flat tensor names (``layers.0.weight``) as tree paths (``layers/0/weight``), for the
formats that store names, not trees (safetensors, PyTorch state dicts).

Example:
    >>> named = {}
    >>> tree_path_of("layers.0.weight", ".", named, "m.safetensors"), tree_path_of("a..b", ".", named, "m")
    ('layers/0/weight', 'a..b')
    >>> tree_of_paths({"layers/0/weight": 1}, ".", "m.safetensors")
    {'layers': {'0': {'weight': 1}}}
"""

from __future__ import annotations

from typing import Any

from .._errors import CorruptCheckpointError, PathConflictError, SurgeryError
from .._paths import unflatten


def tree_path_of(name: str, separator: str, named: dict[str, str], where: Any) -> str:
    """`name` split on `separator` into a tree path that no other name of `named` (tree path
    -> name, updated) has taken; a name with an empty part stays whole."""
    keys = name.split(separator) if separator else [name]
    if any(key == "" for key in keys):
        keys = [name]  # "a..b" or ".x": keep the name whole rather than invent empty keys
    tree_path = "/".join(keys)
    if tree_path in named:
        raise PathConflictError(
            f"Tensors {named[tree_path]!r} and {name!r} of {str(where)!r} both "
            f"become the tree path {tree_path!r} with separator {separator!r}. Open it with "
            f"another separator, e.g. separator='/' to keep names whole."
        )
    named[tree_path] = name
    return tree_path


def tree_of_paths(flat: dict[str, Any], separator: str, where: Any) -> Any:
    """The nested tree of `flat` (tree path -> leaf); names that do not form one (a leaf and
    a subtree at one path, or nested too deep) are an error naming `where`."""
    try:
        return unflatten(flat)
    except SurgeryError as error:
        kind = PathConflictError if isinstance(error, PathConflictError) else CorruptCheckpointError
        raise kind(
            f"The tensor names of {str(where)!r} do not form a tree with separator {separator!r} "
            f"({error}). Open it with another separator, e.g. separator='/' to keep names whole."
        ) from error
