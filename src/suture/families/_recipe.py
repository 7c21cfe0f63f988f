"""A model-family recipe: a table of MaxText leaves, each with its Hugging Face source and
the invertible operations between them, read from a YAML file of this package.

The same table runs both ways. To MaxText, every HF tensor of a per-layer leaf goes through
the operations and the layers are stacked on MaxText's scan axis (1), or kept as
``layers_{i}`` subtrees when unscanned. Back to HF, the stack is unstacked and the inverse
operations run in reverse order. Everything stays lazy, so a conversion streams.

Example:
    >>> recipe = get_recipe("llama3.1:maxtext")
    >>> recipe.family, recipe.scanned
    ('llama3.1', True)
"""

from __future__ import annotations

import functools
import importlib.resources
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from .._errors import ConfigMismatchError, RecipeError, did_you_mean
from .._lazy.array import LazyArray, as_lazy
from .._lazy.combine import stack as stack_arrays
from .._paths import flatten, unflatten
from ._expr import evaluate, names_in
from ._ops import Operation, RecipeFormatError, parse_operation

MAXTEXT_ROOT = "params/params"
# The config.json fields recipes read, by kind: Hugging Face's names, the same in every family.
# Any other field a recipe's expressions read must be a finite number.
COUNT_FIELDS = frozenset(
    {
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_size",
        "vocab_size",
        "padded_vocab_size",
    }
)
FLAG_FIELDS = frozenset({"tie_word_embeddings", "attention_bias", "mlp_bias"})
MAX_COUNT = 1 << 62  # past any tensor's length (TensorStore's index limit)
SCAN_AXIS = 1  # MaxText's param_scan_axis: the layer axis of every scanned tensor
LAYOUTS = {"maxtext": True, "maxtext-unscanned": False}
# The model code a table targets (its YAML's `target:`), and that target's layouts. A Tunix
# table writes its per-layer paths with the layer in them (``layers/{layer}/attn/q_proj/w``),
# as ``nnx.state`` of Tunix's models has them; its tree has no root and no step.
TARGETS = {"maxtext": LAYOUTS, "tunix": {"tunix": False}}


@dataclass(frozen=True)
class Leaf:
    maxtext: str  # path below params/params, e.g. "decoder/layers/mlp/wo/kernel"
    hf: str  # tensor name, with {group} where the layer index goes
    group: str | None
    operations: tuple[Operation, ...]
    when: str | None
    # hf: [a, b] in the table: each goes through the operations, then they are stacked on a
    # new first axis (Tunix's Gemma kv_einsum holds k and v); () for one tensor, `hf`
    stacked: tuple[str, ...] = ()

    def sources(self, index: int | None = None) -> tuple[str, ...]:
        """The HF tensor name(s) of this leaf, for layer `index` of its group."""
        names = self.stacked or (self.hf,)
        if index is None or self.group is None:
            return names
        return tuple(name.replace(f"{{{self.group}}}", str(index)) for name in names)


@dataclass(frozen=True)
class LayerGroup:
    count: str  # expression: how many MaxText layers
    hf_index: str  # expression of i: the HF layer of MaxText layer i


