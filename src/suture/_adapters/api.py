"""LoRA adapters between JAX trees and PEFT folders, and an adapter merged into its base.

- `export_adapter`: the LoRA pairs of a JAX tree (Flax NNX, qwix/Tunix) -> a PEFT folder,
  each factor through the family recipe's operations (`factors`).
- `import_adapter`: a PEFT folder -> the JAX tree of qwix factors (``<weight>_lora_a``,
  ``<weight>_lora_b``) in the recipe's layout.
- `merged_with_adapter`: an HF tree with a PEFT adapter merged in, lazily, as peft's
  ``merge_and_unload`` computes it after ``PeftModel.from_pretrained``: its LoRA weights
  take the base weight's dtype, float32 for a bfloat16 or float16 base (peft's
  ``autocast_adapter_dtype``), whatever dtype the folder stores them in; ``w + (B @ A) *
  scaling`` in that dtype, rounded once to the weight's.

Scaling: PEFT applies ``lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``). NNX's LoRA
applies none, so its export says ``lora_alpha = r``; qwix applies ``alpha / r`` with the
alpha of its ``LoraProvider``, which a checkpoint does not record (``lora_alpha=``).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from .._errors import ArgumentError, ConfigMismatchError, UnsupportedError
from .._lazy.array import LazyArray, as_lazy
from .._paths import flatten, unflatten
from .._save.api import SaveResult, save
from ..families import _tunix as tunix
from ..families._convert import FAMILY_KEY, _config_beside, read_config
from ..families._file import family_recipe
from ..sources.open import open as open_checkpoint
from . import factors
from .pairs import NNX, found_pairs, weight_path
from .peft_folder import Adapter
from .peft_folder import read as read_adapter
from .peft_folder import write as write_adapter


def leaf_table(
    recipe: Any, names: dict[str, Any], scanned: set[str] | None = None
) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """``{target path: (HF module, operations)}`` of the recipe's plain linear leaves: one
    HF tensor each (no experts, no stacked or fused tensors), per layer (unscanned). The HF
    modules of leaves stacked on a scan axis go to `scanned`."""
    table = {}
    for leaf in recipe._active(names):
        if leaf.experts or leaf.stacked or leaf.fused is not None or leaf.routed:
            continue
        if not leaf.hf.endswith(".weight") or "embed_tokens" in leaf.hf:
            continue  # a bias, a norm's scale; PEFT's embedding LoRA is another format
        if leaf.group is None:
            table[leaf.maxtext] = (leaf.hf.removesuffix(".weight"), leaf.operations)
            continue
        for slot in recipe._slots(leaf, names):
            if slot.grid:  # layers stacked on a scan axis: no per-layer factors
                if scanned is not None:
                    scanned.update(
                        leaf.hf_name(None, i).removesuffix(".weight") for i in slot.indices
                    )
                continue
            (index,) = slot.indices
            module = leaf.hf_name(None, index).removesuffix(".weight")
            table[slot.path] = (module, leaf.operations)
    return table


def _joined_modules(recipe: Any, names: dict[str, Any]) -> dict[str, str]:
    """``{HF module: target leaf}`` of the tensors a leaf joins with others (stacked,
    interleaved): no LoRA pair of their own there."""
    joined = {}
    for leaf in recipe._active(names):
        if not leaf.stacked or leaf.experts:
            continue
        indices = recipe._layer_indices(leaf.group, names) if leaf.group else [None]
        for index in indices:
            for name in leaf.sources(index):
                joined[name.removesuffix(".weight")] = leaf.maxtext
    return joined


def _settings(
    recipe_name: str, source: Any, config: Any, like: Any, recorded: Any
) -> dict[str, Any]:
    if config is not None:
        return read_config(config)
    if like is not None:
        return _config_beside(like, recipe_name)
    if isinstance(recorded, dict) and isinstance(recorded.get("config"), dict):
        return recorded["config"]
    return _config_beside(source, recipe_name)


def export_adapter(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    recipe_name: str,
    *,
    config: Any = None,
    like: Any = None,
    lora_alpha: float | None = None,
    overwrite: bool = False,
) -> SaveResult:
    """The LoRA pairs of the JAX checkpoint `source` as a PEFT folder at `destination`."""
    started = time.perf_counter()
    recipe = family_recipe(recipe_name)
    if recipe.target == "tunix":
        source = tunix.model_params(source)
    ckpt = open_checkpoint(source, separator=".")
    recorded = (
        ckpt.custom_metadata.get(FAMILY_KEY) if isinstance(ckpt.custom_metadata, dict) else None
    )
    names = recipe.config_names(_settings(recipe_name, source, config, like, recorded))
    root = f"{recipe._root}"
    flat = {}
    for path, leaf in flatten(ckpt.tree).items():
        path = path.removesuffix("/value")
        flat[path.removeprefix(root) if root and path.startswith(root) else path] = leaf
    pairs = found_pairs(flat)
    if not pairs:
        raise ArgumentError(
            f"{str(source)!r} holds no LoRA pairs (qwix's <weight>_lora_a/_lora_b, NNX's "
            f"lora_a/lora_b). Export a checkpoint of a model trained with LoRA."
        )
    styles = {pair.style for pair in pairs}
    if len(styles) > 1:
        raise UnsupportedError(
            f"{str(source)!r} holds LoRA pairs of NNX and of qwix, which scale differently; "
            f"one PEFT folder has one lora_alpha. Export them separately."
        )
    table = leaf_table(recipe, names)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for pair in pairs:
        path = weight_path(pair, table)
        module, operations = table[path]
        a, b = (np.asarray(as_lazy(x, path=pair.a_path).read()) for x in (pair.a, pair.b))
        out[module] = factors.to_hf(operations, names, a, b, f"LoRA pair of {path!r}")
    rank = {a.shape[0] for a, _ in out.values()}.pop()
    if styles == {NNX}:
        if lora_alpha is not None:
            raise ArgumentError(
                f"{str(source)!r} holds Flax NNX LoRA pairs, which apply no scale: the export "
                f"writes lora_alpha = r = {rank} so that PEFT applies none either. Leave out "
                f"lora_alpha= (--lora-alpha); it is qwix's."
            )
        alpha = float(rank)
    elif lora_alpha is None:
        raise ArgumentError(
            f"{str(source)!r} holds qwix LoRA pairs ({pairs[0].a_path!r} ...), scaled by "
            f"alpha / rank, and a checkpoint does not record alpha. Pass it (--lora-alpha, "
            f"lora_alpha= in Python): the alpha of the qwix LoraProvider the model was trained "
            f"with."
        )
    else:
        alpha = tunix.checked_alpha(lora_alpha)
    base = str(like) if like is not None else names.get("_name_or_path") or None
    adapter = Adapter(out, alpha, False, base)
    written = write_adapter(adapter, destination, overwrite=overwrite)
    nbytes = sum(a.nbytes + b.nbytes for a, b in out.values())
    return SaveResult(written, "peft", nbytes, 2 * len(out), time.perf_counter() - started)


def import_adapter(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    recipe_name: str,
    *,
    config: Any = None,
    overwrite: bool = False,
    progress: bool | None = None,
) -> SaveResult:
    """The PEFT folder `source` as qwix factors in the recipe's layout (an Orbax tree).

    qwix applies ``alpha / r``: with its LoraProvider's ``alpha`` = the folder's
    ``lora_alpha`` the model computes what PEFT does; an rslora adapter's extra
    ``sqrt(r)`` is folded into ``b``.
    """
    if config is None:
        raise ArgumentError(
            f"A PEFT folder has no config.json, and recipe {recipe_name!r} needs the base "
            f"model's (head counts, head_dim). Pass it: --config BASE/config.json (config= "
            f"in Python)."
        )
    recipe = family_recipe(recipe_name)
    names = recipe.config_names(read_config(config))
    adapter = read_adapter(source)
    scanned: set[str] = set()
    table = leaf_table(recipe, names, scanned)
    by_module = {module: (path, ops) for path, (module, ops) in table.items()}
    joined = _joined_modules(recipe, names)
    tree: dict[str, Any] = {}
    for module, (lora_a, lora_b) in adapter.pairs.items():
        if module in joined and module not in by_module:
            raise UnsupportedError(
                f"Adapter pair of {module!r}: recipe {recipe.name!r} joins "
                f"{module + '.weight'!r} with other tensors into leaf {joined[module]!r}, "
                f"and LoRA factors go with leaves of one linear weight. Merge the adapter "
                f"into its base instead (--merge-adapter), which any leaf takes."
            )
        if module in scanned and module not in by_module:
            raise UnsupportedError(
                f"Adapter pair of {module!r}: recipe {recipe.name!r} stacks its layers on a "
                f"scan axis, and LoRA factors are per layer. Import with the recipe's "
                f"unscanned layout (`suture recipes` lists them: "
                f"'{recipe.name.split(':')[0]}:maxtext-unscanned')."
            )
        if module not in by_module:
            near = ", ".join(sorted(by_module)[:4])
            raise ConfigMismatchError(
                f"Adapter pair of {module!r}: recipe {recipe.name!r} has no linear weight "
                f"{module + '.weight'!r} (it has {near}, ...). Import with the recipe of "
                f"the adapter's base model, and its config.json."
            )
        path, operations = by_module[module]
        if adapter.use_rslora:  # qwix scales by alpha / r; PEFT by alpha / sqrt(r)
            lora_b = (lora_b.astype(np.float32) * np.float32(math.sqrt(lora_a.shape[0]))).astype(
                lora_b.dtype
            )
        try:
            a, b = factors.to_target(operations, names, lora_a, lora_b)
        except ConfigMismatchError as error:  # the factors say no name: say the pair's
            raise ConfigMismatchError(f"Adapter pair of {module!r}: {error}") from None
        wrap = (lambda x: {"value": x}) if recipe.target == "tunix" else (lambda x: x)
        tree[f"{recipe._root}{path}_lora_a"] = wrap(a)
        tree[f"{recipe._root}{path}_lora_b"] = wrap(b)
    return save(
        unflatten(tree),
        destination,
        format="orbax",
        overwrite=overwrite,
        progress=progress,
    )


def merged_with_adapter(tree: Any, adapter_folder: str | os.PathLike) -> Any:
    """`tree` (an HF model's, nested by ``.``) with the PEFT adapter merged, lazily."""
    adapter = read_adapter(adapter_folder)
    flat = flatten(tree)
    for module, (lora_a, lora_b) in adapter.pairs.items():
        path = module.replace(".", "/") + "/weight"
        stored = sorted(p for p in flat if p.startswith(path + "_"))  # weight_packed, _scale
        if path not in flat and stored:
            _refuse_quantized(module, stored[0].replace("/", "."), "stored packed")
        if path not in flat:
            near = ", ".join(sorted(p.replace("/", ".") for p in flat)[:4])
            raise ConfigMismatchError(
                f"Adapter pair of {module!r}: the base has no tensor {module + '.weight'!r} "
                f"(it has {near}, ...). Merge the adapter into the model it was trained on."
            )
        weight = as_lazy(flat[path], path=module + ".weight")
        if weight.dtype.name not in PLAIN_FLOATS:
            _refuse_quantized(module, module + ".weight", weight.dtype.name)
        if weight.shape != (lora_b.shape[0], lora_a.shape[1]):
            raise ConfigMismatchError(
                f"Adapter pair of {module!r}: B @ A is {(lora_b.shape[0], lora_a.shape[1])}, "
                f"and the base's {module + '.weight'!r} is {weight.shape}. The adapter belongs "
                f"to another model."
            )
        flat[path] = merged_weight(weight, lora_a, lora_b, adapter.scaling(lora_a.shape[0]))
    return unflatten(flat)


PLAIN_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _refuse_quantized(module: str, tensor: str, found: str) -> None:
    raise UnsupportedError(
        f"Adapter pair of {module!r}: the base's {tensor!r} is {found}, a quantized weight "
        f"(its values need their scales); a LoRA delta added to its stored codes would be "
        f"lost or wrong. Read the base dequantized: --dequantize (dequantize=True), or "
        f"convert with a family recipe, which dequantizes as it reads."
    )


def merged_weight(
    weight: LazyArray, lora_a: np.ndarray, lora_b: np.ndarray, scaling: float
) -> LazyArray:
    """``weight + (B @ A) * scaling`` as peft's merge computes it (see the module), by
    blocks of rows: a block reads its rows of the weight and of ``B``, and all of ``A``."""
    from .._lazy.compute import ComputeNode
    from .._lazy.graph import MemorySource
    from .._lazy.products import chunked_matmul

    # peft's LoRA weights are the base's dtype (float32 for a half base: its default
    # autocast_adapter_dtype), the folder's values cast to it: the delta is never rounded
    # to a bfloat16 or float16 the folder stores
    work = _wide(weight.dtype)
    factor = work.type(scaling)
    b_node, a_node = MemorySource(lora_b.astype(work)), MemorySource(lora_a.astype(work))

    def merged(w: np.ndarray, b: np.ndarray, a: np.ndarray) -> np.ndarray:
        delta = chunked_matmul(b, a)  # in this thread: see chunked_matmul
        delta *= factor
        total = w.astype(work)  # torch adds a half weight and a float32 delta in float32
        total += delta
        return total

    node = ComputeNode(
        merged,
        [weight.node, b_node, a_node],
        [(0, 1), (0, None), (None, 1)],
        weight.shape,
        weight.dtype,
        "merge LoRA",
    )
    return LazyArray(node, weight.path)


def _low(dtype: np.dtype) -> bool:
    return dtype.kind == "V" or dtype == np.float16


def _wide(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if _low(dtype) else np.dtype(dtype)
