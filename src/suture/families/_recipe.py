"""A model-family recipe: a table of MaxText leaves, each with its Hugging Face source and
the invertible operations between them, read from a YAML file of this package.

The same table runs both ways. To MaxText, every HF tensor of a per-layer leaf goes through
the operations and the layers are stacked on MaxText's scan axis (1), or kept as
``layers_{i}`` subtrees when unscanned; a leaf with ``{expert}`` stacks its experts too
(`_experts`). Back to HF, the stack is unstacked and the inverse operations run in reverse
order. Everything stays lazy, so a conversion streams.

Example:
    >>> recipe = get_recipe("llama3.1:maxtext")
    >>> recipe.family, recipe.scanned
    ('llama3.1', True)
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import warnings
from dataclasses import dataclass
from typing import Any

import yaml

from .._errors import ConfigMismatchError, RecipeError, did_you_mean
from .._lazy.array import LazyArray, as_lazy
from .._lazy.combine import concatenate
from .._lazy.combine import stack as stack_arrays
from .._paths import flatten, unflatten
from ._experts import (
    EXPERT_LAYOUTS,
    FUSED,
    PER_EXPERT,
    FusedSource,
    check_count,
    member,
    parse_fused,
    stacked_axes,
)
from ._expr import evaluate
from ._multimodal import LanguageModel, LeftOutWarning, parse_language_model, renamed
from ._ops import FitRows, Operation, RecipeFormatError, parse_operation

MAXTEXT_ROOT = "params/params"
SCAN_AXIS = 1  # MaxText's param_scan_axis: the layer axis of every scanned tensor
LAYOUTS = {"maxtext": True, "maxtext-unscanned": False}


@dataclass(frozen=True)
class Leaf:
    maxtext: str  # path below params/params, e.g. "decoder/layers/mlp/wo/kernel"
    hf: str  # tensor name, with {group} where the layer index goes
    group: str | None
    operations: tuple[Operation, ...]
    when: str | None
    experts: bool = False  # hf holds {expert}: one tensor per expert, stacked
    expert_axis: int = 0  # where the experts go (scanned layout, layers included)
    layer_axis: int = SCAN_AXIS  # where the layers go when scanned
    fused: FusedSource | None = None  # where the tensor sits in transformers' fused layout
    always_fused: bool = False  # no per-tensor form: published fused (gpt-oss, Llama 4)

    def fused_in(self, layout: str | None) -> FusedSource | None:
        """Where this leaf's tensor sits in a fused HF tensor, in the expert layout `layout`."""
        return self.fused if layout == FUSED or self.always_fused else None

    def hf_name(self, layout: str | None, index: int | None, expert: int | None = None) -> str:
        """The HF tensor of layer `index` (and `expert`) in the expert layout `layout`."""
        fused = self.fused_in(layout)
        name = fused.hf if fused is not None else self.hf
        if self.group is not None:
            name = name.replace(f"{{{self.group}}}", str(index))
        return name if expert is None else name.replace("{expert}", str(expert))


