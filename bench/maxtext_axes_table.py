"""A table's ``logical_axes`` block, written from MaxText's reports that
`bench/maxtext_sharding.py` recorded (run it first for the rows named here).

For each of the table's leaves, the axes MaxText's model gives the arrays the built-in recipe
writes for it, in the table's scanned form: a nested stack's ``local_layers`` taken out, an
unscanned layer's layer axis put back (named as a scanned row names it, else ``layers``), a
parameter MaxText gives no axes all null, one it gives only its scans' axes null but for the
layer axis. Rows disagreeing on a leaf, and arrays on either side without the other, are
printed to stderr. A tower table (``--tower``) takes MaxText's axes as they are.

Run from the repository root: `.venv/bin/python -m bench.maxtext_axes_table qwen3-vl-text
qwen3-vl qwen3-vl-dense` or `... --tower qwen3-vl`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bench import maxtext_sharding as sharding

PLACEHOLDER = "?"  # an unscanned layer's layer axis, named by a scanned row where one has it


def _row(label: str) -> tuple[Any, dict, dict]:
    """(recipe, HF config, MaxText's report on the row's first mesh) of a benchmark row."""
    import transformers

    from suture.families import get_recipe

    model, _, model_type, fields, meshes = sharding.FAMILIES[label]
    whole = {"text_config", "thinker_config"} & set(fields)
    config = transformers.AutoConfig.for_model(
        model_type, **(fields if whole else {**sharding.HF, **fields})
    ).to_dict()
    mesh = meshes if isinstance(meshes, str) else meshes[0]
    record = sharding.WORK / f"{label}.{mesh.replace(',', '.').replace('=', '')}.json"
    table = sharding.TABLES.get(label, label)
    name = sharding.WHOLE.get(label, f"{table}:{sharding.LAYOUTS.get(table, 'maxtext')}")
    return get_recipe(name), config, json.loads(record.read_text())


def _scanned_form(axes: list, rank: int, stacked: int, axis: int, remainder: bool) -> list:
    """MaxText's `axes` of an array of `rank` axes with `stacked` stacked layer axes from
    `axis` on, in the table's scanned form."""
    from suture.families._logical_axes import INNER_AXIS

    if not axes:  # no axes at all: replicated
        return [None] * (rank - (stacked == 2) + (stacked == 0))
    if len(axes) != rank:  # only its scans' names, as the leading entries of the spec
        axes = [None] * rank
        if stacked >= 1 and not remainder:
            axes[axis] = "layers"
        if stacked == 2:
            axes[axis + 1] = INNER_AXIS
    if stacked == 2:
        return axes[: axis + 1] + axes[axis + 2 :]
    if stacked == 1 and remainder:
        return axes[:axis] + ["layers"] + axes[axis + 1 :]
    if stacked == 0:
        return axes[:axis] + [PLACEHOLDER] + axes[axis:]
    return axes


def _merge(known: list | None, axes: list) -> list | None:
    """`axes` and `known` as one, a placeholder taking the other's name; None if they differ."""
    if known is None:
        return axes
    if len(known) != len(axes):
        return None
    merged = []
    for mine, theirs in zip(known, axes, strict=True):
        if mine != theirs and PLACEHOLDER not in (mine, theirs):
            return None
        merged.append(theirs if mine == PLACEHOLDER else mine)
    return merged


def text_axes(labels: list[str]) -> tuple[list[str], dict[str, list]]:
    """(the table's leaf paths, {leaf path: axes}) from the rows `labels` of one table."""
    from suture.families._layout import REMAINDER

    found: dict[str, list] = {}
    order: list[str] = []
    for label in labels:
        recipe, config, report = _row(label)
        text = recipe  # a whole recipe's own leaves are its text table's
        names = text.config_names(config)
        seen = set()
        for leaf in text._active(names):
            if leaf.group is None:
                slots = [(leaf.maxtext, 1)]
            else:
                slots = [(slot.path, len(slot.grid)) for slot in text._slots(leaf, names)]
            root = "params/" if leaf.collection is None else f"{leaf.collection}/"
            for path, stacked in slots:
                key = root + path
                if key not in report["leaves"]:
                    print(f"{label}: MaxText has no {key}", file=sys.stderr)
                    continue
                seen.add(key)
                axes = _scanned_form(
                    list(report["leaves"][key]),
                    len(report["shapes"][key]),
                    stacked if leaf.group is not None else 1,
                    leaf.layer_axis,
                    stacked == 1 and path.startswith(REMAINDER),
                )
                merged = _merge(found.get(leaf.maxtext), axes)
                if merged is None:
                    print(
                        f"{label}: {key} {axes}, elsewhere {found[leaf.maxtext]}", file=sys.stderr
                    )
                    continue
                found[leaf.maxtext] = merged
        for key in report["leaves"]:
            if key not in seen and "_encoder/" not in key:
                print(f"{label}: the recipe writes no {key}", file=sys.stderr)
    for leaf in text.leaves:
        if leaf.maxtext not in order:
            order.append(leaf.maxtext)
    return order, {
        path: [a if a != PLACEHOLDER else "layers" for a in axes] for path, axes in found.items()
    }


def tower_axes(label: str) -> tuple[list[str], dict[str, list]]:
    """(the tower table's leaf paths, {leaf path: MaxText's axes}) from row `label`."""
    recipe, config, report = _row(label)
    tower = recipe.tower_recipe
    names = tower.config_names(recipe._vision(config))
    found: dict[str, list] = {}
    for leaf in tower._active(names):
        paths = (
            [leaf.maxtext] if leaf.group is None else [s.path for s in tower._slots(leaf, names)]
        )
        for path in paths:
            key = "params/" + path
            if key not in report["leaves"]:
                print(f"{label}: MaxText has no {key}", file=sys.stderr)
                continue
            axes = list(report["leaves"][key]) or [None] * len(report["shapes"][key])
            if found.setdefault(leaf.maxtext, axes) != axes:
                print(f"{label}: {key} {axes}, elsewhere {found[leaf.maxtext]}", file=sys.stderr)
    order = list(dict.fromkeys(leaf.maxtext for leaf in tower.leaves))
    return order, found


def block(order: list[str], found: dict[str, list], note: str) -> str:
    lines = [f"logical_axes:  # MaxText 0.2.5's own{note} (bench/maxtext_sharding.py)"]
    for path in order:
        if path not in found:
            lines.append(f"  # {path}: not in these rows' models")
            continue
        axes = ", ".join("null" if axis is None else axis for axis in found[path])
        key = f'"{path}"' if "{" in path else path
        lines.append(f"  {key}: [{axes}]")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tower", metavar="ROW", help="a whole row's tower table instead")
    parser.add_argument("rows", nargs="*", help="rows of one text table")
    arguments = parser.parse_args()
    if arguments.tower:
        print(block(*tower_axes(arguments.tower), "; the tower is never scanned"))
    else:
        print(block(*text_axes(arguments.rows), ", scanned"))


if __name__ == "__main__":
    main()
