"""Your own family: a recipe table in a YAML file of yours, in the built-in tables' format.

``suture convert SRC OUT --recipe my_family.yaml`` (``my_family.yaml:maxtext-unscanned`` for
the unscanned layout) and ``suture recipes my_family.yaml --config config.json`` take such a
file as they take a built-in name; the table format is docs/recipe-tables.md.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from .._errors import RecipeError, SurgeryError
from .._surgery.recipes import read_limited
from .._yaml import MAX_YAML_BYTES
from .._yaml import parse as parse_yaml
from ._recipe import FamilyRecipe
from ._tables import LAYOUTS, _parse, get_recipe, is_recipe_name

TABLE_SUFFIXES = (".yaml", ".yml")


def table_file(name: str) -> tuple[Path, bool] | None:
    """``(file, scanned)`` when `name` is a family table file (``my.yaml`` or
    ``my.yaml:maxtext-unscanned``); None when it is not one (a rule recipe, a built-in name).

    The file is read with the same bounds as every YAML file (`suture._yaml`), so a hostile
    one cannot hang the look; one that breaks them is left to the rule-recipe reader, which
    says what is wrong with it.
    """
    found = _yaml_file(name)
    if found is None:
        return None
    try:
        data = _load(found[0])
    except (OSError, SurgeryError):
        return None
    return found if _is_table(data) else None


def _yaml_file(name: str) -> tuple[Path, bool] | None:
    """``(file, scanned)`` when `name` names a YAML file (with a layout, perhaps)."""
    text = str(name)
    path, layout = text, ""
    if ":" in text and not Path(text).exists():
        path, _, layout = text.rpartition(":")
        if layout not in LAYOUTS:
            return None
    file = Path(path)
    if file.suffix.lower() not in TABLE_SUFFIXES or not file.is_file():
        return None
    return file, LAYOUTS[layout or "maxtext"]


def _is_table(data: Any) -> bool:
    return isinstance(data, dict) and "leaves" in data


def is_family_recipe(name: Any) -> bool:
    """A built-in recipe name, or a family table file."""
    return is_recipe_name(str(name)) or table_file(str(name)) is not None


def family_recipe(name: str) -> FamilyRecipe:
    """The recipe of a built-in name (``llama3.1:maxtext``) or of a family table file.

    Raises:
        RecipeError: naming the file, the entry and the rule it breaks (`_schema`).
    """
    found = _yaml_file(name)
    if found is None:
        return get_recipe(name)
    file, scanned = found
    data = _load(file)  # a file that breaks the YAML bounds is an error naming it
    if not _is_table(data):
        raise RecipeError(
            f"Family table {str(file)!r} has no 'leaves:' list, so it is no family table "
            f"(docs/recipe-tables.md); a rule recipe runs with `suture apply`."
        )
    data = dict(data)
    names = data.get("names")
    family = (
        names[0] if isinstance(names, list) and names and isinstance(names[0], str) else file.stem
    )
    for needed in ("description", "follows"):
        data.setdefault(needed, f"(no {needed} in {file.name})")
    if data.get("target") == "maxtext-multimodal":  # a tower table: the whole model (`_whole`)
        from ._whole import whole_recipe

        if not scanned:
            raise RecipeError(
                f"Family table {str(file)!r} is a tower table: its language model converts as "
                f"its text table's FAMILY:maxtext (scanned). Pass {str(file)!r} without a layout."
            )
        return whole_recipe(str(family), {**data, "source_file": str(file)}, _parse)
    layout = "maxtext" if scanned else "maxtext-unscanned"
    offered = data.get("layouts")
    maxtext = data.get("target", "maxtext") == "maxtext"
    if maxtext and isinstance(offered, list) and layout not in offered:
        raise RecipeError(
            f"Family table {str(file)!r} offers the layout(s) {', '.join(map(str, offered))} "
            f"only (its 'layouts'); name one: '{file}:{offered[0]}'."
        )
    recipe = _parse(str(family), {**data, "source_file": str(file)}, scanned)
    return dataclasses.replace(recipe, table_file=str(file))


def _load(file: Path) -> Any:
    """The table in `file`; the same text is parsed once (looking at a file, then converting
    with it, parses it once)."""
    label = f"Family table {str(file)!r}"
    raw = read_limited(file, label, "a family table", MAX_YAML_BYTES, RecipeError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecipeError(f"{label} is not UTF-8 text (byte {error.start}).") from None
    return _parsed(text, label)


@functools.lru_cache(maxsize=8)
def _parsed(text: str, label: str) -> Any:
    return parse_yaml(text, label, "a family table", RecipeError)[0]
