"""Merge config files: reading them safely, with every wrong field named with its line.

Two schemas are read: suture's own (``method:``, ``models:`` ...; see `load_merge_config`) and
mergekit's (``merge_method:``; see `suture._merge.mergekit_config`). Both come through `read_config`,
which refuses non-UTF-8 text, files over 1 MiB and YAML aliases, and remembers where each
field is so that errors can say "line 3".
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import MergeError
from .._location import is_remote
from .._location.hub_cache import looks_like_repo_id
from .._surgery.recipes import read_limited
from .._yaml import parse as parse_yaml
from .registry import check_params, check_weight, compile_per_leaf, get_method

MAX_CONFIG_BYTES = 1 << 20
Key = tuple[Any, ...]


@dataclass
class ConfigFile:
    """A parsed config: its data, its folder, and where each field is (``(key, index, ...)``)."""

    path: Path
    data: Any
    lines: dict[Key, int]
    text: str

    def where(self, *key: Any) -> str:
        """``Merge config 'x.yaml', line 3 (models[0]): `` for error messages."""
        line = None
        for depth in range(len(key), -1, -1):
            line = self.lines.get(tuple(key[:depth]))
            if line is not None:
                break
        field = "".join(
            f"[{part}]"
            if isinstance(part, int)
            else f".{part}"
            if str(part).isidentifier()
            else f"[{part!r}]"
            for part in key
        )
        at = f", line {line}" if line is not None else ""
        return f"Merge config {str(self.path)!r}{at} ({field.lstrip('.') or 'top level'}): "

    def resolve(self, entry: str) -> str:
        """A model path as written: a URL, absolute, relative to the working folder or the
        config, or else a Hub model id (``org/name``) read from the Hugging Face cache."""
        if is_remote(entry):
            return entry
        candidate = Path(entry)
        if candidate.is_absolute() or candidate.exists():
            return str(candidate)
        beside = self.path.parent / candidate
        if not beside.exists() and looks_like_repo_id(entry):
            return entry  # opened from the cache, or refused naming the cache folder
        return str(beside)


def read_config(path: str | Path) -> ConfigFile:
    """Parses a YAML or TOML merge config, refusing what cannot be a config."""
    file = Path(path)
    raw = read_limited(
        file, f"Merge config {str(file)!r}", "a merge config", MAX_CONFIG_BYTES, MergeError
    )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise MergeError(
            f"Merge config {str(file)!r}, line {line}: not UTF-8 text (byte {error.start}); "
            f"save it as UTF-8."
        ) from None
    if file.suffix.lower() == ".toml":
        data, lines = _parse_toml(text, file)
    else:
        data, lines = _parse_yaml(text, file)
    if not isinstance(data, dict):
        raise MergeError(
            f"Merge config {str(file)!r} must be a mapping (method: and models:, or mergekit's "
            f"merge_method: and models:)."
        )
    return ConfigFile(file, data, lines, text)


def _parse_yaml(text: str, file: Path) -> tuple[Any, dict[Key, int]]:
    label = f"Merge config {str(file)!r}"
    data, node = parse_yaml(text, label, "a merge config", MergeError)
    lines: dict[Key, int] = {}
    try:
        _walk_yaml(node, (), lines, set())
    except MergeError as error:
        raise MergeError(f"{label}, {error}") from None
    return data, lines


def _walk_yaml(node: Any, key: Key, lines: dict[Key, int], seen: set[int]) -> None:
    import yaml  # a format parser: loaded for YAML files only

    if node is None:
        return
    if id(node) in seen:
        raise MergeError(
            f"line {node.start_mark.line + 1}: YAML aliases (*name) are not "
            f"supported in merge configs; write the value out."
        )
    seen.add(id(node))
    lines.setdefault(key, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for name, value in node.value:
            child = key + (name.value if isinstance(name, yaml.ScalarNode) else str(name),)
            lines[child] = name.start_mark.line + 1
            _walk_yaml(value, child, lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, value in enumerate(node.value):
            _walk_yaml(value, key + (index,), lines, seen)


def _parse_toml(text: str, file: Path) -> tuple[Any, dict[Key, int]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise MergeError(f"Merge config {str(file)!r} cannot be parsed: {error}") from None
    lines: dict[Key, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.match(r"\s*([A-Za-z_][\w-]*)\s*=", line)
        if match:
            lines.setdefault((match.group(1),), number)
    return data, lines


SUTURE_KEYS = (
    "method",
    "models",
    "base",
    "weights",
    "params",
    "model_params",
    "per_leaf",
    "missing",
    "compute_dtype",
    "dtype",
)


def load_merge_config(path: str | Path) -> dict[str, Any]:
    """Reads a suture merge config (YAML or TOML) into `suture.merge`'s arguments.

    Example config::

        method: ties
        models: [finetuned_a, finetuned_b]
        base: base_model
        weights: [0.6, 0.4]
        params: {density: 0.3}
        per_leaf:
          'params/embed.*': {take: 0}
        dtype: bfloat16

    Raises:
        MergeError: naming the field and its line, for a wrong key, type or value.
    """
    config = read_config(path)
    return suture_arguments(config)


def suture_arguments(config: ConfigFile) -> dict[str, Any]:
    """The checked `suture.merge` arguments of a config in suture's own schema."""
    data = dict(config.data)
    unknown = sorted(set(data) - set(SUTURE_KEYS), key=str)
    if unknown:
        raise MergeError(
            f"{config.where(unknown[0])}unknown key {unknown[0]!r}. Keys: "
            f"{', '.join(sorted(SUTURE_KEYS))} (or mergekit's schema, with merge_method:)."
        )
    for required in ("method", "models"):
        if required not in data:
            raise MergeError(f"{config.where()}needs {required}:.")
    try:
        method = get_method(data["method"])
    except MergeError as error:
        raise MergeError(f"{config.where('method')}{error}") from None
    models = data["models"]
    if not isinstance(models, list) or not models:
        raise MergeError(f"{config.where('models')}models: must be a list of checkpoint paths.")
    for index, entry in enumerate(models):
        _need(config, ("models", index), entry, str, "a checkpoint path (text)")
    data["models"] = [config.resolve(entry) for entry in models]
    if data.get("base") is not None:
        _need(config, ("base",), data["base"], str, "a checkpoint path (text)")
        data["base"] = config.resolve(data["base"])
    if "weights" in data:
        _need(config, ("weights",), data["weights"], list, "a list of numbers, one per model")
        for index, weight in enumerate(data["weights"]):
            _checked(config, ("weights", index), lambda w=weight, i=index: check_weight(w, i))
    if "params" in data:
        _need(config, ("params",), data["params"], dict, "a mapping of parameters")
        _checked(config, ("params",), lambda: check_params(method, data["params"]))
    if "model_params" in data:
        _need(config, ("model_params",), data["model_params"], list, "a list of mappings")
        for index, entry in enumerate(data["model_params"]):
            _need(config, ("model_params", index), entry, dict, "a mapping of parameters")
    if "per_leaf" in data:
        _check_per_leaf(config, data["per_leaf"], method)
    for key, choices in (("missing", ("error", "available")),):
        if key in data and data[key] not in choices:
            raise MergeError(
                f"{config.where(key)}{key}: must be one of {choices}; got {data[key]!r}."
            )
    for key in ("compute_dtype", "dtype"):
        if key in data and data[key] is not None:
            _need(config, (key,), data[key], str, "a dtype name such as bfloat16")
    return data


