"""Built-in recipe names as people type them: any case, and a family alone.

``Llama3.1:MaxText`` is ``llama3.1:maxtext``; ``llama3.1`` alone is its only target's recipe
(``llama3.1:maxtext``, scanned, as a table file's default), while ``llama3``, which MaxText
and Tunix both take, is an error listing that family's recipes. A name that is none of them
gets the closest names, a few, one per line, not every built-in name.

Example:
    >>> resolve_name("Llama3.1:MaxText"), resolve_name("llama3.1")
    ('llama3.1:maxtext', 'llama3.1:maxtext')
"""

from __future__ import annotations

import difflib

from .._errors import RecipeError


def _by_family() -> dict[str, list[str]]:
    """``{family: its recipe names}``, in `recipe_names` order."""
    from ._tables import recipe_names  # the tables: _tables imports this module

    found: dict[str, list[str]] = {}
    for name in recipe_names():
        found.setdefault(name.split(":", 1)[0], []).append(name)
    return found


def resolve_name(name: str) -> str:
    """The built-in recipe that `name` means, or `name` as it is when it means none.

    Raises:
        RecipeError: `name` is a family alone that more than one target takes.
    """
    if not isinstance(name, str):
        return name
    families = _by_family()
    lowered = name.strip().lower()
    family, colon, _ = lowered.partition(":")
    if colon:
        return lowered if lowered in families.get(family, ()) else name
    recipes = families.get(family)
    if not recipes:
        return name
    targets = {recipe.split(":", 1)[1].split("-", 1)[0] for recipe in recipes}
    if len(targets) == 1:
        return recipes[0]
    raise RecipeError(
        f"{name!r} names the family {family!r}, which several targets take; name one:\n"
        + "".join(f"  --recipe {recipe}\n" for recipe in recipes)
        + "(`suture recipes` says what each target is.)"
    )


def is_family_name(name: str) -> bool:
    """Whether `name`, in any case, is a built-in family alone (``llama3.1``)."""
    return isinstance(name, str) and ":" not in name and name.strip().lower() in _by_family()


def unknown_name(name: str, suffixes: tuple[str, ...] = ()) -> RecipeError:
    """The error for `name`, which is no built-in recipe: the closest names, a few."""
    from ._tables import recipe_names

    names = recipe_names()
    wanted = name.lower() if ":" in name else f"{name.lower()}:maxtext"
    near = difflib.get_close_matches(wanted, names, n=4, cutoff=0.6)
    families = sorted(_by_family())
    files = f"; a recipe file ends in {', '.join(suffixes)}" if suffixes else ""
    listed = "".join(f"  {recipe}\n" for recipe in near)
    return RecipeError(
        f"No built-in recipe {name!r}"
        + (", and no recipe file of that name" if suffixes else "")
        + (f". Did you mean:\n{listed}" if near else ".\n")
        + f"Built-in recipes are FAMILY:maxtext, FAMILY:maxtext-unscanned or FAMILY:tunix for "
        f"{len(families)} families; `suture recipes` lists all {len(names)}{files}."
    )