@dataclass(frozen=True)
class LayerGroup:
    count: str  # expression: how many MaxText layers
    hf_index: str  # expression of i: the HF layer of MaxText layer i
    unscanned_by_hf: bool = False  # unscanned, layers_{HF index} rather than layers_{i}


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
    experts: str | None = None  # expression: how many experts a MoE layer has
    period: str | None = None  # expression: scanned layers repeat with this period
    language_model: LanguageModel | None = None  # also converts a multimodal folder's

    @property
    def name(self) -> str:
        return f"{self.family}:{'maxtext' if self.scanned else 'maxtext-unscanned'}"

    def config_names(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config's fields with the recipe's defaults filled in, checked against it.

        A multimodal model's config holds the language model's in a sub-config
        (``text_config``), which is the one a recipe with a ``language_model`` entry reads.
        """
        names = self.language_model.text_config(config) if self.language_model else dict(config)
        for field, default in self.defaults.items():
            if names.get(field) is None:
                names[field] = evaluate(default, names)
        for field, allowed in self.require.items():
            if names.get(field) not in allowed:
                raise ConfigMismatchError(
                    f"config.json field {field!r} is {names.get(field)!r}; recipe {self.name!r} "
                    f"fits {', '.join(map(repr, allowed))}. Pick the recipe of this model's "
                    f"family (`suture recipes` lists them)."
                )
        for check in self.checks:
            if not evaluate(check["test"], names):
                field = check["field"]
                raise ConfigMismatchError(
                    f"config.json field {field!r} is {names.get(field)!r}: {check['message']} "
                    f"(recipe {self.name!r}, which follows {self.follows})."
                )
        return names

    # Hugging Face -> MaxText ---------------------------------------------------------------

    def to_maxtext(self, tree: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The MaxText tree ``{"params": {"params": ...}, "step": 0}`` of an HF tree, lazily.

        MaxText's converter also saves an empty ``opt_state``; suture's Orbax writer does not
        write empty containers, and MaxText's ``load_parameters_path`` reads only ``params``.
        """
        names = self.config_names(config)
        hf = _hf_leaves(tree)
        prefix = self._prefix(hf)
        if self.language_model is not None and prefix is not None:
            hf = self.language_model.to_text(hf, prefix, self.name)
        layout = self._expert_layout(hf, names)
        used: set[str] = set()
        out: dict[str, Any] = {}
        for leaf in self._active(names):
            for path, value in self._forward(leaf, hf, names, used, layout).items():
                out[f"{MAXTEXT_ROOT}/{path}"] = value
        self._check_all_used(hf, used, names)
        self._warn_cut_rows(names)
        out["step"] = 0  # MaxText's TrainState starts a converted model at step 0
        return unflatten(out)

    def _forward(
        self, leaf: Leaf, hf: dict, names: dict, used: set[str], layout: str | None
    ) -> dict[str, Any]:
        if leaf.group is None:
            return {leaf.maxtext: self._converted(leaf, layout, None, None, hf, names, used)}
        out = {}
        for path, indices, stacked in self._slots(leaf, names):
            if leaf.experts:
                expert_axis, _ = stacked_axes(leaf.expert_axis, leaf.layer_axis)
                members = [
                    stack_arrays(
                        [
                            self._converted(leaf, layout, index, expert, hf, names, used)
                            for expert in range(self.expert_count(names))
                        ],
                        axis=expert_axis,
                    )
                    for index in indices
                ]
            else:
                members = [
                    self._converted(leaf, layout, index, None, hf, names, used) for index in indices
                ]
            out[path] = stack_arrays(members, axis=leaf.layer_axis) if stacked else members[0]
        return out

    def _slots(self, leaf: Leaf, names: dict[str, Any]) -> list[tuple[str, list[int], bool]]:
        """(MaxText path, its HF layers, stacked?) of a per-layer leaf in this layout.

        Unscanned, each layer is ``layers_{i}``. Scanned, all layers stack on the scan axis;
        with a layer period P (Gemma 3: 5 local + 1 global), position k of the period is
        ``layers/layers_{k}`` (HF layers k, k+P, ...) and the layers after the last full
        period stay unscanned in ``layers_remainder/layers_{r}``.
        """
        indices = self._layer_indices(leaf.group, names)  # type: ignore[arg-type]
        if not self.scanned:
            by_hf = self.groups[leaf.group].unscanned_by_hf  # type: ignore[index]
            return [
                (_unscanned(leaf.maxtext, index if by_hf else i), [index], False)
                for i, index in enumerate(indices)
            ]
        if self.period is None:
            return [(leaf.maxtext, indices, True)]
        # a layer's place in the period is its HF index modulo the period, so a group of some
        # of the layers (Llama 4's MoE layers) fills only its own positions
        period = int(evaluate(self.period, names))
        layers = int(names["num_hidden_layers"])
        full = layers - layers % period
        slots = []
        for k in range(period):
            members = [index for index in indices if index < full and index % period == k]
            if members:
                slots.append((_moved(leaf.maxtext, f"decoder/layers/layers_{k}/"), members, True))
        return slots + [
            (
                _moved(leaf.maxtext, f"decoder/layers_remainder/layers_{index - full}/"),
                [index],
                False,
            )
            for index in indices
            if index >= full
        ]

    def _converted(
        self,
        leaf: Leaf,
        layout: str | None,
        index: int | None,
        expert: int | None,
        hf: dict,
        names: dict,
        used: set,
    ) -> LazyArray:
        fused = leaf.fused_in(layout)
        name = leaf.hf_name(layout, index, None if fused is not None else expert)
        if name not in hf:
            raise ConfigMismatchError(
                f"Recipe {self.name!r} needs tensor {name!r} for {leaf.maxtext!r}, which the "
                f"checkpoint lacks.{did_you_mean(name, hf)} Check that config.json belongs to "
                f"these weights (num_hidden_layers={names.get('num_hidden_layers')})."
            )
        used.add(name)
        array = as_lazy(hf[name], path=name)
        if fused is not None:
            array = fused.take(array, expert)
        for operation in leaf.operations:
            array = operation.forward(array, names)
        return array

    def _warn_cut_rows(self, names: dict[str, Any]) -> None:
        for leaf in self._active(names):
            for operation in leaf.operations:
                if isinstance(operation, FitRows):
                    kept, rows = operation.cut(names)
                    if kept < rows:
                        warnings.warn(
                            f"Recipe {self.name!r} keeps {kept} of the {rows} rows of "
                            f"{leaf.hf!r}, as MaxText's converter does; `suture convert ... "
                            f"--reverse --like ORIGINAL` restores the {rows - kept} others.",
                            LeftOutWarning,
                            stacklevel=4,
                        )

    def hf_prefix(self, tree: Any) -> str | None:
        """Where a multimodal HF folder keeps the language model (``"language_model.model."``),
        or None for a language-model folder (``"model."``)."""
        return self._prefix(_hf_leaves(tree))

    def _prefix(self, hf: dict[str, Any]) -> str | None:
        return self.language_model.prefix(hf) if self.language_model else None

    def expert_count(self, names: dict[str, Any]) -> int:
        if self.experts is None:
            raise RecipeFormatError(f"Recipe {self.name!r} uses {{expert}} but sets no 'experts'.")
        return int(evaluate(self.experts, names))

    def expert_layout(self, tree: Any, config: dict[str, Any]) -> str | None:
        """How the HF tree stores experts: ``"per-expert"``, ``"fused"``, or None (no MoE)."""
        return self._expert_layout(_hf_leaves(tree), self.config_names(config))

    def _expert_layout(self, hf: dict[str, Any], names: dict[str, Any]) -> str | None:
        leaf = next(
            (leaf for leaf in self._active(names) if leaf.experts and leaf.group is not None),
            None,
        )
        if leaf is None:
            return None
        indices = self._layer_indices(leaf.group, names)  # type: ignore[arg-type]
        if not indices:
            return PER_EXPERT
        per_expert = leaf.hf_name(PER_EXPERT, indices[0], 0)
        if per_expert in hf or leaf.fused is None:
            return PER_EXPERT
        fused = leaf.hf_name(FUSED, indices[0])
        if fused in hf:
            return FUSED
        raise ConfigMismatchError(
            f"Recipe {self.name!r} finds the experts of layer {indices[0]} neither as "
            f"{per_expert!r} (one tensor per expert) nor as {fused!r} (transformers' fused "
            f"layout).{did_you_mean(per_expert, hf)} Is this a {self.family} checkpoint?"
        )

    def _layer_indices(self, group: str, names: dict[str, Any]) -> list[int]:
        spec = self.groups[group]
        return [
            int(evaluate(spec.hf_index, {**names, "i": i}))
            for i in range(int(evaluate(spec.count, names)))
        ]

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

    def to_hf(
        self,
        tree: Any,
        config: dict[str, Any],
        layout: str | None = None,
        prefix: str | None = None,
        like: Any = None,
    ) -> dict[str, Any]:
        """``{tensor name: LazyArray}`` of a MaxText tree (with or without its params/params).

        `layout` is how the HF side stores experts (``"per-expert"``, the default, as
        published checkpoints do, or ``"fused"``, transformers v5's 3-D tensors). `prefix`
        is where a multimodal folder keeps the language model (default: the recipe's first,
        when `config` is a multimodal one). `like`, the original HF tree, gives back what
        MaxText's layout left out: rows cut from the vocabulary, a vision tower.
        """
        language_model = self.language_model
        if language_model is None:
            prefix = None
        elif prefix is None and language_model.is_multimodal(config):
            prefix = language_model.prefixes[0]
        out = self._to_hf(tree, config, layout)
        if language_model is not None and prefix is not None:
            out = language_model.from_text(out, prefix)
        if like is not None:
            original = _hf_leaves(like)
            self._restore_cut_rows(original, out, self.config_names(config), prefix)
            if language_model is not None and prefix is not None:
                language_model.restore_left_out(
                    {name: as_lazy(value, path=name) for name, value in original.items()}, out
                )
        return out

    def _restore_cut_rows(
        self, original: dict[str, Any], out: dict[str, Any], names: dict, prefix: str | None
    ) -> None:
        """Rows a ``fit_rows`` cut, taken back from the `original` HF tensors."""
        for leaf in self._active(names):
            cuts = [op.cut(names) for op in leaf.operations if isinstance(op, FitRows)]
            name = renamed(leaf.hf, "model.", prefix) if prefix else leaf.hf
            if leaf.group is not None or not cuts or name not in original or name not in out:
                continue
            kept, rows = cuts[0]
            source = as_lazy(original[name], path=name)
            if kept < rows and source.shape == out[name].shape:
                restored = concatenate([out[name][:kept], source[kept:].astype(out[name].dtype)])
                out[name] = restored

    def _to_hf(self, tree: Any, config: dict[str, Any], layout: str | None) -> dict[str, Any]:
        names = self.config_names(config)
        if layout is not None and layout not in EXPERT_LAYOUTS:
            raise ConfigMismatchError(
                f"Expert layout {layout!r} is not one of {', '.join(EXPERT_LAYOUTS)}."
            )
        layout = layout or PER_EXPERT
        flat = flatten(tree)
        prefix = f"{MAXTEXT_ROOT}/" if any(p.startswith(f"{MAXTEXT_ROOT}/") for p in flat) else ""
        out: dict[str, LazyArray] = {}
        parts: dict[str, dict[int, LazyArray]] = {}  # fused tensor -> its parts, joined below
        fused_of: dict[str, FusedSource] = {}
        for leaf in self._active(names):
            if leaf.group is None:
                out[leaf.hf] = self._restored(leaf, _take(flat, prefix + leaf.maxtext), names)
                continue
            for path, index, layer in self._layers_back(leaf, flat, prefix, names):
                if not leaf.experts:
                    tensor = self._restored(leaf, layer, names)
                    fused = leaf.fused_in(layout)
                    if fused is not None:
                        name = leaf.hf_name(FUSED, index)
                        parts.setdefault(name, {})[fused.part] = tensor
                        fused_of[name] = fused
                    else:
                        out[leaf.hf_name(PER_EXPERT, index)] = tensor
                    continue
                axis, _ = stacked_axes(leaf.expert_axis, leaf.layer_axis)
                count = self.expert_count(names)
                check_count(layer, axis, count, "experts", path)
                experts = [
                    self._restored(leaf, member(layer, {axis: e}), names) for e in range(count)
                ]
                if layout == FUSED and leaf.fused is not None:
                    name = leaf.hf_name(FUSED, index)
                    parts.setdefault(name, {})[leaf.fused.part] = stack_arrays(experts, axis=0)
                    fused_of[name] = leaf.fused
                else:
                    for e, tensor in enumerate(experts):
                        out[leaf.hf_name(PER_EXPERT, index, e)] = tensor
        for name, pieces in parts.items():
            fused = fused_of[name]
            if sorted(pieces) != list(range(fused.parts)):
                raise RecipeFormatError(
                    f"Recipe {self.name!r} fills parts {sorted(pieces)} of fused tensor "
                    f"{name!r}, which has {fused.parts}."
                )
            out[name] = fused.join([pieces[k] for k in range(fused.parts)])
        return out

    def _layers_back(
        self, leaf: Leaf, flat: dict, prefix: str, names: dict
    ) -> list[tuple[str, int, LazyArray]]:
        """(MaxText path, HF layer, that layer's array) of every layer of a per-layer leaf."""
        out = []
        for path, indices, stacked in self._slots(leaf, names):
            array = _take(flat, prefix + path)
            if not stacked:
                out.append((path, indices[0], array))
                continue
            check_count(array, leaf.layer_axis, len(indices), "layers", path)
            out += [
                (path, index, member(array, {leaf.layer_axis: i}))
                for i, index in enumerate(indices)
            ]
        return out

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
                leaf.hf,
                ", ".join(
                    [
                        *_stacking(leaf, self.scanned),
                        *(op.describe(names) for op in leaf.operations),
                    ]
                )
                or "-",
            )
            for leaf in self._active(names)
        ]


