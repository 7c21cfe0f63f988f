"""A multimodal model whole: a family's language model and its vision tower, both directions.

A ``FAMILY:maxtext-multimodal`` recipe joins two tables: the family's text table (``text:``,
converted as ``FAMILY:maxtext`` converts it) and the tower table (``target:
maxtext-multimodal``), whose leaves sit beside the decoder in MaxText's multimodal tree
(``vision_encoder/...``, never scanned) and read the tower's sub-config (``vision_config``).
The tower's tensors are read under any of the names folders give them (`_tower.Tower`), and
written back in the form of the ``like`` folder, else the form that goes with the language
model's prefix.

Example:
    >>> recipe = get_recipe("gemma3:maxtext-multimodal")
    >>> recipe.name, recipe.scanned
    ('gemma3:maxtext-multimodal', True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from .._errors import ConfigMismatchError
from .._paths import flatten, unflatten
from ._expr import evaluate, names_in
from ._multimodal import warn_left_out
from ._recipe import MAXTEXT_ROOT, FamilyRecipe, _hf_leaves
from ._tables import get_recipe
from ._tower import Tower, parse_tower

MULTIMODAL = "maxtext-multimodal"


@dataclass(frozen=True)
class WholeRecipe(FamilyRecipe):
    """The text recipe's fields (it converts the language model), plus the tower's recipe."""

    tower: Tower | None = None
    tower_recipe: FamilyRecipe | None = None
    by_layout: bool = False  # named FAMILY:maxtext(-unscanned), as the text's layout
    text_family: str = ""  # the text table's family, which converts the language model alone

    @property
    def name(self) -> str:
        return super().name if self.by_layout else f"{self.family}:{MULTIMODAL}"

    def _parts(self) -> tuple[Tower, FamilyRecipe]:
        assert self.tower is not None and self.tower_recipe is not None
        return self.tower, self.tower_recipe

    def _vision(self, config: dict[str, Any]) -> dict[str, Any]:
        tower, tower_recipe = self._parts()
        vision = tower.fields(config)
        if vision is None:
            alone = f", or convert the language model alone with {self.text_family}:maxtext"
            raise ConfigMismatchError(
                f"Recipe {self.name!r} converts a whole multimodal model and reads the tower's "
                f"fields from config.json's {tower.config_label!r}, which it lacks. Pass the "
                f"multimodal folder's config.json{alone}."
            )
        if self.scanned and tower.unscanned_only is not None:
            when, why = tower.unscanned_only
            names = tower_recipe.config_names(vision)
            if evaluate(when, names):
                shown = ", ".join(f"{n}={names.get(n)!r:.40}" for n in sorted(names_in(when)))
                raise ConfigMismatchError(
                    f"Recipe {self.name!r} scans the language model's layers, and this model's "
                    f"{tower.config_label} has {when} ({shown}): {why}. Convert it with "
                    f"{self.family}:maxtext-unscanned."
                )
        return vision

    def _roots(self) -> set[str]:
        """The first keys of the tower's leaves in the target tree (``vision_encoder``)."""
        _, tower_recipe = self._parts()
        return {leaf.maxtext.split("/", 1)[0] for leaf in tower_recipe.leaves}

    # Hugging Face -> MaxText -----------------------------------------------------------------

    def to_maxtext(self, tree: Any, config: dict[str, Any]) -> dict[str, Any]:
        tower, tower_recipe = self._parts()
        vision = self._vision(config)
        towers, rest, _ = tower.split(_hf_leaves(tree))
        left = sorted(name for name in towers if tower.left_out(name))
        if left:
            warn_left_out(f"Recipe {self.name!r}", left, "MaxText's multimodal tree")
        towers = {name: value for name, value in towers.items() if not tower.left_out(name)}
        if not towers:
            raise ConfigMismatchError(
                f"Recipe {self.name!r} converts a whole multimodal model, and the checkpoint "
                f"holds no vision tower (no tensor under "
                f"{', '.join(p for table, aliases in tower.prefixes for p in (table, *aliases))}"
                f"). Convert a text-only model with {self.text_family}:maxtext."
            )
        flat = flatten(super().to_maxtext(rest, config))
        for path, value in flatten(tower_recipe.to_maxtext(towers, vision)).items():
            flat[f"{MAXTEXT_ROOT}/{path}"] = value
        return unflatten(flat)

    # MaxText -> Hugging Face -----------------------------------------------------------------

    def to_hf(
        self,
        tree: Any,
        config: dict[str, Any],
        layout: str | None = None,
        prefix: str | None = None,
        like: Any = None,
    ) -> dict[str, Any]:
        tower, tower_recipe = self._parts()
        vision = self._vision(config)
        roots, text, towers = self._roots(), {}, {}
        for path, value in flatten(tree).items():
            inner = path.removeprefix(f"{MAXTEXT_ROOT}/")
            if inner.split("/", 1)[0] in roots:
                towers[inner] = value
            else:
                text[path] = value
        if not towers:
            raise ConfigMismatchError(
                f"Recipe {self.name!r}: the MaxText checkpoint has no "
                f"{' or '.join(sorted(roots))} (the vision tower). Was it converted with "
                f"{self.text_family}:maxtext? Reverse it with that recipe."
            )
        out = super().to_hf(unflatten(text), config, layout, prefix, like)
        forms = self._forms(like, prefix or self.hf_prefix(like) if like is not None else prefix)
        for name in list(out):  # the tower as `like` holds it: its converted form replaces it
            found = tower.read(name)
            if found is not None and not tower.left_out(found[0]):
                del out[name]
        for name, value in tower_recipe.to_hf(unflatten(towers), vision).items():
            out[tower.styled(name, forms.get(_table_prefix(tower, name), 0))] = value
        return out

    def _forms(self, like: Any, prefix: str | None) -> dict[str, int]:
        """The form of each tower prefix to write: the `like` folder's, else the published
        form (1) with the published language-model prefix, else the table's (0)."""
        tower, _ = self._parts()
        forms: dict[str, int] = {}
        if like is not None:
            for name in _hf_leaves(like):
                found = tower.read(name)
                if found is not None:
                    forms.setdefault(_table_prefix(tower, found[0]), found[1])
        published = self.language_model is not None and prefix not in (
            None,
            self.language_model.prefixes[0],
        )
        for table, _ in tower.prefixes:
            forms.setdefault(table, 1 if published else 0)
        return forms

    def operations_table(self, config: dict[str, Any]) -> list[tuple[str, str, str]]:
        _, tower_recipe = self._parts()
        return super().operations_table(config) + [
            (path, hf, f"unscanned, {ops}" if ops != "-" else "unscanned")
            for path, hf, ops in tower_recipe.operations_table(self._vision(config))
        ]


def _table_prefix(tower: Tower, name: str) -> str:
    return next((table for table, _ in tower.prefixes if name.startswith(table)), "")


def whole_recipe(
    family: str,
    data: dict[str, Any],
    parse: Callable[[str, dict[str, Any], bool], FamilyRecipe],
    layout: str = MULTIMODAL,
) -> WholeRecipe:
    """The ``FAMILY:maxtext-multimodal`` recipe of a tower table `data` (already loaded), or
    its ``FAMILY:LAYOUT`` recipe when the table is named by MaxText's layouts."""
    by_layout = layout != MULTIMODAL
    text = get_recipe(f"{data['text']}:{layout if by_layout else 'maxtext'}")
    tower_recipe = parse(family, data, False)
    tower = parse_tower(data["tower"], data["source_file"])
    values = {field.name: getattr(text, field.name) for field in fields(FamilyRecipe)}
    values["family"] = family  # the tower table's (qwen3-vl), whose text table may be another's
    values["description"] = data["description"]
    values["follows"] = f"{text.follows}; {data['follows']}"
    return WholeRecipe(
        **values,
        tower=tower,
        tower_recipe=tower_recipe,
        by_layout=by_layout,
        text_family=text.family,
    )
