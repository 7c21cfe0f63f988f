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

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._merge import check_model_count, leaf_merge, merge_leaf
from ._merge_config import ConfigFile, Key
from ._merge_registry import Method, check_value, check_weight, get_method
from ._merge_task import TASK_DEFAULTS, MergeError
from ._paths import flatten, unflatten
from .sources import open_source

KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype")
UNSUPPORTED = {
    "modules": "merge each module separately or use slices:",
    "tokenizer_source": "the base (or first) model's tokenizer files are copied as they are",
    "tokenizer": "the base (or first) model's tokenizer files are copied as they are",
    "chat_template": "edit tokenizer_config.json of the output instead",
    "residual_weight": "remove it",
}
MERGEKIT_NAMES = {"scale": "lambda", "row_wise": "nuslerp_row_wise", "flatten": "nuslerp_flatten"}
SUTURE_NAMES = {mergekit: suture for suture, mergekit in MERGEKIT_NAMES.items()}
NO_EFFECT = {"int8_mask"}  # a memory option of mergekit; suture's masks are booleans anyway
NEEDS_WEIGHT = ("linear", "nuslerp", "multislerp", *TASK_DEFAULTS)
LAYER = re.compile(r"^(?P<prefix>.*?(?:^|/)(?:layers|h|blocks|layer)/)(?P<index>\d+)(?P<rest>/.*)$")
POST = re.compile(r"(lm_head|ln_f|final|(^|/)norm(/|$))")


@dataclass
class Source:
    """One model of a slice: where it is, its layer range, and its own parameters."""

    model: str
    tree: dict[str, Any]
    layers: tuple[int, int]
    params: dict[str, Any]
    key: Key


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


def load_mergekit(config: ConfigFile) -> MergekitMerge:
    """Reads mergekit's schema from `config` and builds the merged lazy tree."""
    data = config.data
    for key in data:
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
    reader = _Reader(config, method)
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


def _layer_count(tree: dict[str, Any]) -> int:
    indices = [int(m.group("index")) for m in map(LAYER.match, tree) if m is not None]
    return max(indices) + 1 if indices else 0


Slice = tuple[list[Source], Key, str | None]


