"""mergekit's YAML merge configs, read as they are and merged by suture.

Honoured: ``merge_method``, ``base_model``, ``models`` (``model`` and ``parameters``),
``slices`` (``sources`` with ``model``, ``layer_range``, ``parameters``; a slice's
``base_model`` and ``parameters``), top-level ``parameters``, ``dtype`` and ``out_dtype``.
Parameter values may be numbers, gradients (lists interpolated across the layers of a slice,
as mergekit: ``t = i / (n - 1)`` for layer ``i`` of ``n``, 0 outside the layers) and
conditional lists (``- filter: self_attn`` / ``value: ...``, the first filter that is a
substring of the tensor name wins). Anything else is an error naming the field.

Layers are leaves whose path has ``layers/<i>/`` (or ``h``, ``blocks``, ``layer``). Other
leaves come from the first slice's models, except the final norm and the output head
(``norm``, ``ln_f``, ``final``, ``lm_head``), which come from the last slice's, as mergekit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._errors import MergeError
from .._paths import unflatten
from .api import check_model_count, leaf_merge, merge_leaf
from .config import ConfigFile, Key
from .mergekit_schema import (
    KEYS,
    LAYER,
    MERGEKIT_NAMES,
    POST,
    UNSUPPORTED,
    MergekitReader,
    Slice,
    Source,
)
from .registry import get_method
from .task_vectors import TASK_DEFAULTS

NEEDS_WEIGHT = ("linear", "nuslerp", "multislerp", *TASK_DEFAULTS)


@dataclass
class MergekitMerge:
    """A mergekit config read by suture: the lazy merged tree and what the output needs."""

    tree: Any
    models: list[str]
    donor: str
    layers: int | None
    out_dtype: str | None
    text: str
    method: str = ""
    base: str | None = None
    sliced: bool = field(default=False)


def _tokenizer_as_suture_copies(key: str, data: dict[str, Any]) -> bool:
    """Whether `key` asks for what suture does anyway: the base model's tokenizer
    (``tokenizer_source: base``, or ``tokenizer: {source: base}``); with no ``base_model:``
    the first model is the base, as mergekit takes it (``mergekit/tokenizer/build.py``)."""
    value = data[key]
    return (key == "tokenizer_source" and value == "base") or (
        key == "tokenizer" and value == {"source": "base"}
    )


def load_mergekit(config: ConfigFile) -> MergekitMerge:
    """Reads mergekit's schema from `config` and builds the merged lazy tree."""
    data = config.data
    for key in data:
        if key in UNSUPPORTED and _tokenizer_as_suture_copies(key, data):
            continue
        if key in UNSUPPORTED:
            raise MergeError(
                f"{config.where(key)}suture cannot honour {key!r}: {UNSUPPORTED[key]}."
            )
        if key not in KEYS:
            raise MergeError(
                f"{config.where(key)}unknown key {key!r}. mergekit keys: {', '.join(KEYS)}."
            )
    try:
        method = get_method(data.get("merge_method"))
    except MergeError as error:
        raise MergeError(f"{config.where('merge_method')}{error}") from None
    reader = _Merger(config, method)
    for key in ("dtype", "out_dtype"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise MergeError(
                f"{config.where(key)}must be a dtype name such as bfloat16; got {data[key]!r}."
            )
    reader.check_settings(data.get("parameters"), ("parameters",), per_model=False)
    base = (
        reader.model_path(data["base_model"], ("base_model",)) if data.get("base_model") else None
    )
    if ("models" in data) == ("slices" in data):
        raise MergeError(f"{config.where()}give exactly one of models: and slices:.")
    slices = reader.slices(base) if "slices" in data else [reader.models_slice(base)]
    compute = data.get("dtype") or "float32"
    out_dtype = data.get("out_dtype") or data.get("dtype")
    merged: dict[str, Any] = {}
    first, last = slices[0], slices[-1]
    donor_tree = first[0][0].tree
    for path in donor_tree:
        if LAYER.match(path) is None and POST.search(path) is None:
            merged[path] = reader.merge_one(
                path, first, [path] * len(first[0]), 0.0, compute, out_dtype
            )
    count = 0
    for sources, slice_key, slice_base in slices:
        length = sources[0].layers[1] - sources[0].layers[0]
        for offset in range(length):
            t = offset / (length - 1) if length > 1 else 1.0
            for rest in _layer_leaves(sources[0], sources[0].layers[0] + offset):
                out_path, in_paths = None, []
                for source in sources:
                    prefix = _layer_prefix(source)
                    in_paths.append(f"{prefix}{source.layers[0] + offset}{rest}")
                    out_path = out_path or f"{prefix}{count}{rest}"
                merged[out_path] = reader.merge_one(
                    out_path, (sources, slice_key, slice_base), in_paths, t, compute, out_dtype
                )
            count += 1
    for path in last[0][0].tree:
        if LAYER.match(path) is None and POST.search(path) is not None:
            merged[path] = reader.merge_one(
                path, last, [path] * len(last[0]), 0.0, compute, out_dtype
            )
    models = list(dict.fromkeys(source.model for sources, _, _ in slices for source in sources))
    return MergekitMerge(
        unflatten(merged),
        models,
        base or models[0],
        count,
        out_dtype,
        config.text,
        method.name,
        base,
        "slices" in data,
    )


def _layer_prefix(source: Source) -> str:
    for path in source.tree:
        match = LAYER.match(path)
        if match:
            return match.group("prefix")
    raise MergeError(f"Model {source.model!r} has no layers (no leaf path with layers/<i>/).")


def _layer_leaves(source: Source, index: int) -> list[str]:
    rests = []
    for path in source.tree:
        match = LAYER.match(path)
        if match and int(match.group("index")) == index:
            rests.append(match.group("rest"))
    if not rests:
        raise MergeError(
            f"Model {source.model!r} has no layer {index} (layer_range is past its end)."
        )
    return rests


class _Merger(MergekitReader):
    """A checked mergekit config, evaluated tensor by tensor."""

    def lookup(
        self, name: str, source: Source | None, slice_key: Key, tensor: str, t: float
    ) -> Any:
        """A parameter's value for one tensor: the model's own, the slice's, then the global."""
        levels = []
        if source is not None:
            levels.append(source.params)
        if slice_key:
            levels.append(self._dig(slice_key + ("parameters",)) or {})
        levels.append(self.config.data.get("parameters") or {})
        for settings in levels:
            if name in settings:
                value = evaluate(settings[name], tensor.replace("/", "."), t)
                if value is not None:
                    return value
        return None

    def _dig(self, key: Key) -> Any:
        node: Any = self.config.data
        for part in key:
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                return None
        return node

    def merge_one(
        self,
        out_path: str,
        part: Slice,
        in_paths: list[str],
        t: float,
        compute: str,
        out_dtype: str | None,
    ) -> Any:
        sources, slice_key, slice_base = part
        method = self.method
        base_index = None
        if slice_base is not None and method.base != "none":
            base_index = next((i for i, s in enumerate(sources) if s.model == slice_base), None)
            if base_index is None:
                raise self.fail(
                    slice_key + ("sources",) if slice_key else ("base_model",),
                    "the base model is not among this slice's sources.",
                )
        members = [i for i in range(len(sources)) if i != base_index]
        if method.name == "slerp":
            order = [i for i in members if sources[i].model == slice_base] if slice_base else []
            if not order:
                raise self.fail(
                    ("base_model",),
                    "slerp interpolates from base_model (t=0) to the other model; give base_model: as one of the two models.",
                )
            members = order + [i for i in members if i != order[0]]
        missing = [sources[i].model for i, p in enumerate(in_paths) if p not in sources[i].tree]
        if missing:
            raise MergeError(f"Leaf {in_paths[0]!r} is missing from {missing[0]!r}.")
        params: dict[str, Any] = {}
        for name in method.params:
            value = self.lookup(MERGEKIT_NAMES.get(name, name), None, slice_key, out_path, t)
            if value is not None:
                params[name] = value
        weights, own = [], []
        for i in members:
            weight = self.lookup("weight", sources[i], slice_key, in_paths[i], t)
            if weight is None and method.name in NEEDS_WEIGHT:
                raise self.fail(
                    sources[i].key + ("parameters",),
                    f"{method.name} needs a weight for {sources[i].model!r} (tensor {in_paths[i]!r}).",
                )
            weights.append(1.0 if weight is None else weight)
            values = {
                n: self.lookup(n, sources[i], slice_key, in_paths[i], t)
                for n in method.model_params
            }
            own.append({n: v for n, v in values.items() if v is not None})
        check_model_count(method, len(members), base_index is not None)
        plan = leaf_merge(method, params, weights, own, len(members), f"tensor {out_path!r}: ")
        leaves = [sources[i].tree[in_paths[i]] for i in members]
        base_leaf = (
            sources[base_index].tree[in_paths[base_index]] if base_index is not None else None
        )
        return merge_leaf(out_path, plan, leaves, base_leaf, compute, out_dtype)


def evaluate(setting: Any, tensor: str, t: float) -> Any:
    """mergekit's value of `setting` for `tensor` at layer position `t` in [0, 1] (None: unset)."""
    if not isinstance(setting, list):
        return setting
    if all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in setting):
        scaled = t * (len(setting) - 1)
        low = int(scaled)
        high = min(len(setting) - 1, low + 1)
        fraction = scaled - low
        return (1 - fraction) * setting[low] + fraction * setting[high]
    if all(not isinstance(e, (dict, list)) for e in setting):
        return setting[int(t * (len(setting) - 1))]
    for condition in setting:
        pattern = condition.get("filter")
        if pattern is None or pattern == "*" or (tensor and pattern in tensor):
            return evaluate(condition["value"], tensor, t)
    return None