def _check_per_leaf(config: ConfigFile, per_leaf: Any, method: Any) -> None:
    _need(config, ("per_leaf",), per_leaf, dict, "a mapping of {regex: {parameter: value}}")
    for pattern, values in per_leaf.items():
        _need(config, ("per_leaf", pattern), pattern, str, "a regex (text)")
        try:
            compile_per_leaf(pattern)  # the `regex` module, as merging will match it
        except MergeError as error:
            reason = str(error).removeprefix("per_leaf: ")
            raise MergeError(f"{config.where('per_leaf', pattern)}{reason}") from None
        _need(config, ("per_leaf", pattern), values, dict, "a mapping of parameters")
        rest = {k: v for k, v in values.items() if k not in ("take", "weights")}
        _checked(config, ("per_leaf", pattern), lambda rest=rest: check_params(method, rest))


def _need(config: ConfigFile, key: Key, value: Any, kind: type, wanted: str) -> None:
    if not isinstance(value, kind) or (kind is str and not value):
        raise MergeError(f"{config.where(*key)}must be {wanted}; got {value!r}.")


def _checked(config: ConfigFile, key: Key, check: Callable[[], Any]) -> Any:
    try:
        return check()
    except MergeError as error:
        raise MergeError(f"{config.where(*key)}{error}") from None
