"""One row of a family table: a target leaf, its Hugging Face source(s) and operations.

`parse_leaf` builds a `Leaf` from a (schema-checked) table entry; `LayerGroup` is one of the
table's layer counters (``layer``, Gemma 2's pairs). Which layers, experts and fused parts a
leaf reads is the leaf's own business (`Leaf.sources`, `Leaf.hf_name`).

Example:
    >>> leaf = parse_leaf(
    ...     {"maxtext": "decoder/layers/mlp/wo/kernel", "hf": "model.layers.{layer}.w"},
    ...     0, {}, "maxtext", ["layer"], "t.yaml")
    >>> leaf.group, leaf.sources(3)
    ('layer', ('model.layers.3.w',))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._experts import FUSED, FusedSource, parse_fused
from ._interleave import Interleave, parse_interleave
from ._made import Made, parse_made
from ._ops import Operation, RecipeFormatError, parse_operation
from ._stored_order import StoredOrder, parse_stored

SCAN_AXIS = 1  # MaxText's param_scan_axis: the layer axis of every scanned tensor


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
    collection: str | None = None  # MaxText's variable collection, when not params (`_collections`)
    stored: StoredOrder | None = None  # the HF tensor is also stored in another axis order

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


def parse_leaf(
    item: Any,
    number: int,
    data: dict[str, Any],
    target: str,
    groups: Any,
    where: str,
    scan_axis: int = SCAN_AXIS,
) -> Leaf:
    """Leaf `number` of a table (`data`, of `target`, with layer `groups`) as a `Leaf`;
    `scan_axis`: where its layers go when scanned, unless it says (``axes: {layer: N}``)."""
    if isinstance(item, dict) and "make" in item and target in item:
        made = parse_made(item["make"], f"{where}: leaf {item[target]!r}")
        return Leaf(item[target], "", made.layers, (), item.get("when"), made=made)
    if isinstance(item, dict) and "hf" not in item and isinstance(item.get("fused"), dict):
        item = {**item, "hf": item["fused"].get("hf"), "always_fused": True}  # fused only
    if not isinstance(item, dict) or not {target, "hf"} <= set(item):
        raise RecipeFormatError(f"{where}: leaf {number} needs {target!r} and 'hf' (or 'fused').")
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
    return Leaf(
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
        collection=item.get("collection"),
        stored=parse_stored(item["stored"], context) if "stored" in item else None,
    )
