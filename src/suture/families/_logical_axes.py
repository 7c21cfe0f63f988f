"""MaxText's logical axes of a family table's leaves, and the sharding rules they make.

A MaxText table may carry ``logical_axes``: for each of its leaves (by its ``maxtext`` path),
the logical axis names MaxText's model code gives that parameter in the scanned layout (what
``nn.get_partition_spec`` of the model MaxText builds says), e.g.

```yaml
logical_axes:
  decoder/layers/mlp/wi_0/kernel: [embed, layers, mlp]
  token_embedder/embedding: [vocab, embed_vocab]
```

With MaxText's default ``logical_axis_rules`` (`MAXTEXT_AXIS_RULES`) they give each leaf its
`PartitionSpec` on a mesh, so ``suture convert HF OUT --recipe llama3.1:maxtext --mesh
fsdp=8,tensor=2`` needs no ``--sharding`` file. An array whose layers are not stacked (the
unscanned layout, a layout's remainder layers) has the same axes without the layer axis, as
MaxText's unscanned model does; a block's nested stack (Gemma 4's, Qwen3-Next's) has
MaxText's ``local_layers`` after the layer axis. A tower table (``target: maxtext-multimodal``)
gives its leaves' axes as MaxText has them, a tower being never scanned; a whole multimodal
recipe on a mesh needs them (`tower_axes`).

Example:
    >>> schema_problems({"a/kernel": ["embed", "mlp", "mlp"]})
    [('logical_axes.a/kernel', "names an axis twice: ['embed', 'mlp', 'mlp']")]
    >>> leaf_axes(("embed", "layers", "mlp"), 0, 1)  # one layer of the scanned leaf
    ('embed', 'mlp')
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .._errors import ArgumentError
from .._format import first_and_more
from .._paths import flatten
from .._sharding import ShardingRules
from ._collections import root_of
from ._layout import REMAINDER

# MaxText 0.2.5's logical_axis_rules as its config has them for a model of its own (base.yml,
# after pyconfig): bench/maxtext_sharding.py reads them from MaxText and checks these are they.
MAXTEXT_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("circular_repeats", ()),
    ("activation_embed_and_logits_batch", ("data", "stage", "fsdp", "fsdp_transpose", "expert")),
    (
        "activation_embed_and_logits_batch_sequence",
        ("data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert"),
    ),
    ("activation_vocab", ("tensor", "tensor_sequence")),
    ("activation_vocab", ("tensor",)),
    ("activation_vocab", "tensor_sequence"),
    ("vocab", ("tensor", "tensor_sequence", "autoregressive")),
    ("embed_vocab", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("activation_batch_attn", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("activation_input_length_attn", ("tensor_sequence", "context")),
    ("activation_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("activation_kv_heads", ("tensor", "tensor_sequence")),
    ("activation_length_attn", ("context", "context_usp_ulysses")),
    ("activation_q_length", ("context", "context_usp_ulysses")),
    ("activation_kv_length", ()),
    ("activation_embed_attn", ("tensor",)),
    ("activation_kv", ("tensor", "tensor_sequence")),
    ("activation_kv_batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("activation_kv_head_dim", ("tensor", "tensor_sequence")),
    ("heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("q_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("kv_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("qkv", ()),
    ("kv", ()),
    ("kv_head_dim", ()),
    ("q_lora", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("q_lora", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("q_lora_up_proj", ()),
    ("kv_lora", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("kv_lora", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("kv_lora_up_proj", ()),
    ("embed_attn", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("activation_batch_moe", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("activation_length_moe", ("context", "context_usp_ulysses")),
    ("activation_norm_length_moe", ("tensor_sequence", "context", "context_usp_ulysses")),
    ("activation_embed_moe", ("tensor",)),
    ("activation_mlp_moe", ("tensor", "tensor_sequence")),
    ("activation_exp", ("expert",)),
    ("exp", "expert"),
    ("mlp_moe", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("embed_moe", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses")),
    ("embed_moe", ("fsdp", "context", "context_usp_ulysses")),
    ("embed_router", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses")),
    ("embed_router", ("fsdp", "context", "context_usp_ulysses")),
    ("segment_ids_batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("activation_mlp", ("tensor", "tensor_sequence")),
    ("activation_batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("activation_length", ("context", "context_usp_ulysses")),
    ("activation_norm_length", ("tensor_sequence", "context", "context_usp_ulysses")),
    ("activation_embed", ("tensor",)),
    ("activation_stage", "stage"),
    ("mlp", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("gdn_head", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("embed", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("embed", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("norm", ("tensor",)),
    ("layers", "stage"),
    ("diloco", "diloco"),
    ("engram_dim", ("tensor",)),
    ("dense_layers", ()),
    ("moe_layers", ()),
    ("local_layers", ()),
    ("mhc", ()),
    ("prefill_activation_length", ("context", "context_usp_ulysses")),
    ("prefill_activation_norm_length", ("tensor_sequence", "context", "context_usp_ulysses")),
    ("activation_prefill_kv_batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("decode_batch", ("data", "fsdp", "fsdp_transpose", "expert")),
    ("decode_length", ()),
    ("cache_heads", ("autoregressive", "tensor", "tensor_sequence")),
    ("paged_kv_heads", ("tensor",)),
    ("cache_batch_prefill", ()),
    ("cache_batch", ()),
    ("cache_heads_none", ()),
    ("cache_kv", ()),
    ("cache_sequence", ()),
    ("num_pages", ()),
    ("tokens_per_page", ()),
    ("paged_kv_head_dim_size", ()),
    ("mlp_no_fsdp", ("tensor", "tensor_sequence", "autoregressive")),
    ("exp_with_fsdp", "fsdp"),
)


# The logical axis of the layers stacked within each block of a nested scan (MaxText 0.2.5's
# models/gemma4.py and models/qwen3.py, nnx_scan metadata_axis_name).
INNER_AXIS = "local_layers"


def schema_problems(value: Any, target: str = "maxtext") -> list[tuple[str, str]]:
    """(entry, rule) for each way `value` (a table's ``logical_axes``) breaks the format: a
    mapping of the table's leaf paths to lists of axis names or nulls. An entry of no leaf
    is left alone (a copied table with leaves taken out); a leaf without an entry (a copied
    table with leaves added) matters only on a mesh, where `recipe_rules` names it."""
    if target not in ("maxtext", "maxtext-multimodal"):
        return [("logical_axes", f"are MaxText's; a table of target {target!r} has none")]
    if not isinstance(value, Mapping):
        return [("logical_axes", f"must be a mapping (leaf path: [axes]); got {value!r:.60}")]
    problems = []
    for path, axes in value.items():
        entry = f"logical_axes.{path}"
        if not isinstance(axes, list) or not all(a is None or isinstance(a, str) for a in axes):
            problems.append(
                (entry, f"must be a list of logical axis names or nulls; got {axes!r:.60}")
            )
        elif len({a for a in axes if a is not None}) != len([a for a in axes if a is not None]):
            problems.append((entry, f"names an axis twice: {axes}"))
    return problems


def missing_leaves(value: Mapping[str, Any], leaf_paths: set[str]) -> list[str]:
    """The leaf paths `value` (a table's ``logical_axes``) has no entry for, sorted.

    Example:
        >>> missing_leaves({"a/kernel": ["embed", "mlp"]}, {"a/kernel", "b/scale"})
        ['b/scale']
    """
    return sorted(leaf_paths - set(value))


def leaf_axes(
    axes: tuple[Any, ...], stacked: int, layer_axis: int, inner: bool = False
) -> tuple[Any, ...] | None:
    """The axes of a per-layer array with `stacked` stacked layer axes (1 scanned, 0 one
    layer, 2 a block's nested stack: blocks, then the layers of each), from the table's
    scanned `axes` whose layer axis is `layer_axis`; None where the table's axes cannot say.
    A nested stack's inner axis is MaxText's ``local_layers`` (Gemma 4's and Qwen3-Next's
    blocks), which alone (`inner`) stacks a remainder's layers of a nested place.

    Example:
        >>> leaf_axes(("embed", "layers", "mlp"), 2, 1)
        ('embed', 'layers', 'local_layers', 'mlp')
        >>> leaf_axes(("embed", "layers", "mlp"), 1, 1, inner=True)
        ('embed', 'local_layers', 'mlp')
    """
    if layer_axis >= len(axes):
        return axes if stacked == 1 and not inner else None
    before, after = axes[:layer_axis], axes[layer_axis + 1 :]
    if stacked == 1:
        return before + (INNER_AXIS,) + after if inner else axes
    if stacked == 0:
        return before + after
    if stacked == 2:
        return before + (axes[layer_axis], INNER_AXIS) + after
    return None


def recipe_rules(recipe: Any, config: dict[str, Any], tree: Any) -> ShardingRules:
    """The sharding rules of `tree` (`recipe`'s MaxText tree of a model of `config`): each
    array's spec from the table's ``logical_axes``, under `MAXTEXT_AXIS_RULES`.

    Raises:
        ArgumentError: the table has no logical axes, or they do not fit an array.
    """
    table = dict(getattr(recipe, "logical_axes", ()) or ())
    if not table:
        raise ArgumentError(
            f"Recipe {recipe.name!r} does not know MaxText's logical axes of its leaves (its "
            f"table has no 'logical_axes'); give the sharding with --sharding FILE "
            f"(target_sharding=TargetSharding(mesh, rules))."
        )
    flat = flatten(tree)
    names = recipe.config_names(config)
    root = recipe._root
    leaves: dict[str, tuple[Any, ...]] = {}
    active = recipe._active(names)
    missing = missing_leaves(table, {leaf.maxtext for leaf in active})
    if missing:
        raise ArgumentError(
            f"Recipe {recipe.name!r}: its table's logical_axes have no entry for "
            f"{first_and_more(missing, 3, repr)}, so their shards on the mesh are unknown. Add "
            f"each leaf's MaxText axes to logical_axes ([] for none), or give the sharding with "
            f"--sharding FILE."
        )
    for leaf in active:
        axes = tuple(table[leaf.maxtext])
        base = root_of(leaf.collection) if leaf.collection else root  # a collection's own
        if leaf.group is None:
            slots = [(leaf.maxtext, 1)]  # as the table has it
        else:
            slots = [(slot.path, len(slot.grid)) for slot in recipe._slots(leaf, names)]
        for path, stacked in slots:
            array = flat.get(base + path)
            if array is None or not hasattr(array, "shape"):
                continue
            # a remainder's one stacked axis is a nested place's inner one (unnested, none)
            inner = stacked == 1 and path.startswith(REMAINDER)
            found = leaf_axes(axes, stacked, leaf.layer_axis, inner)
            if found is None or len(found) != len(array.shape):
                raise ArgumentError(
                    f"Recipe {recipe.name!r}: leaf {path!r} has shape {tuple(array.shape)}, "
                    f"but its table's logical_axes {list(axes)} (scanned) do not fit it in "
                    f"this layout. Give the sharding with --sharding FILE."
                )
            leaves[re.escape(base + path)] = found
    leaves.update(tower_axes(recipe, config, flat))
    return ShardingRules(
        tuple(leaves.items()), MAXTEXT_AXIS_RULES, f"Recipe {recipe.name!r}'s logical axes"
    )


def tower_axes(recipe: Any, config: dict[str, Any], flat: dict[str, Any]) -> dict[str, tuple]:
    """{escaped path: axes} of a whole multimodal recipe's tower arrays in `flat`, from the
    tower table's ``logical_axes`` as they are (MaxText never scans a tower); {} for a
    recipe without a tower.

    Raises:
        ArgumentError: the tower's table has no axes, or not for every leaf, or they do not
            fit an array (its arrays would otherwise be replicated, unlike MaxText's).
    """
    tower = getattr(recipe, "tower_recipe", None)
    if tower is None:
        return {}
    from ._recipe import MAXTEXT_ROOT

    table = dict(getattr(tower, "logical_axes", ()) or ())
    names = tower.config_names(recipe._vision(config))
    active = tower._active(names)
    missing = missing_leaves(table, {leaf.maxtext for leaf in active})
    if missing:
        raise ArgumentError(
            f"Recipe {recipe.name!r}: its tower table ({tower.name!r}) has no logical_axes "
            f"for {first_and_more(missing, 3, repr)}, so their shards on the mesh are unknown. "
            f"Give the sharding with --sharding FILE, or convert the language model alone with "
            f"its text recipe."
        )
    leaves = {}
    for leaf in active:
        axes = tuple(table[leaf.maxtext])
        paths = (
            [leaf.maxtext] if leaf.group is None else [s.path for s in tower._slots(leaf, names)]
        )
        for path in paths:
            array = flat.get(f"{MAXTEXT_ROOT}/{path}")
            if array is None or not hasattr(array, "shape"):
                continue
            if len(axes) != len(array.shape):
                raise ArgumentError(
                    f"Recipe {recipe.name!r}: tower leaf {path!r} has shape "
                    f"{tuple(array.shape)}, but its table's logical_axes {list(axes)} do not fit "
                    f"it. Give the sharding with --sharding FILE."
                )
            leaves[re.escape(f"{MAXTEXT_ROOT}/{path}")] = axes
    return leaves
