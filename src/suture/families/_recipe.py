"""A model-family recipe: a table of MaxText (or Tunix) leaves, each with its Hugging Face
source and the invertible operations between them, read from a YAML file of this package.

The same table runs both ways. To MaxText, every HF tensor of a per-layer leaf goes through
the operations and the layers are stacked on MaxText's scan axis (1), or kept as
``layers_{i}`` subtrees when unscanned; a leaf with ``{expert}`` stacks its experts too
(`_experts`). A Tunix table (``target: tunix``) names each layer in its paths
(``layers/{layer}/attn/q_proj/w``). Back to HF, the stack is unstacked and the inverse
operations run in reverse order. Everything stays lazy, so a conversion streams.

Example:
    >>> from suture.families import get_recipe
    >>> recipe = get_recipe("llama3.1:maxtext")
    >>> recipe.family, recipe.scanned
    ('llama3.1', True)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigMismatchError, did_you_mean
from .._lazy.array import LazyArray, as_lazy
from .._lazy.combine import stack as stack_arrays
from .._paths import flatten, unflatten
from .._patterns import compile_pattern, fullmatch
from ._collections import root_of
from ._config_check import config_names, layer_counts
from ._describe import layer_kinds, operations_table
from ._expert_layout import check_experts, expert_count, experts_said, find_expert_layout
from ._experts import FusedSource, check_count, stacked_axes
from ._expr import evaluate
from ._layer_checks import check_hf_layers, unscanned
from ._layout import LayerLayout, Slot, stack_grid
from ._leaf import LayerGroup, Leaf
from ._left_out import left_out, restore
from ._multimodal import LanguageModel, LeftOutWarning, renamed
from ._ops import FitRows
from ._reverse import hf_tensors, restore_cut_rows
from ._shared_targets import check_one_writer
from ._stored_order import like_order

MAXTEXT_ROOT = "params/params"


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
    layer_rules: tuple[tuple[str, tuple[tuple[Any, str], ...]], ...] = ()  # field: (kind, rule)
    # config fields of per-layer overrides, each with its list of kinds (`_layer_config`)
    per_layer: tuple[tuple[str, str], ...] = ()
    table_file: str = ""  # a user's table file: its errors name its leaves and lines
    leave_out: tuple[str, ...] = ()  # patterns of tensors the target has no place for
    # MaxText's logical axes of each leaf (scanned), by its path: `_logical_axes`
    logical_axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @property
    def name(self) -> str:
        if self.target != "maxtext":
            return f"{self.family}:{self.target}"
        return f"{self.family}:{'maxtext' if self.scanned else 'maxtext-unscanned'}"

    def layer_kinds(self) -> list[str]:
        """The per-layer kinds the target fixes in code, as `suture recipes NAME` shows them."""
        return layer_kinds(self)

    def operations_table(self, config: dict[str, Any]) -> list[tuple[str, str, str]]:
        """(target leaf, HF tensor, operations) rows, for plans and `suture recipes`."""
        return operations_table(self, config)

    @property
    def _root(self) -> str:
        return f"{MAXTEXT_ROOT}/" if self.target == "maxtext" else ""

    @property
    def _label(self) -> str:
        if self.target.startswith("maxtext"):
            return "MaxText"
        return {"flax": "Flax"}.get(self.target, "Tunix")

    def config_names(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config's fields with the recipe's defaults filled in, checked against it
        (`_config_check`)."""
        return config_names(self, config)

    def layer_counts(self, names: dict[str, Any]) -> dict[str, int]:
        """How many MaxText layers each layer group has, from the checked config."""
        return layer_counts(self, names)

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
        hf = left_out(hf, self.leave_out, self.name, self._label)
        layout = find_expert_layout(self, hf, names)
        check_hf_layers(self, hf, names, layout)
        used: set[str] = set()
        out: dict[str, Any] = {}
        for leaf in self._active(names):
            root = root_of(leaf.collection) if self.target == "maxtext" else self._root
            for path, value in self._forward(leaf, hf, names, used, layout).items():
                check_one_writer(self.name, path, f"{root}{path}" in out)
                out[f"{root}{path}"] = value
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
            check_experts(
                self,
                leaf,
                array,
                names,
                f"Hugging Face tensor {name!r} (shape {as_lazy(hf[name]).shape}), as {self._label} "
                f"leaf {leaf.maxtext!r},",
            )
        return array

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
                Slot(unscanned(leaf.maxtext, index if by_hf else i), (index,), ())
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
        if leaf.stored is not None:  # either of two axis orders, read in the table's
            array = leaf.stored.read(array, names, self.name)
        if fused is not None:
            if expert is not None:  # the fused tensor's axis 0 holds every expert
                named, count = f"Hugging Face tensor {name!r}", self.expert_count(names)
                check_count(array, 0, count, "experts", named, experts_said(self, names))
            array = fused.take(array, expert, names, name)
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
        """How many experts a MoE layer has, by the checked config (`_expert_layout`)."""
        return expert_count(self, names)

    def expert_layout(self, tree: Any, config: dict[str, Any]) -> str | None:
        """How the HF tree stores experts: ``"per-expert"``, ``"fused"``, or None (no MoE)."""
        hf = _hf_leaves(tree)
        prefix = self._prefix(hf)
        if prefix is not None:  # a multimodal folder: its language model under the table's names
            text = self.language_model.text_prefix(prefix)  # type: ignore[union-attr]
            hf = {renamed(name, prefix, text): leaf for name, leaf in hf.items()}
        return find_expert_layout(self, hf, self.config_names(config))

    def _layer_indices(self, group: str, names: dict[str, Any]) -> list[int]:
        spec = self.groups[group]
        return [
            int(evaluate(spec.hf_index, {**names, "i": i}))
            for i in range(self.layer_counts(names)[group])
        ]

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
        out = hf_tensors(self, tree, config, layout)
        if language_model is not None and prefix is not None:
            out = language_model.from_text(out, prefix)
        if like is not None:
            original = _hf_leaves(like)
            restore_cut_rows(self, original, out, self.config_names(config), prefix)
            restore(self.leave_out, original, out)
            like_order(self, original, out, self.config_names(config), prefix)
            if language_model is not None and prefix is not None:
                language_model.restore_left_out(
                    {name: as_lazy(value, path=name) for name, value in original.items()}, out
                )
        return out

    def _active(self, names: dict[str, Any]) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.when is None or evaluate(leaf.when, names)]


def _hf_leaves(tree: Any) -> dict[str, Any]:
    """HF tensor names (dotted) -> leaves, from a tree opened with the '.' separator."""
    return {path.replace("/", "."): leaf for path, leaf in flatten(tree).items()}
