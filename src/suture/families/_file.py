"""Your own family: a recipe table in a YAML file of yours, in the built-in tables' format.

``suture convert SRC OUT --recipe my_family.yaml`` (``my_family.yaml:maxtext-unscanned`` for
the unscanned layout) and ``suture recipes my_family.yaml --config config.json`` take such a
file as they take a built-in name; the table format is docs/recipe-tables.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .._errors import RecipeError
from ._ops import RecipeFormatError
from ._recipe import LAYOUTS, FamilyRecipe, _parse, get_recipe, is_recipe_name

TABLE_SUFFIXES = (".yaml", ".yml")


def table_file(name: str) -> tuple[Path, bool] | None:
    """``(file, scanned)`` when `name` is a family table file (``my.yaml`` or
    ``my.yaml:maxtext-unscanned``); None when it is not one (a rule recipe, a built-in name)."""
    text = str(name)
    path, layout = text, ""
    if ":" in text and not Path(text).exists():
        path, _, layout = text.rpartition(":")
        if layout not in LAYOUTS:
            return None
    file = Path(path)
    if file.suffix.lower() not in TABLE_SUFFIXES or not file.is_file():
        return None
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None  # the rule-recipe reader reports what is wrong with it
    if not isinstance(data, dict) or not isinstance(data.get("leaves"), list):
        return None
    return file, LAYOUTS[layout or "maxtext"]


def is_family_recipe(name: Any) -> bool:
    """A built-in recipe name, or a family table file."""
    return is_recipe_name(str(name)) or table_file(str(name)) is not None


def family_recipe(name: str) -> FamilyRecipe:
    """The recipe of a built-in name (``llama3.1:maxtext``) or of a family table file."""
    found = table_file(name)
    if found is None:
        return get_recipe(name)
    file, scanned = found
    data = yaml.safe_load(file.read_text(encoding="utf-8"))
    family = (data.get("names") or [file.stem])[0]
    for needed in ("description", "follows"):
        data.setdefault(needed, f"(no {needed} in {file.name})")
    try:
        return _parse(str(family), {**data, "source_file": str(file)}, scanned)
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, RecipeError | RecipeFormatError):
            raise
        raise RecipeFormatError(
            f"{str(file)!r} is not a family table as docs/recipe-tables.md describes "
            f"({type(error).__name__}: {error})."
        ) from None
