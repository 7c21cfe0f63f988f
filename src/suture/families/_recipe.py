"""A model-family recipe: a table of MaxText (or Tunix) leaves, each with its Hugging Face
source and the invertible operations between them, read from a YAML file of this package.

The same table runs both ways. To MaxText, every HF tensor of a per-layer leaf goes through
the operations and the layers are stacked on MaxText's scan axis (1), or kept as
``layers_{i}`` subtrees when unscanned; a leaf with ``{expert}`` stacks its experts too
(`_experts`). A Tunix table (``target: tunix``) names each layer in its paths
(``layers/{layer}/attn/q_proj/w``). Back to HF, the stack is unstacked and the inverse
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
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigMismatchError, RecipeError, did_you_mean
from .._lazy.array import LazyArray, as_lazy
from .._lazy.combine import concatenate
from .._lazy.combine import stack as stack_arrays
from .._paths import flatten, unflatten
from .._patterns import compile_pattern, fullmatch
from .._yaml import parse as parse_yaml
from ._config_lists import derived
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
from ._expr import evaluate, names_in
from ._interleave import Interleave, parse_interleave
from ._layer_config import per_kind_fields
from ._layer_kinds import check_pattern, check_set
from ._layout import (
    SCANNED,
    LayerLayout,
    Slot,
    grid_fits,
    grid_members,
    parse_blocks,
    stack_grid,
)
from ._made import Made, parse_made
from ._multimodal import (
    LanguageModel,
    LeftOutWarning,
    parse_language_model,
    renamed,
)
from ._names import is_family_name, resolve_name, unknown_name
from ._ops import FitRows, Operation, RecipeFormatError, parse_operation
from ._schema import checked_table
from ._shared_targets import check_one_writer, shared_groups
from ._table_errors import no_tensor_matches, unknown_field

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
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "interleave_moe_layer_step",
    }
)
FLAG_FIELDS = frozenset(
    {
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "use_sliding_window",
        "norm_topk_prob",
        "attention_k_eq_v",
        "enable_moe_block",
        "use_double_wide_mlp",
    }
)
# layer lists: Qwen3-MoE's mlp_only_layers is a list of layer numbers ([] for none) or false
LIST_FIELDS = frozenset({"mlp_only_layers"})
MAX_COUNT = 1 << 62  # past any tensor's length (TensorStore's index limit)
SCAN_AXIS = 1  # MaxText's param_scan_axis: the layer axis of every scanned tensor
LAYOUTS = {"maxtext": True, "maxtext-unscanned": False}
# The model code a table targets (its YAML's `target:`), and that target's layouts. A Tunix
# table writes its per-layer paths with the layer in them (``layers/{layer}/attn/q_proj/w``),
# as ``nnx.state`` of Tunix's models has them; its tree has no root and no step.
TARGETS = {"maxtext": LAYOUTS, "tunix": {"tunix": False}, "flax": {"flax": True}}
FLAX_SCAN_AXIS = 0  # nnx.scan's and nn.scan's default: a user's Flax table (target: flax)
# A tower table (`_whole`): a family's language model as FAMILY:maxtext, plus its vision tower.
TARGETS["maxtext-multimodal"] = {"maxtext-multimodal": True}


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
    experts: bool = False  # hf holds {expert}: one tensor per expert, stacked
    expert_axis: int = 0  # where the experts go (scanned layout, layers included)
    # one entry per expert on expert_axis, without {expert} (a router, a published fused
    # tensor): `axes: {expert: N}` in the table; checked against the count both ways
    routed: bool = False
    layer_axis: int = SCAN_AXIS  # where the layers go when scanned
    fused: FusedSource | None = None  # where the tensor sits in transformers' fused layout
    always_fused: bool = False  # no per-tensor form: published fused (gpt-oss, Llama 4)
    made: Made | None = None  # no HF source: a constant made to the target, dropped back
    interleave: Interleave | None = None  # hf: [a, b] joined head by head, not stacked

    def sources(self, index: int | None = None) -> tuple[str, ...]:
        """The HF tensor name(s) of this leaf, for layer `index` of its group."""
        names = self.stacked or (self.hf,)
        if index is None or self.group is None:
            return names
        return tuple(name.replace(f"{{{self.group}}}", str(index)) for name in names)

    def fused_in(self, layout: str | None) -> FusedSource | None:
        """Where this leaf's tensor sits in a fused HF tensor, in the expert layout `layout`."""
        return self.fused if layout == FUSED or self.always_fused else None

    def hf_name(
        self, layout: str | None, index: int | str | None, expert: int | None = None
    ) -> str:
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
    fields: frozenset[str]  # the config fields its expressions read
    target: str = "maxtext"  # whose layout: "maxtext" or "tunix"
    experts: str | None = None  # expression: how many experts a MoE layer has
    layout: LayerLayout | None = None  # scanned, with a period: where each position goes
    language_model: LanguageModel | None = None  # also converts a multimodal folder's
    # fields read only by defaults' expressions: needed only when that default is
    # (Qwen3-MoE's num_experts, the older name of num_local_experts)
    default_inputs: dict[str, frozenset[str]] | None = None
    # the per-layer kinds the target fixes in code (`_layer_kinds`): a repeating pattern
    # per field (Gemma 3's layer_types), or an expression of i per list of layers
    layer_patterns: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    layer_sets: tuple[tuple[str, str], ...] = ()
    # config fields of per-layer overrides, each with its list of kinds (`_layer_config`)
    per_layer: tuple[tuple[str, str], ...] = ()
    table_file: str = ""  # a user's table file: its errors name its leaves and lines

    @property
    def name(self) -> str:
        if self.target != "maxtext":
            return f"{self.family}:{self.target}"
        return f"{self.family}:{'maxtext' if self.scanned else 'maxtext-unscanned'}"

    def layer_kinds(self) -> list[str]:
        """The per-layer kinds the target fixes in code, as `suture recipes NAME` shows them.

        Example:
            >>> get_recipe("gpt-oss:maxtext").layer_kinds()
            ["layer_types is ['sliding_attention', 'full_attention'] repeated"]
        """
        patterns = [
            f"{field} is {list(pattern)} repeated" for field, pattern in self.layer_patterns
        ]
        sets = [f"{field} lists the layers where {rule}" for field, rule in self.layer_sets]
        return patterns + sets

    @property
    def _root(self) -> str:
        return f"{MAXTEXT_ROOT}/" if self.target == "maxtext" else ""

    @property
    def _label(self) -> str:
        if self.target.startswith("maxtext"):
            return "MaxText"
        return {"flax": "Flax"}.get(self.target, "Tunix")

    def config_names(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config's fields with the recipe's defaults filled in, checked against it.

        Every field the recipe reads is checked for its kind first (a count is a whole
        number of at least 1, a flag true or false, anything else a finite number), so a
        wrong value is an error naming the field, not a failure deep in the arithmetic.
        A multimodal model's config holds the language model's in a sub-config
        (``text_config``), which is the one a recipe with a ``language_model`` entry reads.
        """
        if not isinstance(config, dict):
            raise ConfigMismatchError(
                f"Recipe {self.name!r} needs the model's config.json, a JSON object; got "
                f"{type(config).__name__}."
            )
        names = self.language_model.text_config(config) if self.language_model else dict(config)
        names.update(per_kind_fields(self.name, names, self.per_layer))
        names.update(derived(names, self.fields, self.name))  # from per-layer lists
        for field in self.require:  # first: another family's model is named as such
            if field not in self.defaults:
                self._check_required(field, names)
        for field in sorted(self.fields):
            if names.get(field) is None and field not in self.defaults:
                if field in self.require:
                    continue  # said below, with the values the recipe fits
                if self._only_for_defaults_not_needed(field, names):
                    continue
                if self.table_file and field not in names:  # a typo in the table, perhaps
                    known = [*names, *self.defaults]
                    raise unknown_field(self.name, self.table_file, self.leaves, field, known)
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
        for field in self.require:
            self._check_required(field, names)
        for check in self.checks:
            if not evaluate(check["test"], names):
                field = check["field"]
                raise ConfigMismatchError(
                    f"config.json field {field!r} is {names.get(field)!r}: {check['message']} "
                    f"(recipe {self.name!r}, which follows {self.follows})."
                )
        layers = names.get("num_hidden_layers")
        for field, pattern in self.layer_patterns:
            check_pattern(self.name, field, names.get(field), pattern, layers)
        for field, expression in self.layer_sets:
            check_set(self.name, field, names.get(field), expression, names)
        return names

    def _check_required(self, field: str, names: dict[str, Any]) -> None:
        allowed = self.require[field]
        if names.get(field) not in allowed:
            raise ConfigMismatchError(
                f"config.json field {field!r} is {names.get(field)!r:.80}; recipe "
                f"{self.name!r} fits {', '.join(map(repr, allowed))}. Pick the recipe of this "
                f"model's family (`suture recipes` lists them)."
            )

    def _only_for_defaults_not_needed(self, field: str, names: dict[str, Any]) -> bool:
        """Whether `field` is read only by defaults whose own fields the config has."""
        users = (self.default_inputs or {}).get(field)
        return bool(users) and all(names.get(user) is not None for user in users)

    def _check_kind(self, field: str, value: Any, how: str) -> None:
        if field in FLAG_FIELDS:
            wanted = "true or false"
            fits = isinstance(value, bool)
        elif field in LIST_FIELDS:
            wanted = "a list of layer numbers, or false"
            fits = value is False or (
                isinstance(value, list)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            )
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
        prefix = self._prefix(hf)
        if self.language_model is not None and prefix is not None:
            hf = self.language_model.to_text(hf, prefix, self.name, self._label)
        layout = self._expert_layout(hf, names)
        self._check_hf_layers(hf, names, layout)
        used: set[str] = set()
        out: dict[str, Any] = {}
        for leaf in self._active(names):
            for path, value in self._forward(leaf, hf, names, used, layout).items():
                check_one_writer(self.name, path, f"{self._root}{path}" in out)
                out[f"{self._root}{path}"] = value
        self._check_all_used(hf, used, names)
        self._warn_cut_rows(names)
        if self.target == "maxtext":
            out["step"] = 0  # MaxText's TrainState starts a converted model at step 0
        return unflatten(out)

    def to_target(self, tree: Any, config: dict[str, Any]) -> dict[str, Any]:
        """The tree of the recipe's target (MaxText's, or ``nnx.state`` of Tunix's model) of
        an HF tree, lazily: as a transform for `suture.nnx.load_into`, say."""
        return self.to_maxtext(tree, config)

    def _forward(
        self, leaf: Leaf, hf: dict, names: dict, used: set[str], layout: str | None
    ) -> dict[str, Any]:
        if leaf.made is not None:  # a constant: once, or once per layer and stacked
            made = leaf.made.array(names)
            if leaf.group is None:
                return {leaf.maxtext: made}
            return {
                slot.path: stack_grid([made] * len(slot.indices), slot.grid, leaf.layer_axis)
                for slot in self._slots(leaf, names)
            }
        if leaf.group is None:
            return {leaf.maxtext: self._gathered(leaf, layout, None, hf, names, used)}
        out = {}
        for slot in self._slots(leaf, names):
            members = [self._gathered(leaf, layout, i, hf, names, used) for i in slot.indices]
            out[slot.path] = stack_grid(members, slot.grid, leaf.layer_axis)
        return out

    def _gathered(
        self, leaf: Leaf, layout: str | None, index: int | None, hf: dict, names: dict, used: set
    ) -> LazyArray:
        """One layer's array of `leaf`: its experts, or its stacked tensors, gathered."""
        if leaf.experts:
            expert_axis, _ = stacked_axes(leaf.expert_axis, leaf.layer_axis)
            return stack_arrays(
                [
                    self._converted(leaf, layout, index, expert, hf, names, used)
                    for expert in range(self.expert_count(names))
                ],
                axis=expert_axis,
            )
        if leaf.interleave is not None:  # the sources joined first, then the operations
            raw = [
                self._read(leaf, name, None, None, hf, names, used, index, operations=False)
                for name in leaf.sources(index)
            ]
            return self._applied(leaf, leaf.interleave.join(raw, names), names)
        if leaf.stacked:
            converted = [
                self._read(leaf, name, None, None, hf, names, used, index)
                for name in leaf.sources(index)
            ]
            return stack_arrays(converted, axis=0)
        array = self._converted(leaf, layout, index, None, hf, names, used)
        if leaf.routed:
            name = leaf.hf_name(layout, index)
            self._check_experts(
                leaf,
                array,
                names,
                f"Hugging Face tensor {name!r} (shape {as_lazy(hf[name]).shape}), as {self._label} "
                f"leaf {leaf.maxtext!r},",
            )
        return array

    def _check_experts(self, leaf: Leaf, array: LazyArray, names: dict, named: str) -> None:
        """One layer's `array` of `leaf` holds the config's count of experts on its axis."""
        axis = leaf.expert_axis
        if leaf.group is not None:
            axis, _ = stacked_axes(leaf.expert_axis, leaf.layer_axis)
        check_count(array, axis, self.expert_count(names), "experts", named, self._said(names))

    def _said(self, names: dict[str, Any]) -> str:
        """``config.json gives num_local_experts=2``: where the count of experts comes from."""
        return f"config.json gives {_fields_shown(self.experts, names)}"

    def _slots(self, leaf: Leaf, names: dict[str, Any]) -> list[Slot]:
        """The target paths of a per-layer leaf in this layout, each with its HF layers.

        Unscanned, each layer is ``layers_{i}`` (a Tunix path names it: ``layers/{i}/...``).
        Scanned, all layers stack on the scan axis, or go where the table's period and
        blocks put them (`_layout`).
        """
        indices = self._layer_indices(leaf.group, names)  # type: ignore[arg-type]
        if not self.scanned:
            by_hf = self.groups[leaf.group].unscanned_by_hf  # type: ignore[index]
            return [
                Slot(_unscanned(leaf.maxtext, index if by_hf else i), (index,), ())
                for i, index in enumerate(indices)
            ]
        if self.layout is None:
            return [Slot(leaf.maxtext, tuple(indices), (len(indices),))]
        return self.layout.slots(leaf.maxtext, indices, int(names["num_hidden_layers"]), names)

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
        return self._read(leaf, name, fused, expert, hf, names, used, index)

    def _read(
        self,
        leaf: Leaf,
        name: str,
        fused: FusedSource | None,
        expert: int | None,
        hf: dict,
        names: dict,
        used: set,
        index: int | None = None,
        operations: bool = True,
    ) -> LazyArray:
        if name not in hf:
            target = leaf.maxtext  # a per-layer target (Tunix's layers/N/...) named as this layer's
            if index is not None and self.target != "maxtext":
                target = target.replace("{layer}", str(index))
            raise ConfigMismatchError(
                f"Recipe {self.name!r} needs tensor {name!r} for {target!r}, which the "
                f"checkpoint lacks.{did_you_mean(name, hf)} Check that config.json belongs to "
                f"these weights (num_hidden_layers={names.get('num_hidden_layers')})."
            )
        used.add(name)
        array = as_lazy(hf[name], path=name)
        if fused is not None:
            if expert is not None:  # the fused tensor's axis 0 holds every expert
                named, count = f"Hugging Face tensor {name!r}", self.expert_count(names)
                check_count(array, 0, count, "experts", named, self._said(names))
            array = fused.take(array, expert)
        return self._applied(leaf, array, names) if operations else array

    def _applied(self, leaf: Leaf, array: LazyArray, names: dict) -> LazyArray:
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
        hf = _hf_leaves(tree)
        prefix = self._prefix(hf)
        if prefix is not None:  # a multimodal folder: its language model under the table's names
            text = self.language_model.text_prefix(prefix)  # type: ignore[union-attr]
            hf = {renamed(name, prefix, text): leaf for name, leaf in hf.items()}
        return self._expert_layout(hf, self.config_names(config))

    def _expert_layout(self, hf: dict[str, Any], names: dict[str, Any]) -> str | None:
        leaf = next(
            (leaf for leaf in self._active(names) if leaf.experts and leaf.group is not None),
            None,
        )
        if leaf is None:
            return None
        group = leaf.group
        if not self.layer_counts(names)[group]:  # type: ignore[index]
            return PER_EXPERT
        first = int(evaluate(self.groups[group].hf_index, {**names, "i": 0}))  # type: ignore[index]
        per_expert = leaf.hf_name(PER_EXPERT, first, 0)
        if per_expert in hf or leaf.fused is None:
            return PER_EXPERT
        fused = leaf.hf_name(FUSED, first)
        if fused in hf:
            return FUSED
        raise ConfigMismatchError(
            f"Recipe {self.name!r} finds the experts of layer {first} neither as "
            f"{per_expert!r} (one tensor per expert) nor as {fused!r} (transformers' fused "
            f"layout).{did_you_mean(per_expert, hf)} Is this a {self.family} checkpoint?"
        )

    def _layer_indices(self, group: str, names: dict[str, Any]) -> list[int]:
        spec = self.groups[group]
        return [
            int(evaluate(spec.hf_index, {**names, "i": i}))
            for i in range(self.layer_counts(names)[group])
        ]

    def _check_hf_layers(
        self, hf: dict[str, Any], names: dict[str, Any], layout: str | None = None
    ) -> None:
        """The layers the config names against those the HF checkpoint holds, before planning.

        A count past the layers present fails before any index is listed, so a config naming
        10**9 layers is an error at once, not a loop over them. An expert leaf is looked for
        by its first expert, in the expert layout the checkpoint has (`layout`).
        """
        counts = self.layer_counts(names)
        templates: dict[str, set[str]] = {}  # tensor name with {} for the layer -> its groups
        for leaf in self._active(names):
            if leaf.group is None or leaf.made is not None:
                continue
            if leaf.stacked:
                sources = [name.replace(f"{{{leaf.group}}}", "{}") for name in leaf.stacked]
            else:
                expert = 0 if leaf.experts and leaf.fused_in(layout) is None else None
                sources = [leaf.hf_name(layout, "{}", expert)]
            for name in sources:
                templates.setdefault(name, set()).add(leaf.group)
                if self.table_file and not _indices(name, hf):  # a typo in the table's hf:
                    raise no_tensor_matches(self.name, self.table_file, leaf.maxtext, leaf.hf, hf)
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
        # the table's patterns, matched under a time bound: a user's may backtrack
        ignore = [compile_pattern(p, f"Recipe {self.name!r}: ignore pattern") for p in self.ignore]
        left = sorted(
            name for name in hf if name not in used and not any(fullmatch(p, name) for p in ignore)
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
        """``{tensor name: LazyArray}`` of a MaxText tree (with or without its params/params),
        or of a Tunix ``nnx.state`` tree.

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
            prefix = language_model.default_prefix
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
            language_model = self.language_model
            name = language_model.hf_name(leaf.hf, prefix) if prefix and language_model else leaf.hf
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
        if self.target != "maxtext":  # nnx.state saved with Orbax spells each leaf .../value
            flat = {_unwrapped(path): leaf for path, leaf in flat.items()}
        root = self._root
        prefix = root if root and any(p.startswith(root) for p in flat) else ""
        self._check_maxtext_layers(flat, prefix, names)
        self._check_none_left_out(flat, prefix, names)
        out: dict[str, LazyArray] = {}
        parts: dict[str, dict[int, LazyArray]] = {}  # fused tensor -> its parts, joined below
        fused_of: dict[str, FusedSource] = {}
        for leaf in self._active(names):
            if leaf.made is not None:  # nothing to write it to: checked, then dropped
                if leaf.group is None:
                    taken = _take(flat, prefix + leaf.maxtext, self._label)
                    leaf.made.check(taken, leaf.maxtext, names, self.name)
                    continue
                for path, _, layer in self._layers_back(leaf, flat, prefix, names):
                    leaf.made.check(layer, path, names, self.name)
                continue
            if leaf.group is None:
                taken = _take(flat, prefix + leaf.maxtext, self._label)
                if leaf.routed:
                    self._check_experts(leaf, taken, names, f"{self._label} leaf {leaf.maxtext!r}")
                out.update(self._unstacked(leaf, None, taken, names))
                continue
            for path, index, layer in self._layers_back(leaf, flat, prefix, names):
                if leaf.stacked:
                    out.update(self._unstacked(leaf, index, layer, names))
                    continue
                if leaf.routed:
                    self._check_experts(leaf, layer, names, f"{self._label} leaf {path!r}")
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
                self._check_experts(leaf, layer, names, f"{self._label} leaf {path!r}")
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
        """(target path, HF layer, that layer's array) of every layer of a per-layer leaf."""
        out = []
        for slot in self._slots(leaf, names):
            array = _take(flat, prefix + slot.path, self._label)
            if len(slot.grid) == 1:
                said = f"config.json gives {_fields_shown(self.groups[leaf.group].count, names)}"  # type: ignore[index]
                named = f"{self._label} leaf {slot.path!r}"
                check_count(array, leaf.layer_axis, slot.grid[0], "layers", named, said)
            elif slot.grid:
                self._check_stack(
                    leaf, flat, prefix + slot.path, slot.grid, len(slot.indices), names
                )
            members = grid_members(array, slot.grid, leaf.layer_axis) if slot.grid else [array]
            out += [
                (slot.path, index, layer)
                for index, layer in zip(slot.indices, members, strict=True)
            ]
        return out

    def _unstacked(self, leaf: Leaf, index: int | None, array: Any, names: dict) -> dict:
        """{HF name: tensor} of one target leaf (of layer `index`), its stack taken apart."""
        sources = leaf.sources(index)
        if leaf.interleave is not None:
            restored = self._restored(leaf, array, names)
            return dict(zip(sources, leaf.interleave.split(restored, names, sources), strict=True))
        if not leaf.stacked:
            return {sources[0]: self._restored(leaf, array, names)}
        if array.ndim < 1 or array.shape[0] != len(sources):
            raise ConfigMismatchError(
                f"{self._label} leaf {leaf.maxtext!r} stacks {len(sources)} tensors "
                f"({', '.join(sources)}) on its first axis; found shape {array.shape}."
            )
        return {name: self._restored(leaf, array[j], names) for j, name in enumerate(sources)}

    def _check_maxtext_layers(self, flat: dict[str, Any], prefix: str, names: dict) -> None:
        """The layers the config names against those the target tree holds, before planning.

        As for the HF side, a count past the layers present fails before any is listed.
        """
        counts = self.layer_counts(names)
        sharing = shared_groups(self._active(names))  # one path, a leaf per layer kind
        for leaf in self._active(names):  # Tunix's paths name their group: layers/{global}/...
            if leaf.group is not None and not self.scanned:
                template = prefix + _unscanned(leaf.maxtext, "{}")
                sharing.setdefault(template, set()).add(leaf.group)
        compared: set[str] = set()
        for leaf in self._active(names):
            if leaf.group is None:
                continue
            group, wanted = leaf.group, counts[leaf.group]
            if not self.scanned:
                template = prefix + _unscanned(leaf.maxtext, "{}")
                if template in compared:
                    continue
                compared.add(template)
                groups = sharing[leaf.maxtext] | sharing[template]
                self._compare_layers(
                    groups,
                    names,
                    sum(counts[g] for g in groups),
                    template,
                    _indices(template, flat),
                    lambda groups=groups: {
                        index if self.groups[g].unscanned_by_hf else i
                        for g in groups
                        for i, index in enumerate(self._layer_indices(g, names))
                    },
                )
                continue
            if self.layout is None:
                self._check_stack(leaf, flat, prefix + leaf.maxtext, (wanted,), wanted, names)
                continue
            held = self.layout.held(leaf.maxtext, flat, prefix, leaf.layer_axis, names)
            if wanted > held:
                raise ConfigMismatchError(
                    f"{self._count_fields({group}, names)}: {_layers(wanted)}, and "
                    f"{self._label} leaf {leaf.maxtext!r} holds {held} in the places of its "
                    f"{self.layout.describe()} and its remainder. Pass the config.json of this "
                    f"model (--config)."
                )
            for slot in self._slots(leaf, names):
                if slot.grid:
                    self._check_stack(leaf, flat, prefix + slot.path, slot.grid, wanted, names)
                else:
                    _take(flat, prefix + slot.path, self._label)

    def _check_none_left_out(self, flat: dict[str, Any], prefix: str, names: dict) -> None:
        """Refuses a config whose ``when:`` leaves out a leaf the target tree holds (a tied
        output layer, by tie_word_embeddings true): converting would drop it silently."""
        active = self._active(names)
        taken = {path for leaf in active for path in self._paths(leaf, names)}
        for leaf in self.leaves:
            if leaf in active:
                continue
            held = [p for p in self._paths(leaf, names) if p not in taken and prefix + p in flat]
            if held:
                raise ConfigMismatchError(
                    f"{self._label} leaf {held[0]!r} is in the checkpoint, and recipe "
                    f"{self.name!r} leaves it out with this config (when: {leaf.when}; "
                    f"{_fields_shown(leaf.when, names)}): converting would lose it. Pass the "
                    f"config.json it was converted from (--config)."
                )

    def _paths(self, leaf: Leaf, names: dict[str, Any]) -> list[str]:
        if leaf.group is None:
            return [leaf.maxtext]
        return [slot.path for slot in self._slots(leaf, names)]

    def _check_stack(
        self, leaf: Leaf, flat: dict, path: str, grid: tuple[int, ...], wanted: int, names: dict
    ) -> None:
        """The layer axes of the stacked leaf at `path` hold `grid` (of the group's `wanted`):
        (layers,) on the layer axis, or (blocks, positions) from it on."""
        stacked = _take(flat, path, self._label)
        axis = leaf.layer_axis
        if not grid_fits(stacked, grid, axis):
            layers = math.prod(grid)
            end = axis + len(grid)
            held = (
                "no"
                if stacked.ndim < end
                else " x ".join(map(str, stacked.shape[axis:end]))
                if len(grid) > 1
                else stacked.shape[axis]
            )
            shown = f"{' x '.join(map(str, grid))} = {layers}" if len(grid) > 1 else layers
            part = f", {shown} of them in {path!r}" if layers != wanted or len(grid) > 1 else ""
            where = f"axis {axis}" if len(grid) == 1 else f"axes {axis}-{end - 1}"
            raise ConfigMismatchError(
                f"{self._count_fields({leaf.group}, names)}: {_layers(wanted)}{part}, and "  # type: ignore[arg-type]
                f"{self._label} leaf {path.removeprefix(self._root)!r} holds {held} (shape "
                f"{stacked.shape}, layers on {where}). Pass the config.json of this model "
                f"(--config)."
            )

    def _restored(self, leaf: Leaf, array: LazyArray, names: dict) -> LazyArray:
        for operation in reversed(leaf.operations):
            array = operation.backward(array, names)
        return array

    def _active(self, names: dict[str, Any]) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.when is None or evaluate(leaf.when, names)]

    def operations_table(self, config: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(target leaf, HF tensor, operations) rows, for plans and `suture recipes`."""
        names = self.config_names(config)
        return [
            (
                leaf.maxtext,
                " + ".join(leaf.sources()) if leaf.made is None else "-",
                ", ".join(
                    [
                        *([leaf.made.describe()] if leaf.made is not None else []),
                        *_stacking(leaf, self.scanned),
                        *([leaf.interleave.describe()] if leaf.interleave else []),
                        *(op.describe(names) for op in leaf.operations),
                        *(["stacked on axis 0"] if leaf.stacked and not leaf.interleave else []),
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


def _unscanned(maxtext_path: str, index: int | str) -> str:
    """``decoder/layers/x`` -> ``decoder/layers_3/x`` (and ``moe_layers`` -> ``moe_layers_3``);
    a Tunix path names its layer (``layers/{layer}/x`` -> ``layers/3/x``)."""
    if "{" in maxtext_path:
        return re.sub(r"\{\w+\}", str(index), maxtext_path, count=1)
    return re.sub(r"^decoder/(\w*layers)/", rf"decoder/\g<1>_{index}/", maxtext_path, count=1)


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
            label = f"Built-in family table {entry.name!r}"
            data, _ = parse_yaml(entry.read_text(encoding="utf-8"), label, "a table", RecipeError)
            if data.get("target", "maxtext") != target:
                continue
            for family in data["names"]:
                found[family] = {**data, "source_file": entry.name}
    return found


def _text(expression: Any) -> str:
    """An expression as text, keeping an `Expression` (which knows where it is) as it is."""
    return expression if isinstance(expression, str) else str(expression)


def recipe_names() -> list[str]:
    """Every built-in recipe name, e.g. ``llama3.1:maxtext`` or ``qwen3:tunix``."""
    return [
        f"{family}:{layout}"
        for target, layouts in TARGETS.items()
        for family, data in _families(target).items()
        for layout in layouts
        if layout in data.get("layouts", layouts)
    ]


def is_recipe_name(name: str) -> bool:
    if is_family_name(name):  # a family alone, in any case (`resolve_name`)
        return True
    return (
        isinstance(name, str)
        and ":" in name
        and any(name.split(":", 1)[0].lower() in _families(target) for target in TARGETS)
    )


def get_recipe(name: str) -> FamilyRecipe:
    """The built-in recipe `name` (``FAMILY:maxtext``, ``FAMILY:maxtext-unscanned``,
    ``FAMILY:maxtext-multimodal`` or ``FAMILY:tunix``, in any case; a family alone when one
    target takes it)."""
    name = resolve_name(name)
    family, _, layout = name.partition(":")
    target = next((t for t, layouts in TARGETS.items() if layout in layouts), None)
    if target is None or family not in _families(target):
        raise unknown_name(name)
    offered = _families(target)[family].get("layouts", list(TARGETS[target]))
    if layout not in offered:
        raise RecipeError(
            f"No built-in recipe {name!r}: {family} has the layout(s) "
            f"{', '.join(f'{family}:{o}' for o in offered)} only (as its target's model has it)."
        )
    if target == "maxtext-multimodal":
        from ._whole import whole_recipe

        return whole_recipe(family, _families(target)[family], _parse)
    return _parse(family, _families(target)[family], TARGETS[target][layout])


def _parse(family: str, data: dict[str, Any], scanned: bool) -> FamilyRecipe:
    where = data["source_file"]
    data = checked_table(data, where)  # the whole table against the schema, once
    group_specs = data.get("layer_groups") or {
        "layer": {"count": "num_hidden_layers", "hf_index": "i"}
    }
    groups = {
        name: LayerGroup(
            _text(spec["count"]), _text(spec["hf_index"]), spec.get("unscanned") == "hf_index"
        )
        for name, spec in group_specs.items()
    }
    target = data.get("target", "maxtext")
    scan_axis = data.get("layer_axis", FLAX_SCAN_AXIS if target == "flax" else SCAN_AXIS)
    leaves = []
    for number, item in enumerate(data["leaves"]):
        if isinstance(item, dict) and "make" in item and target in item:
            made = parse_made(item["make"], f"{where}: leaf {item[target]!r}")
            leaves.append(Leaf(item[target], "", made.layers, (), item.get("when"), made=made))
            continue
        if isinstance(item, dict) and "hf" not in item and isinstance(item.get("fused"), dict):
            item = {**item, "hf": item["fused"].get("hf"), "always_fused": True}  # fused only
        if not isinstance(item, dict) or not {target, "hf"} <= set(item):
            raise RecipeFormatError(
                f"{where}: leaf {number} needs {target!r} and 'hf' (or 'fused')."
            )
        stacked = tuple(item["hf"]) if isinstance(item["hf"], list) else ()
        first = stacked[0] if stacked else item["hf"]
        group = next((g for g in groups if f"{{{g}}}" in str(first)), None)
        context = f"{where}: leaf {item[target]!r}"
        operations = tuple(parse_operation(op, context) for op in item.get("ops", []))
        axes = item.get("axes") or {}
        experts = "{expert}" in str(first)
        if experts and (group is None or "experts" not in data):
            raise RecipeFormatError(
                f"{context}: {{expert}} needs a layer placeholder beside it and a top-level "
                f"'experts' (the count, e.g. num_local_experts)."
            )
        routed = not experts and "expert" in axes
        if routed and "experts" not in data:
            raise RecipeFormatError(
                f"{context}: 'axes: {{expert: N}}' needs a top-level 'experts' (the count)."
            )
        leaves.append(
            Leaf(
                item[target],
                first,
                group,
                operations,
                item.get("when"),
                stacked=stacked,
                experts=experts,
                expert_axis=int(axes.get("expert", 0)),
                routed=routed,
                layer_axis=int(axes.get("layer", scan_axis)),
                fused=parse_fused(item["fused"], context) if "fused" in item else None,
                always_fused=bool(item.get("always_fused")),
                interleave=parse_interleave(item["interleave"], len(stacked), context)
                if "interleave" in item
                else None,
            )
        )
    config = data.get("config", {})
    defaults = dict(config.get("defaults") or {})
    checks = tuple(config.get("checks") or ())
    experts_count = _text(data["experts"]) if "experts" in data else None
    period = str(data["layer_period"]) if "layer_period" in data else None
    layout = None
    if period is not None:
        under = data.get("layer_blocks_under")
        layout = LayerLayout(
            period, parse_blocks(data.get("layer_blocks")), f"{under}/" if under else SCANNED
        )
    expressions: list[Any] = [check["test"] for check in checks]
    expressions += [text for group in groups.values() for text in (group.count, group.hf_index)]
    expressions += [e for e in (experts_count, period) if e is not None]
    layer_sets = tuple((data.get("layer_sets") or {}).items())
    expressions += [expression for _, expression in layer_sets]
    for leaf in leaves:
        expressions += [leaf.when or 0, *(e for op in leaf.operations for e in op.expressions())]
        expressions += list(leaf.made.expressions() if leaf.made is not None else ())
        expressions += leaf.interleave.expressions() if leaf.interleave else []
    read = set()
    for expression in expressions:
        read |= names_in(expression)
    default_inputs: dict[str, set[str]] = {}
    for field, default in defaults.items():
        for name in names_in(default):
            default_inputs.setdefault(name, set()).add(field)
    fields = set(defaults) | set(config.get("require") or {}) | read | set(default_inputs)
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
        experts=experts_count,
        layout=layout,
        language_model=parse_language_model(data.get("language_model"), where),
        layer_patterns=tuple(
            (field, tuple(pattern)) for field, pattern in (data.get("layer_patterns") or {}).items()
        ),
        layer_sets=layer_sets,
        per_layer=tuple((config.get("per_layer") or {}).items()),
        default_inputs={
            name: frozenset(users)
            for name, users in default_inputs.items()
            if name not in read and name not in defaults
        },
    )
