"""mergekit's config schema: checking each part of a mergekit YAML, field by field.

`MergekitReader` checks ``models``, ``slices``, ``base_model`` and every ``parameters``
block against the merge method's parameters (mergekit's names: ``lambda``, ``weight``,
``nuslerp_flatten`` ...), opening each model once. Every error names the field and its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .._errors import MergeError
from .._location import location_of
from .._location.hub_cache import missing_repo_error
from .._paths import flatten
from ..sources.detect import open_source
from .config import ConfigFile, Key
from .registry import Method, check_value, check_weight

KEYS = ("merge_method", "base_model", "models", "slices", "parameters", "dtype", "out_dtype")
UNSUPPORTED = {
    "modules": "merge each module separately or use slices:",
    "tokenizer_source": "the base (or first) model's tokenizer files are copied as they are "
    "(tokenizer_source: base says just that)",
    "tokenizer": "the base (or first) model's tokenizer files are copied as they are "
    "(tokenizer: {source: base} says just that)",
    "chat_template": "edit tokenizer_config.json of the output instead",
    "residual_weight": "remove it",
}
MERGEKIT_NAMES = {"scale": "lambda", "row_wise": "nuslerp_row_wise", "flatten": "nuslerp_flatten"}
SUTURE_NAMES = {mergekit: suture for suture, mergekit in MERGEKIT_NAMES.items()}
NO_EFFECT = {"int8_mask"}  # a memory option of mergekit; suture's masks are booleans anyway
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


Slice = tuple[list[Source], Key, str | None]


def layer_count(tree: dict[str, Any]) -> int:
    """How many layers a flat tree has (the largest layer number plus one)."""
    indices = [int(m.group("index")) for m in map(LAYER.match, tree) if m is not None]
    return max(indices) + 1 if indices else 0


class MergekitReader:
    """Checks a mergekit config's parts (models, slices, parameters) and opens the models."""

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
            if not location_of(path).exists():
                missing = missing_repo_error(path)  # an 'org/name' in no Hugging Face cache
                raise self.fail(
                    key,
                    str(missing)
                    if missing is not None
                    else f"{entry!r} is not a local model folder or file. Pass a path, a URL "
                    f"(hf://ORG/NAME reads the Hugging Face Hub), or the id of a model in the "
                    f"Hugging Face cache.",
                )
            self.trees[path] = flatten(open_source(path, dequantize="auto").tree)
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
            available = layer_count(self.trees[path])
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
            source.layers = (0, layer_count(source.tree))
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