class _Reader:
    """Checks a mergekit config's parts and evaluates its parameters for each tensor."""

    def __init__(self, config: ConfigFile, method: Method) -> None:
        self.config, self.method = config, method
        self.trees: dict[str, dict[str, Any]] = {}
        self.model_names = set(method.model_params) | {"weight"}
        self.global_names = {MERGEKIT_NAMES.get(n, n) for n in method.params} | NO_EFFECT

    def fail(self, key: Key, message: str) -> MergeError:
        return MergeError(f"{self.config.where(*key)}{message}")

    def model_path(self, entry: Any, key: Key) -> str:
        if not isinstance(entry, str) or not entry:
            raise self.fail(key, f"must be a model folder or file (text); got {entry!r}.")
        if "+" in entry:
            raise self.fail(
                key,
                f"{entry!r}: LoRA adapters (model+lora) are not supported; merge the adapter "
                f"into the model first.",
            )
        path = self.config.resolve(entry)
        if path not in self.trees:
            if not Path(path).exists():
                raise self.fail(
                    key,
                    f"{entry!r} is not a local model folder or file; suture does not download "
                    f"models, so download it first (e.g. huggingface-cli download).",
                )
            self.trees[path] = flatten(open_source(path).tree)
        return path

    def check_settings(self, settings: Any, key: Key, per_model: bool) -> dict[str, Any]:
        if settings is None:
            return {}
        if not isinstance(settings, dict):
            raise self.fail(key, f"must be a mapping of parameters; got {settings!r}.")
        allowed = self.model_names if per_model else self.model_names | self.global_names
        for name, setting in settings.items():
            if name not in allowed:
                kind = "a per-model parameter" if per_model else "a parameter"
                raise self.fail(
                    key + (name,),
                    f"{name!r} is not {kind} of {self.method.name}; those are "
                    f"{', '.join(sorted(allowed))}.",
                )
            self._check_setting(name, setting, key + (name,))
        return settings

    def _check_setting(self, name: str, setting: Any, key: Key) -> None:
        if isinstance(setting, list):
            if not setting:
                raise self.fail(key, "an empty list is not a value or gradient.")
            if all(isinstance(item, dict) for item in setting):
                for index, item in enumerate(setting):
                    extra = set(item) - {"value", "filter"}
                    if "value" not in item or extra:
                        raise self.fail(
                            key + (index,),
                            f"a conditional value has value: and optional filter:; got keys {sorted(item)}.",
                        )
                    if item.get("filter") is not None and not isinstance(item["filter"], str):
                        raise self.fail(
                            key + (index, "filter"), f"must be text; got {item['filter']!r}."
                        )
                    self._check_setting(name, item["value"], key + (index, "value"))
                return
            for index, item in enumerate(setting):
                self._check_scalar(name, item, key + (index,))
            return
        self._check_scalar(name, setting, key)

    def _check_scalar(self, name: str, value: Any, key: Key) -> None:
        try:
            if name == "weight":
                check_weight(value, 0)
            elif name in NO_EFFECT:
                if not isinstance(value, bool):
                    raise MergeError(f"{name} must be true or false; got {value!r}.")
            else:
                mapped = SUTURE_NAMES.get(name, name)
                default = {**self.method.params, **self.method.model_params}[mapped]
                check_value(self.method.name, mapped, value, default)
        except MergeError as error:
            raise self.fail(key, str(error).replace("the weight of model 0", "weight")) from None

    def source(self, entry: Any, key: Key, layers: tuple[int, int] | None) -> Source:
        if not isinstance(entry, dict) or "model" not in entry:
            raise self.fail(key, f"must be a mapping with model: (and parameters:); got {entry!r}.")
        extra = set(entry) - {"model", "parameters", "layer_range"}
        if extra:
            raise self.fail(
                key + (sorted(extra)[0],),
                f"unknown key {sorted(extra)[0]!r}; use model:, parameters:{' and layer_range:' if layers is None else ''}.",
            )
        path = self.model_path(entry["model"], key + ("model",))
        params = self.check_settings(entry.get("parameters"), key + ("parameters",), per_model=True)
        if layers is None:
            bounds = entry.get("layer_range")
            if not (
                isinstance(bounds, list)
                and len(bounds) == 2
                and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
                and 0 <= bounds[0] < bounds[1]
            ):
                raise self.fail(
                    key + ("layer_range",),
                    f"must be [first, end) layer numbers, e.g. [0, 16]; got {bounds!r}.",
                )
            layers = (bounds[0], bounds[1])
            available = _layer_count(self.trees[path])
            if layers[1] > available:
                raise self.fail(
                    key + ("layer_range",),
                    f"{list(layers)} is past the {available} layers of {entry['model']!r}.",
                )
        return Source(path, self.trees[path], layers, params, key)

    def models_slice(self, base: str | None) -> Slice:
        entries = self.config.data["models"]
        if not isinstance(entries, list) or not entries:
            raise self.fail(("models",), "must be a list of {model: ..., parameters: ...}.")
        sources = [self.source(entry, ("models", i), (0, 0)) for i, entry in enumerate(entries)]
        if (
            base is not None
            and base not in [s.model for s in sources]
            and self.method.name not in ("slerp", "passthrough")
        ):
            sources.append(Source(base, self.trees[base], (0, 0), {}, ("base_model",)))
        for source in sources:
            source.layers = (0, _layer_count(source.tree))
        lengths = {s.layers[1] for s in sources}
        if len(lengths) > 1:
            raise self.fail(
                ("models",),
                f"the models have different layer counts {sorted(lengths)}; use slices: to pick equal ranges.",
            )
        return sources, (), base

    def slices(self, base: str | None) -> list[Slice]:
        entries = self.config.data["slices"]
        if not isinstance(entries, list) or not entries:
            raise self.fail(("slices",), "must be a list of {sources: [...]}.")
        result = []
        for index, entry in enumerate(entries):
            key: Key = ("slices", index)
            if (
                not isinstance(entry, dict)
                or not isinstance(entry.get("sources"), list)
                or not entry["sources"]
            ):
                raise self.fail(
                    key, "must be a mapping with sources: (a list of model and layer_range)."
                )
            for name in entry:
                if name in UNSUPPORTED:
                    raise self.fail(
                        key + (name,), f"suture cannot honour {name!r}: {UNSUPPORTED[name]}."
                    )
                if name not in ("sources", "base_model", "parameters"):
                    raise self.fail(
                        key + (name,),
                        f"unknown key {name!r}; use sources:, base_model:, parameters:.",
                    )
            self.check_settings(entry.get("parameters"), key + ("parameters",), per_model=False)
            slice_base = (
                self.model_path(entry["base_model"], key + ("base_model",))
                if entry.get("base_model")
                else base
            )
            sources = [
                self.source(s, key + ("sources", i), None) for i, s in enumerate(entry["sources"])
            ]
            lengths = {s.layers[1] - s.layers[0] for s in sources}
            if len(lengths) > 1:
                raise self.fail(
                    key + ("sources",),
                    f"all sources of a slice need the same number of layers; got {sorted(lengths)}.",
                )
            result.append((sources, key, slice_base))
        return result

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