def _stacking(leaf: Leaf, scanned: bool) -> list[str]:
    steps = []
    if leaf.experts:
        axis = leaf.expert_axis if scanned else stacked_axes(leaf.expert_axis, leaf.layer_axis)[0]
        steps.append(f"experts on axis {axis}")
    if leaf.fused is not None:
        fused = leaf.fused
        where = (
            ""
            if fused.axis is None
            else f" part {fused.part} of {fused.parts} on axis {fused.axis}, {fused.mode}"
        )
        steps.append(f"{'from' if leaf.always_fused else 'or'} fused {fused.hf}{where}")
    if scanned and leaf.group is not None and leaf.layer_axis != SCAN_AXIS:
        steps.append(f"layers on axis {leaf.layer_axis}")
    return steps


def _unscanned(maxtext_path: str, index: int) -> str:
    """``decoder/layers/x`` -> ``decoder/layers_3/x`` (and ``moe_layers`` -> ``moe_layers_3``)."""
    return re.sub(r"^decoder/(\w*layers)/", rf"decoder/\g<1>_{index}/", maxtext_path, count=1)


def _moved(maxtext_path: str, layers: str) -> str:
    return maxtext_path.replace("decoder/layers/", layers, 1)


def _take(flat: dict[str, Any], path: str) -> LazyArray:
    if path not in flat:
        raise ConfigMismatchError(
            f"The MaxText checkpoint has no leaf {path!r}.{did_you_mean(path, flat)} Is it a "
            f"checkpoint of this family and layout (scanned or not)?"
        )
    return as_lazy(flat[path], path=path)