@dataclass(frozen=True)
class FamilyRecipe:
    """One family (``llama3.1``) in one layout (scanned or not): both directions."""

    family: str
    scanned: bool
    follows: str
    description: str
    require: dict[str, list[Any]]
    defaults: dict[str, Any]
    checks: tuple[dict[str, str], ...]
    groups: dict[str, LayerGroup]
    leaves: tuple[Leaf, ...]
    ignore: tuple[str, ...]
    fields: frozenset[str]  # the config fields its expressions read
    target: str = "maxtext"  # whose layout: "maxtext" or "tunix"

    @property
    def name(self) -> str:
        if self.target != "maxtext":
            return f"{self.family}:{self.target}"
        return f"{self.family}:{'maxtext' if self.scanned else 'maxtext-unscanned'}"

    @property
    def _root(self) -> str:
        return f"{MAXTEXT_ROOT}/" if self.target == "maxtext" else ""

    @property
    def _label(self) -> str:
        return "MaxText" if self.target == "maxtext" else "Tunix"

    def config_names(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config's fields with the recipe's defaults filled in, checked against it.

        Every field the recipe reads is checked for its kind first (a count is a whole
        number of at least 1, a flag true or false, anything else a finite number), so a
        wrong value is an error naming the field, not a failure deep in the arithmetic.
        """
        if not isinstance(config, dict):
            raise ConfigMismatchError(
                f"Recipe {self.name!r} needs the model's config.json, a JSON object; got "
                f"{type(config).__name__}."
            )
        names = dict(config)
        for field in sorted(self.fields):
            if names.get(field) is None and field not in self.defaults:
                if field in self.require:
                    continue  # said below, with the values the recipe fits
                raise ConfigMismatchError(
                    f"config.json has no {field!r}{' (it is null)' if field in names else ''}; "
                    f"recipe {self.name!r} needs it. Pass the model's own config.json "
                    f"(--config)."
                )
            if names.get(field) is not None and field not in self.require:
                self._check_kind(field, names[field], "")
        for field, default in self.defaults.items():
            if names.get(field) is None:
                names[field] = evaluate(default, names)
                self._check_kind(field, names[field], f" (its default, {default})")
        for field, allowed in self.require.items():
            if names.get(field) not in allowed:
                raise ConfigMismatchError(
                    f"config.json field {field!r} is {names.get(field)!r:.80}; recipe "
                    f"{self.name!r} fits {', '.join(map(repr, allowed))}. Pick the recipe of this "
                    f"model's family (`suture recipes` lists them)."
                )
        for check in self.checks:
            if not evaluate(check["test"], names):
                field = check["field"]
                raise ConfigMismatchError(
                    f"config.json field {field!r} is {names.get(field)!r}: {check['message']} "
                    f"(recipe {self.name!r}, which follows {self.follows})."
                )
        return names

    def _check_kind(self, field: str, value: Any, how: str) -> None:
        if field in FLAG_FIELDS:
            wanted = "true or false"
            fits = isinstance(value, bool)
        elif field in COUNT_FIELDS:
            wanted = "a whole number of at least 1"
            fits = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            if fits and value > MAX_COUNT:
                wanted, fits = f"a whole number up to 2**{MAX_COUNT.bit_length() - 1}", False
        else:
            wanted = "a finite number"
            number = isinstance(value, int | float) and not isinstance(value, bool)
            # abs() first: math.isfinite() of a 400-digit int raises OverflowError
            fits = number and abs(value) <= MAX_COUNT and math.isfinite(value)
        if not fits:
            raise ConfigMismatchError(
                f"config.json field {field!r} is {_shown(value)}{how}; recipe {self.name!r} "
                f"needs {wanted}. Fix the config.json (or pass the model's own with --config)."
            )

    def layer_counts(self, names: dict[str, Any]) -> dict[str, int]:
        """How many MaxText layers each layer group has, from the checked config."""
        counts = {}
        for group, spec in self.groups.items():
            count = evaluate(spec.count, names)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ConfigMismatchError(
                    f"Recipe {self.name!r}: the layer count {spec.count} is {count!r} with this "
                    f"config ({_fields_shown(spec.count, names)}); it must be a whole number."
                )
            counts[group] = count
        return counts

    # Hugging Face -> MaxText ---------------------------------------------------------------

    def to_maxtext(self, tree: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The MaxText tree ``{"params": {"params": ...}, "step": 0}`` of an HF tree, lazily.

        MaxText's converter also saves an empty ``opt_state``; suture's Orbax writer does not
        write empty containers, and MaxText's ``load_parameters_path`` reads only ``params``.
        """
        names = self.config_names(config)
        hf = _hf_leaves(tree)
        self._check_hf_layers(hf, names)
        used: set[str] = set()
        out: dict[str, Any] = {}
        for leaf in self._active(names):
            for path, value in self._forward(leaf, hf, names, used).items():
                out[f"{self._root}{path}"] = value
        self._check_all_used(hf, used, names)
        if self.target == "maxtext":
            out["step"] = 0  # MaxText's TrainState starts a converted model at step 0
        return unflatten(out)

    def to_target(self, tree: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The tree of the recipe's target (MaxText's, or ``nnx.state`` of Tunix's model) of
        an HF tree, lazily: as a transform for `suture.nnx.load_into`, say."""
        return self.to_maxtext(tree, config)

    def _forward(self, leaf: Leaf, hf: dict, names: dict, used: set[str]) -> dict[str, Any]:
        if leaf.group is None:
            return {leaf.maxtext: self._gathered(leaf, None, hf, names, used)}
        members = [
            self._gathered(leaf, index, hf, names, used)
            for index in self._layer_indices(leaf.group, names)
        ]
        if self.scanned:
            return {leaf.maxtext: stack_arrays(members, axis=SCAN_AXIS)}
        return {_unscanned(leaf.maxtext, i): member for i, member in enumerate(members)}

    def _gathered(self, leaf: Leaf, index: int | None, hf: dict, names: dict, used: set) -> Any:
        converted = [self._converted(leaf, name, hf, names, used) for name in leaf.sources(index)]
        return stack_arrays(converted, axis=0) if leaf.stacked else converted[0]

    def _converted(self, leaf: Leaf, name: str, hf: dict, names: dict, used: set) -> LazyArray:
        if name not in hf:
            raise ConfigMismatchError(
                f"Recipe {self.name!r} needs tensor {name!r} for {leaf.maxtext!r}, which the "
                f"checkpoint lacks.{did_you_mean(name, hf)} Check that config.json belongs to "
                f"these weights (num_hidden_layers={names.get('num_hidden_layers')})."
            )
        used.add(name)
        array = as_lazy(hf[name], path=name)
        for operation in leaf.operations:
            array = operation.forward(array, names)
        return array

    def _layer_indices(self, group: str, names: dict[str, Any]) -> list[int]:
        spec = self.groups[group]
        return [
            int(evaluate(spec.hf_index, {**names, "i": i}))
            for i in range(self.layer_counts(names)[group])
        ]

    def _check_hf_layers(self, hf: dict[str, Any], names: dict[str, Any]) -> None:
        """The layers the config names against those the HF checkpoint holds, before planning.

        A count past the layers present fails before any index is listed, so a config naming
        10**9 layers is an error at once, not a loop over them.
        """
        counts = self.layer_counts(names)
        templates: dict[str, set[str]] = {}  # tensor name with {} for the layer -> its groups
        for leaf in self._active(names):
            if leaf.group is not None:
                for name in leaf.sources():
                    templates.setdefault(name.replace(f"{{{leaf.group}}}", "{}"), set()).add(
                        leaf.group
                    )
        for template, groups in templates.items():
            self._compare_layers(
                groups,
                names,
                sum(counts[group] for group in groups),
                template,
                _indices(template, hf),
                lambda groups=groups: {
                    index for group in groups for index in self._layer_indices(group, names)
                },
            )

    def _compare_layers(
        self,
        groups: set[str],
        names: dict[str, Any],
        wanted: int,
        template: str,
        found: set[int],
        expected: Callable[[], set[int]],
    ) -> None:
        """Refuses a config whose layers are not those found; `expected` runs only once
        `wanted` is known to be no more than the layers found, so it lists few."""
        held = _layers_held(template, found)
        if wanted > len(found):
            problem = f"{_layers(wanted)}, and the checkpoint holds {held}"
        else:
            numbers = expected()
            missing, extra = sorted(numbers - found), sorted(found - numbers)
            if not missing and not extra:
                return
            problem = (
                f"{_layers(wanted)} ({_ranges(numbers) or 'none'}), and the checkpoint holds "
                f"{held}: "
                + (
                    f"layer {missing[0]} is missing"
                    if missing
                    else f"layer {extra[0]} would be lost"
                )
            )
        raise ConfigMismatchError(
            f"{self._count_fields(groups, names)}: {problem}. Pass the config.json of these "
            f"weights (--config)."
        )

    def _count_fields(self, groups: set[str], names: dict[str, Any]) -> str:
        """``config.json field 'num_hidden_layers' is 1000000000``: what sets a layer count."""
        fields = sorted(set().union(*(names_in(self.groups[g].count) for g in groups)))
        shown = ", ".join(f"{field!r} is {_shown(names.get(field))}" for field in fields)
        return f"Recipe {self.name!r}: config.json field {shown}"

    def _check_all_used(self, hf: dict, used: set[str], names: dict) -> None:
        left = sorted(
            name
            for name in hf
            if name not in used and not any(re.fullmatch(p, name) for p in self.ignore)
        )
        if left:
            raise ConfigMismatchError(
                f"Recipe {self.name!r} has no place for {len(left)} tensor(s) of the checkpoint: "
                f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}. Converting would lose "
                f"them; this model is not a plain {self.family} (see `suture recipes`)."
            )

    # MaxText -> Hugging Face ---------------------------------------------------------------

    def to_hf(self, tree: Any, config: dict[str, Any]) -> dict[str, Any]:
        """``{tensor name: LazyArray}`` of a MaxText tree (with or without its params/params)."""
        names = self.config_names(config)
        flat = flatten(tree)
        if self.target != "maxtext":  # nnx.state saved with Orbax spells each leaf .../value
            flat = {_unwrapped(path): leaf for path, leaf in flat.items()}
        root = self._root
        prefix = root if root and any(p.startswith(root) for p in flat) else ""
        self._check_maxtext_layers(flat, prefix, names)
        out: dict[str, LazyArray] = {}
        for leaf in self._active(names):
            if leaf.group is None:
                taken = _take(flat, prefix + leaf.maxtext, self._label)
                out.update(self._unstacked(leaf, None, taken, names))
                continue
            indices = self._layer_indices(leaf.group, names)
            stacked = _take(flat, prefix + leaf.maxtext) if self.scanned else None
            for i, index in enumerate(indices):
                if stacked is not None:
                    member = stacked[(slice(None),) * SCAN_AXIS + (i,)]
                else:
                    member = _take(flat, prefix + _unscanned(leaf.maxtext, i), self._label)
                out.update(self._unstacked(leaf, index, member, names))
        return out

    def _unstacked(self, leaf: Leaf, index: int | None, array: Any, names: dict) -> dict:
        """{HF name: tensor} of one target leaf (of layer `index`), its stack taken apart."""
        sources = leaf.sources(index)
        if not leaf.stacked:
            return {sources[0]: self._restored(leaf, array, names)}
        if array.ndim < 1 or array.shape[0] != len(sources):
            raise ConfigMismatchError(
                f"{self._label} leaf {leaf.maxtext!r} stacks {len(sources)} tensors "
                f"({', '.join(sources)}) on its first axis; found shape {array.shape}."
            )
        return {name: self._restored(leaf, array[j], names) for j, name in enumerate(sources)}

    def _check_maxtext_layers(self, flat: dict[str, Any], prefix: str, names: dict) -> None:
        """The layers the config names against those the MaxText tree holds, before planning."""
        counts = self.layer_counts(names)
        for leaf in self._active(names):
            if leaf.group is None:
                continue
            wanted = counts[leaf.group]
            if self.scanned:
                stacked = _take(flat, prefix + leaf.maxtext)
                if stacked.ndim <= SCAN_AXIS or stacked.shape[SCAN_AXIS] != wanted:
                    held = stacked.shape[SCAN_AXIS] if stacked.ndim > SCAN_AXIS else "no"
                    raise ConfigMismatchError(
                        f"{self._count_fields({leaf.group}, names)}: {_layers(wanted)}, and "
                        f"MaxText leaf {leaf.maxtext!r} holds {held} (shape {stacked.shape}, "
                        f"layers on axis {SCAN_AXIS}). Pass the config.json of this model "
                        f"(--config)."
                    )
                continue
            template = prefix + _unscanned(leaf.maxtext, "{}")
            found = _indices(template, flat)
            self._compare_layers(
                {leaf.group},
                names,
                wanted,
                template,
                found,
                lambda wanted=wanted: set(range(wanted)),
            )

    def _restored(self, leaf: Leaf, array: LazyArray, names: dict) -> LazyArray:
        for operation in reversed(leaf.operations):
            array = operation.backward(array, names)
        return array

    def _active(self, names: dict[str, Any]) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.when is None or evaluate(leaf.when, names)]

    def operations_table(self, config: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(MaxText leaf, HF tensor, operations) rows, for plans and `suture recipes`."""
        names = self.config_names(config)
        return [
            (
                leaf.maxtext,
                " + ".join(leaf.sources()),
                ", ".join(op.describe(names) for op in leaf.operations)
                + (", stacked on axis 0" if leaf.stacked else "")
                or "-",
            )
            for leaf in self._active(names)
        ]


def _unscanned(maxtext_path: str, index: int | str) -> str:
    if "{" in maxtext_path:  # a Tunix path names its layer: layers/{layer}/...
        return re.sub(r"\{\w+\}", str(index), maxtext_path, count=1)
    return maxtext_path.replace("decoder/layers/", f"decoder/layers_{index}/", 1)


def _unwrapped(path: str) -> str:
    """``layers/0/attn/q_proj/w`` of ``.../w/value`` (an ``nnx.Variable`` saved by Orbax)."""
    return path.removesuffix("/value")


def _take(flat: dict[str, Any], path: str, label: str = "MaxText") -> LazyArray:
    if path not in flat:
        raise ConfigMismatchError(
            f"The {label} checkpoint has no leaf {path!r}.{did_you_mean(path, flat)} Is it a "
            f"checkpoint of this family{' and layout (scanned or not)' if label == 'MaxText' else ''}?"
        )
    return as_lazy(flat[path], path=path)


_INDEX = re.compile(r"0|[1-9][0-9]*")


def _indices(template: str, names: Any) -> set[int]:
    """The layer numbers of the names that fit `template` (a name with ``{}`` for the number)."""
    before, after = template.split("{}", 1)
    found = set()
    for name in names:
        if name.startswith(before) and name.endswith(after) and len(name) > len(template) - 2:
            number = name[len(before) : len(name) - len(after)]
            if _INDEX.fullmatch(number):
                found.add(int(number))
    return found


def _layers_held(template: str, found: set[int]) -> str:
    """``2 ('model.layers.N.mlp.down_proj.weight' for N = 0-1)``, for messages."""
    if not found:
        return f"none ({template.replace('{}', 'N')!r} for no layer N)"
    return f"{len(found)} ({template.replace('{}', 'N')!r} for N = {_ranges(found)})"


def _ranges(numbers: set[int]) -> str:
    """``0-3, 5`` for {0, 1, 2, 3, 5}; long lists are cut."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    shown = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:8]]
    return ", ".join(shown) + (" ..." if len(runs) > 8 else "")


def _layers(count: int) -> str:
    return f"{count} layer{'' if count == 1 else 's'}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_shown(expression: Any, names: dict[str, Any]) -> str:
    return ", ".join(
        f"{field}={_shown(names.get(field))}" for field in sorted(names_in(expression))
    )


def _hf_leaves(tree: Any) -> dict[str, Any]:
    """HF tensor names (dotted) -> leaves, from a tree opened with the '.' separator."""
    return {path.replace("/", "."): leaf for path, leaf in flatten(tree).items()}


# The built-in recipes -------------------------------------------------------------------------


@functools.cache
def _families(target: str = "maxtext") -> dict[str, dict[str, Any]]:
    """The tables of `target` (a YAML's ``target:``, MaxText when it has none), by family."""
    found: dict[str, dict[str, Any]] = {}
    for entry in sorted(importlib.resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
            if data.get("target", "maxtext") != target:
                continue
            for family in data["names"]:
                found[family] = {**data, "source_file": entry.name}
    return found


def recipe_names() -> list[str]:
    """Every built-in recipe name, e.g. ``llama3.1:maxtext`` or ``qwen3:tunix``."""
    return [
        f"{family}:{layout}"
        for target, layouts in TARGETS.items()
        for family in _families(target)
        for layout in layouts
    ]


def is_recipe_name(name: str) -> bool:
    return (
        isinstance(name, str)
        and ":" in name
        and any(name.split(":", 1)[0] in _families(target) for target in TARGETS)
    )


def get_recipe(name: str) -> FamilyRecipe:
    """The built-in recipe `name` (``FAMILY:maxtext``, ``FAMILY:maxtext-unscanned`` or ``FAMILY:tunix``)."""
    family, _, layout = name.partition(":")
    target = next((t for t, layouts in TARGETS.items() if layout in layouts), None)
    if target is None or family not in _families(target):
        raise RecipeError(
            f"No built-in recipe {name!r}.{did_you_mean(name, recipe_names())} "
            f"Built in: {', '.join(recipe_names())}."
        )
    return _parse(family, _families(target)[family], TARGETS[target][layout])


def _parse(family: str, data: dict[str, Any], scanned: bool) -> FamilyRecipe:
    where = data["source_file"]
    group_specs = data.get("layer_groups") or {
        "layer": {"count": "num_hidden_layers", "hf_index": "i"}
    }
    groups = {
        name: LayerGroup(str(spec["count"]), str(spec["hf_index"]))
        for name, spec in group_specs.items()
    }
    target = data.get("target", "maxtext")
    leaves = []
    for number, item in enumerate(data["leaves"]):
        if not isinstance(item, dict) or not {target, "hf"} <= set(item):
            raise RecipeFormatError(f"{where}: leaf {number} needs {target!r} and 'hf'.")
        stacked = tuple(item["hf"]) if isinstance(item["hf"], list) else ()
        first = stacked[0] if stacked else item["hf"]
        group = next((g for g in groups if f"{{{g}}}" in first), None)
        operations = tuple(
            parse_operation(op, f"{where}: leaf {item[target]!r}") for op in item.get("ops", [])
        )
        leaves.append(Leaf(item[target], first, group, operations, item.get("when"), stacked))
    config = data.get("config", {})
    defaults = dict(config.get("defaults") or {})
    checks = tuple(config.get("checks") or ())
    expressions = [*defaults.values(), *(check["test"] for check in checks)]
    expressions += [text for group in groups.values() for text in (group.count, group.hf_index)]
    for leaf in leaves:
        expressions += [leaf.when or 0, *(e for op in leaf.operations for e in op.expressions())]
    fields = set(defaults) | set(config.get("require") or {})
    for expression in expressions:
        fields |= names_in(expression)
    return FamilyRecipe(
        family=family,
        scanned=scanned,
        follows=data["follows"],
        description=data["description"],
        require={k: list(v) for k, v in (config.get("require") or {}).items()},
        defaults=defaults,
        checks=checks,
        groups=groups,
        leaves=tuple(leaves),
        ignore=tuple(data.get("ignore") or ()),
        fields=frozenset(fields - {"i"}),
        target=target,
    )