def _hf_leaves(tree: Any) -> dict[str, Any]:
    """HF tensor names (dotted) -> leaves, from a tree opened with the '.' separator."""
    return {path.replace("/", "."): leaf for path, leaf in flatten(tree).items()}


# The built-in recipes -------------------------------------------------------------------------


@functools.cache
def _families() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in sorted(importlib.resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
            for family in data["names"]:
                found[family] = {**data, "source_file": entry.name}
    return found


def recipe_names() -> list[str]:
    """Every built-in recipe name, e.g. ``llama3.1:maxtext``."""
    return [f"{family}:{layout}" for family in _families() for layout in LAYOUTS]


def is_recipe_name(name: str) -> bool:
    return isinstance(name, str) and ":" in name and name.split(":", 1)[0] in _families()


def get_recipe(name: str) -> FamilyRecipe:
    """The built-in recipe `name` (``FAMILY:maxtext`` or ``FAMILY:maxtext-unscanned``)."""
    family, _, layout = name.partition(":")
    if family not in _families() or layout not in LAYOUTS:
        raise RecipeError(
            f"No built-in recipe {name!r}.{did_you_mean(name, recipe_names())} "
            f"Built in: {', '.join(recipe_names())}."
        )
    return _parse(family, _families()[family], LAYOUTS[layout])


def _parse(family: str, data: dict[str, Any], scanned: bool) -> FamilyRecipe:
    where = data["source_file"]
    group_specs = data.get("layer_groups") or {
        "layer": {"count": "num_hidden_layers", "hf_index": "i"}
    }
    groups = {
        name: LayerGroup(
            str(spec["count"]), str(spec["hf_index"]), spec.get("unscanned") == "hf_index"
        )
        for name, spec in group_specs.items()
    }
    leaves = []
    for number, item in enumerate(data["leaves"]):
        if isinstance(item, dict) and "hf" not in item and isinstance(item.get("fused"), dict):
            item = {**item, "hf": item["fused"].get("hf"), "always_fused": True}  # fused only
        if not isinstance(item, dict) or not {"maxtext", "hf"} <= set(item):
            raise RecipeFormatError(
                f"{where}: leaf {number} needs 'maxtext' and 'hf' (or 'fused')."
            )
        group = next((g for g in groups if f"{{{g}}}" in str(item["hf"])), None)
        context = f"{where}: leaf {item['maxtext']!r}"
        operations = tuple(parse_operation(op, context) for op in item.get("ops", []))
        axes = item.get("axes") or {}
        experts = "{expert}" in item["hf"]
        if experts and (group is None or "experts" not in data):
            raise RecipeFormatError(
                f"{context}: {{expert}} needs a layer placeholder beside it and a top-level "
                f"'experts' (the count, e.g. num_local_experts)."
            )
        leaves.append(
            Leaf(
                item["maxtext"],
                item["hf"],
                group,
                operations,
                item.get("when"),
                experts=experts,
                expert_axis=int(axes.get("expert", 0)),
                layer_axis=int(axes.get("layer", SCAN_AXIS)),
                fused=parse_fused(item["fused"], context) if "fused" in item else None,
                always_fused=bool(item.get("always_fused")),
            )
        )
    config = data.get("config", {})
    return FamilyRecipe(
        family=family,
        scanned=scanned,
        follows=data["follows"],
        description=data["description"],
        require={k: list(v) for k, v in (config.get("require") or {}).items()},
        defaults=dict(config.get("defaults") or {}),
        checks=tuple(config.get("checks") or ()),
        groups=groups,
        leaves=tuple(leaves),
        ignore=tuple(data.get("ignore") or ()),
        experts=str(data["experts"]) if "experts" in data else None,
        period=str(data["layer_period"]) if "layer_period" in data else None,
        language_model=parse_language_model(data.get("language_model"), where),
    )
