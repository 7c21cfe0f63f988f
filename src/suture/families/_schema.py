"""The family-table schema (docs/recipe-tables.md), checked as a whole when a table is loaded.

A table is the user's own YAML: a mapping where a list belongs, a number where a mapping
belongs, a missing ``field``, a ``layer_period`` of 0 would otherwise surface deep in the
conversion as an AttributeError or a ZeroDivisionError. `checked_table` walks every key
once, before anything is built, and raises one `RecipeFormatError` naming the table, each
entry and the rule it breaks. It also compiles the ``ignore`` and ``leave_out`` patterns and
checks every expression's syntax, and hands back the table with each expression an
`Expression` that knows where it is, so that errors computing it later say so too.

Example:
    >>> checked_table({"leaves": [{"maxtext": "a", "hf": "b", "ops": ["transpos"]}]}, "t.yaml")
    Traceback (most recent call last):
    ...
    suture._errors.RecipeError: Family table 't.yaml', leaf 0 ('a'), ops[0]: 'transpos' is not an operation. Did you mean 'transpose'? ...
"""

from __future__ import annotations

import math
import re
from typing import Any

from .._errors import ExpressionError, PatternError, RecipeFormatError, did_you_mean
from .._patterns import compile_pattern
from ._expr import Expression, check
from ._interleave import check_interleave
from ._logical_axes import schema_problems as axes_problems
from ._made import schema_problems as made_problems
from ._shared_targets import exclusive_conditions, shared_path_problem
from ._stored_order import parse_stored
from ._tower import parse_tower

TARGETS = ("maxtext", "tunix", "flax", "maxtext-multimodal")
TOP_KEYS = (
    "names",
    "description",
    "follows",
    "target",
    "config",
    "ignore",
    "leave_out",  # tensors the target has no place for: left out, --like restores them
    "leaves",
    "layer_groups",
    "experts",
    "layer_period",
    "layer_blocks",
    "layer_blocks_under",
    "layer_blocks_from",  # the first layers, left unscanned before the blocks (DeepSeek-V4)
    "layer_patterns",
    "layer_sets",
    "layer_rules",  # per-layer kinds by rule: {field: {kind: expression of i}}
    "language_model",
    "layouts",  # the layouts the target offers (gemma4-small: maxtext-unscanned only)
    "layer_axis",  # the layer axis of every scanned per-layer leaf unless its axes: says
    "text",  # a tower table (maxtext-multimodal): the family table of its language model
    "tower",  # ... and where folders keep the tower (`_tower`)
    "source_file",  # set by the loader: where the table came from
    "logical_axes",  # MaxText's logical axes of each leaf (`_logical_axes`)
)
LEAF_KEYS = (
    "hf",
    "ops",
    "when",
    "fused",
    "axes",
    "always_fused",
    "make",
    "interleave",
    "collection",
    "stored",
)
LAYOUTS = {
    "maxtext": ("maxtext", "maxtext-unscanned"),
    "tunix": ("tunix",),
    "flax": ("flax",),
    # a whole model named by the text's layouts (qwen3-vl:maxtext, `_tables._whole_by_layout`)
    "maxtext-multimodal": ("maxtext-multimodal", "maxtext", "maxtext-unscanned"),
}
WORDS = ("transpose", "interleave_rope")
OPTIONS = {
    "split_axis": ("axis", "sizes"),
    "scale": (
        "multiply",
        "divide",
        "back_multiply",
        "back_divide",
        "compute",
        "back_compute",
        "factor_dtype",
    ),
    "add": (),
    "pad_rows": ("to", "back_to"),
    "fit_rows": ("to", "back_to"),
    "permute": (),
}
COMPUTE = ("float32", "float64")  # scale computes in numpy's own float types
FACTOR_DTYPES = ("bfloat16", "float16", "float32", "float64")
MODES = ("halves", "interleaved")
MAX_AXIS = 32  # past any array's rank (numpy's limit is 64)
MAX_SHOWN = 10  # problems listed in one error
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_LAYERS = re.compile(r"decoder/\w*layers/")  # where MaxText's unscanned layout numbers layers


def checked_table(data: Any, where: str) -> dict[str, Any]:
    """`data` (a loaded table) checked against the schema; its expressions as `Expression`.

    Raises:
        RecipeFormatError: one error listing every entry that breaks a rule.
    """
    table = _Table(where)
    checked = table.top(data)
    if table.problems:
        shown = table.problems[:MAX_SHOWN]
        more = len(table.problems) - len(shown)
        if len(table.problems) == 1:
            text = f"{table.label}, {shown[0]}"
        else:
            listed = "\n".join(f"  - {problem}" for problem in shown)
            text = (
                f"{table.label} breaks {len(table.problems)} rules of the table format:\n{listed}"
                + (f"\n  ... and {more} more" if more else "")
            )
        raise RecipeFormatError(f"{text}\nThe format is docs/recipe-tables.md.")
    return checked


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _only_key(value: Any) -> Any:
    """The one key of a one-key mapping (an operation's word), else None."""
    return next(iter(value)) if isinstance(value, dict) and len(value) == 1 else None


def _whole(value: Any, least: int, most: int) -> bool:
    return type(value) is int and least <= value <= most


class _Table:
    def __init__(self, where: str) -> None:
        self.label = f"Family table {where!r}"
        self.problems: list[str] = []
        self.paths: dict[str, int] = {}  # target path -> its leaf
        self.path_groups: dict[str, set[str | None]] = {}  # target path -> its leaves' groups
        self.path_whens: dict[str, list[Any]] = {}  # target path -> its leaves' conditions
        self.period = False  # whether the table has a layer_period

    def problem(self, entry: str, rule: str) -> None:
        self.problems.append(f"{entry}: {rule}")

    def mapping(self, value: Any, entry: str, keys: tuple[str, ...] | None) -> dict[Any, Any]:
        """`value` when a mapping with only `keys` (any keys when None), else {} and a problem."""
        if not isinstance(value, dict):
            self.problem(entry, f"must be a mapping ({{key: value}}); got {_shown(value)}")
            return {}
        for key in value if keys is not None else ():
            if key not in keys:
                hint = did_you_mean(str(key), keys)
                known = ", ".join(k for k in keys if k != "source_file")
                self.problem(entry, f"unknown key {key!r}.{hint} Known keys: {known}")
        return value

    def listing(self, value: Any, entry: str, empty: bool = True) -> list[Any]:
        if not isinstance(value, list) or (not empty and not value):
            wanted = "a list" if empty else "a non-empty list"
            self.problem(entry, f"must be {wanted} ([...]); got {_shown(value)}")
            return []
        return value

    def text(self, value: Any, entry: str) -> str:
        if not isinstance(value, str) or not value:
            self.problem(entry, f"must be text; got {_shown(value)}")
            return ""
        return value

    def expression(self, value: Any, entry: str) -> Any:
        """An expression (text, a number, true or false) as an `Expression` knowing `entry`."""
        if isinstance(value, int | float):  # true and false too: as text, it knows its place
            if isinstance(value, float) and not math.isfinite(value):
                self.problem(entry, f"must be a finite number; got {value}")
                return 0
            value = repr(value)
        if not isinstance(value, str):
            self.problem(
                entry,
                f"must be an expression of the config (text or a number); got {_shown(value)}",
            )
            return 0
        try:
            check(value)
        except ExpressionError as error:
            self.problem(entry, str(error))
            return 0
        return Expression(value, f"{self.label}, {entry}")

    def pattern(self, value: Any, entry: str) -> None:
        try:
            compile_pattern(value, entry)
        except PatternError as error:
            self.problem(entry, str(error).removeprefix(f"{entry}: "))

    # the table ------------------------------------------------------------------------------

    def top(self, data: Any) -> dict[str, Any]:
        data = self.mapping(data, "the table", TOP_KEYS)
        out = dict(data)
        if "names" in data:
            for i, name in enumerate(self.listing(data["names"], "names", empty=False)):
                self.text(name, f"names[{i}]")
        for key in ("description", "follows"):
            if key in data:
                self.text(data[key], key)
        target = data.get("target", "maxtext")
        if target not in TARGETS:
            self.problem("target", f"must be one of {', '.join(TARGETS)}; got {_shown(target)}")
            target = "maxtext"
        if "config" in data:
            out["config"] = self.config(data["config"])
        for i, pattern in enumerate(self.listing(data.get("ignore") or [], "ignore")):
            self.pattern(pattern, f"ignore[{i}]")
        for i, pattern in enumerate(self.listing(data.get("leave_out") or [], "leave_out")):
            self.pattern(pattern, f"leave_out[{i}]")
        groups = ["layer"]  # without layer_groups (or with {}), one group: every layer
        if data.get("layer_groups") not in (None, {}):
            out["layer_groups"], groups = self.layer_groups(data["layer_groups"])
        if "layouts" in data:
            known = LAYOUTS[target]
            layouts = self.listing(data["layouts"], "layouts", empty=False)
            for layout in layouts:
                if layout not in known:
                    self.problem("layouts", f"{_shown(layout)} is not one of {', '.join(known)}")
        if "experts" in data:
            out["experts"] = self.expression(data["experts"], "experts")
        if "layer_axis" in data and not _whole(data["layer_axis"], 0, 64):
            self.problem(
                "layer_axis",
                f"must be a whole number of at least 0 (the axis the layers are stacked on); "
                f"got {_shown(data['layer_axis'])}",
            )
        if "layer_period" in data and not _whole(data["layer_period"], 1, 1 << 16):
            self.problem(
                "layer_period",
                f"must be a whole number of at least 1 (the layers of one period); got "
                f"{_shown(data['layer_period'])}",
            )
        if data.get("layer_blocks") is not None:
            self.layer_blocks(data["layer_blocks"], data.get("layer_period"))
        if "layer_blocks_under" in data:
            under = data["layer_blocks_under"]
            if not isinstance(under, str) or not re.fullmatch(r"decoder(/[A-Za-z_]\w*)+", under):
                self.problem(
                    "layer_blocks_under",
                    f"must be the path of the decoder's subtree that holds the blocks "
                    f"(decoder/scanned_blocks); got {_shown(under)}",
                )
            elif data.get("layer_blocks") is None:
                self.problem("layer_blocks_under", "needs layer_blocks (the places it holds)")
        if "layer_blocks_from" in data:
            out["layer_blocks_from"] = self.expression(
                data["layer_blocks_from"], "layer_blocks_from"
            )
            if data.get("layer_blocks") is None:
                self.problem("layer_blocks_from", "needs layer_blocks (the blocks it starts)")
        patterns = self.mapping(data.get("layer_patterns") or {}, "layer_patterns", None)
        for field, pattern in patterns.items():
            self.text(field, f"layer_patterns key {field!r}")
            self.listing(pattern, f"layer_patterns.{field}", empty=False)
        sets = self.mapping(data.get("layer_sets") or {}, "layer_sets", None)
        out["layer_sets"] = {
            field: self.expression(rule, f"layer_sets.{field}") for field, rule in sets.items()
        }
        rules = self.mapping(data.get("layer_rules") or {}, "layer_rules", None)
        out["layer_rules"] = {
            field: {
                kind: self.expression(rule, f"layer_rules.{field}.{kind}")
                for kind, rule in self.mapping(kinds, f"layer_rules.{field}", None).items()
            }
            for field, kinds in rules.items()
        }
        if data.get("language_model") is not None:
            self.language_model(data["language_model"])
        self.tower(data, target)
        if "leaves" not in data:
            self.problem("the table", "needs 'leaves': the list of target leaves")
        leaves = self.listing(data["leaves"], "leaves", empty=False) if "leaves" in data else []
        self.period = "layer_period" in data
        out["leaves"] = [self.leaf(leaf, i, target, groups) for i, leaf in enumerate(leaves)]
        if data.get("logical_axes") is not None:
            for entry, rule in axes_problems(data["logical_axes"], target):
                self.problem(entry, rule)
        return out

    def config(self, value: Any) -> dict[str, Any]:
        config = self.mapping(value, "config", ("require", "defaults", "checks", "per_layer"))
        out = dict(config)
        per_layer = self.mapping(config.get("per_layer") or {}, "config.per_layer", None)
        for field, kinds in per_layer.items():
            self.text(field, f"config.per_layer key {field!r}")
            self.text(kinds, f"config.per_layer.{field} (the per-layer list of kinds)")
        require = self.mapping(config.get("require") or {}, "config.require", None)
        for field, allowed in require.items():
            self.text(field, f"config.require key {field!r}")
            self.listing(allowed, f"config.require.{field}", empty=False)
        defaults = self.mapping(config.get("defaults") or {}, "config.defaults", None)
        out["defaults"] = {}
        for field, default in defaults.items():
            self.text(field, f"config.defaults key {field!r}")
            out["defaults"][field] = self.expression(default, f"config.defaults.{field}")
        out["checks"] = []
        for i, check_entry in enumerate(self.listing(config.get("checks") or [], "config.checks")):
            entry = f"config.checks[{i}]"
            item = self.mapping(check_entry, entry, ("field", "test", "message"))
            for key in ("field", "test", "message"):
                if key not in item and isinstance(check_entry, dict):
                    self.problem(entry, f"needs '{key}' (field, test and message)")
            self.text(item.get("field", "-"), f"{entry}.field")
            self.text(item.get("message", "-"), f"{entry}.message")
            test = self.expression(item.get("test", 0), f"{entry}.test")
            out["checks"].append({**item, "test": test})
        return out

    def layer_groups(self, value: Any) -> tuple[dict[str, Any], list[str]]:
        groups = self.mapping(value, "layer_groups", None)
        out = {}
        for name, spec in groups.items():
            entry = f"layer_groups.{name}"
            if not isinstance(name, str) or not name.isidentifier() or name in ("expert", "i"):
                self.problem(entry, "a group's name is a word (not 'expert' or 'i')")
            spec = self.mapping(spec, entry, ("count", "hf_index", "unscanned"))
            for key in ("count", "hf_index"):
                if key not in spec and isinstance(spec, dict):
                    self.problem(entry, f"needs '{key}' (an expression; hf_index of i)")
            if spec.get("unscanned", "hf_index") != "hf_index":
                self.problem(
                    f"{entry}.unscanned", f"can only be hf_index; got {spec['unscanned']!r}"
                )
            out[name] = {
                **spec,
                "count": self.expression(spec.get("count", 0), f"{entry}.count"),
                "hf_index": self.expression(spec.get("hf_index", 0), f"{entry}.hf_index"),
            }
        return out, [name for name in out if isinstance(name, str)]

    def layer_blocks(self, value: Any, period: Any) -> None:
        """``{place: positions}``: each position of the period in one place of the block, a
        place of several positions (a list) stacking them on a second axis."""
        entry = "layer_blocks"
        blocks = self.mapping(value, entry, None)
        if not _whole(period, 1, 1 << 16):
            self.problem(entry, "needs a layer_period (the layers of one block)")
            return
        seen: dict[int, str] = {}
        for place, positions in blocks.items():
            where = f"{entry}.{place}"
            if not isinstance(place, str) or not re.fullmatch(r"[A-Za-z_]\w*", place):
                self.problem(where, "a place is a word (the name of MaxText's subtree)")
            listed = positions if isinstance(positions, list) else [positions]
            if not listed or not all(_whole(p, 0, period - 1) for p in listed):
                self.problem(
                    where,
                    f"must be a position of the period (0 to {period - 1}) or a non-empty list "
                    f"of them; got {_shown(positions)}",
                )
                continue
            for position in listed:
                if position in seen:
                    self.problem(where, f"position {position} is also in {seen[position]!r}")
                seen.setdefault(position, str(place))
        missing = [p for p in range(period) if p not in seen]
        if blocks and missing:
            self.problem(
                entry,
                f"puts no place for position(s) {missing} of the period of {period}: those "
                "layers would be lost",
            )

    def language_model(self, value: Any) -> None:
        entry = "language_model"
        rule = (
            "'language_model' needs {config: text_config, prefixes: [...], leave_out: [patterns]}"
        )
        if (
            not isinstance(value, dict)
            or not isinstance(value.get("config"), str)
            or not isinstance(value.get("prefixes"), list)
            or not value["prefixes"]
            or not all(isinstance(prefix, str) for prefix in value["prefixes"])
        ):
            self.problem(entry, rule)
            return
        self.mapping(
            value, entry, ("config", "prefixes", "leave_out", "causal_lm_prefixes", "outer")
        )
        for i, field in enumerate(self.listing(value.get("outer") or [], f"{entry}.outer")):
            self.text(field, f"{entry}.outer[{i}]")
        causal = self.listing(value.get("causal_lm_prefixes") or [], f"{entry}.causal_lm_prefixes")
        for i, prefix in enumerate(causal):
            self.text(prefix, f"{entry}.causal_lm_prefixes[{i}]")
        leave_out = self.listing(value.get("leave_out") or [], f"{entry}.leave_out")
        for i, pattern in enumerate(leave_out):
            self.pattern(pattern, f"{entry}.leave_out[{i}]")

    def tower(self, data: dict[str, Any], target: str) -> None:
        """A tower table has 'text' and 'tower', and no other table has either."""
        wanted = target == "maxtext-multimodal"
        for key in ("text", "tower"):
            if (key in data) != wanted:
                self.problem(
                    key,
                    f"{'is needed' if wanted else 'is only'} in a tower table (target: maxtext-multimodal)",
                )
        if wanted and "tower" in data:
            try:
                parse_tower(data["tower"], "tower")
            except (RecipeFormatError, PatternError) as error:
                self.problem("tower", str(error).removeprefix("tower: "))

    # one leaf -------------------------------------------------------------------------------

    def leaf(self, item: Any, number: int, target: str, groups: list[str]) -> Any:
        path = item.get(target) if isinstance(item, dict) else None
        entry = f"leaf {number}" + (f" ({path!r})" if isinstance(path, str) else "")
        if not isinstance(item, dict):
            self.problem(
                entry, f"must be a mapping ({{{target}: PATH, hf: NAME}}); got {_shown(item)}"
            )
            return item
        self.mapping(item, entry, (target, *LEAF_KEYS))
        out = dict(item)
        collection = item.get("collection")
        if "collection" in item and (
            target != "maxtext"
            or not isinstance(collection, str)
            or not re.fullmatch(r"[A-Za-z_]\w*", collection)
            or collection == "params"
        ):
            self.problem(
                f"{entry}.collection",
                f"must name a MaxText variable collection other than params (Tid2EidVar), in "
                f"a maxtext table; got {_shown(collection)}",
            )
        if target not in item:
            self.problem(entry, f"needs {target!r} (the {target} path) and 'hf' (or 'fused')")
        elif self.text(path, f"{entry}.{target}"):
            self.target_path(path, item, number, target, groups)
        if "make" in item:
            for rule in made_problems(item["make"]):
                self.problem(f"{entry}.make", rule)
            layers = item["make"].get("layers") if isinstance(item["make"], dict) else None
            if isinstance(layers, str) and layers not in groups:
                self.problem(
                    f"{entry}.make.layers", f"{layers!r} is no layer group ({', '.join(groups)})"
                )
            if "hf" in item or "fused" in item:
                self.problem(entry, "a leaf made with no source ('make') has no 'hf' or 'fused'")
        elif "hf" in item:
            hf = item["hf"]
            names = self.listing(hf, f"{entry}.hf", empty=False) if isinstance(hf, list) else [hf]
            for name in names:
                if self.text(name, f"{entry}.hf"):
                    self.placeholders(name, f"{entry}.hf", groups)
        elif "fused" not in item:
            self.problem(entry, f"needs {target!r} and 'hf' (or 'fused')")
        if "when" in item:
            out["when"] = self.expression(item["when"], f"{entry}.when")
        out["ops"] = [
            self.operation(op, f"{entry}, ops[{i}]")
            for i, op in enumerate(self.listing(item.get("ops") or [], f"{entry}.ops"))
        ]
        if "fused" in item:
            self.fused(item["fused"], f"{entry}.fused", groups)
        if "interleave" in item:
            out["interleave"] = check_interleave(
                self, item["interleave"], f"{entry}.interleave", item
            )
        if "stored" in item:
            out["stored"] = self.stored(item["stored"], f"{entry}.stored")
        axes = self.mapping(item.get("axes") or {}, f"{entry}.axes", ("expert", "layer"))
        for key, axis in axes.items():
            if not _whole(axis, 0, MAX_AXIS):
                self.problem(
                    f"{entry}.axes.{key}", f"must be an axis, 0 to {MAX_AXIS}; got {_shown(axis)}"
                )
        if not isinstance(item.get("always_fused", False), bool):
            self.problem(f"{entry}.always_fused", "must be true or false")
        return out

    def target_path(
        self, path: str, item: dict, number: int, target: str, groups: list[str]
    ) -> None:
        """A target path once per table; a per-layer leaf's says where its layer goes: MaxText's
        under ``decoder/...layers/`` (``layers_3`` unscanned), Tunix's naming it (``{layer}``)."""
        entry = f"leaf {number} ({path!r}).{target}"
        fused, made = item.get("fused"), item.get("make")
        hf = item.get("hf", fused.get("hf") if isinstance(fused, dict) else None)
        first = hf[0] if isinstance(hf, list) and hf else hf
        group = next((g for g in groups if isinstance(first, str) and f"{{{g}}}" in first), None)
        if isinstance(made, dict) and isinstance(made.get("layers"), str):
            group = made["layers"]
        when = item.get("when")
        if path in self.paths and not all(
            exclusive_conditions(other, when) for other in self.path_whens[path]
        ):
            why = shared_path_problem(self.path_groups[path], group)
            if why is not None:
                self.problem(entry, f"is also leaf {self.paths[path]}'s path: {why}")
        self.paths.setdefault(path, number)
        self.path_whens.setdefault(path, []).append(when)
        self.path_groups.setdefault(path, set()).add(group)
        per_layer = group is not None
        named = _PLACEHOLDER.search(path) is not None
        if target == "maxtext" and (named or (per_layer and not _LAYERS.match(path))):
            self.problem(
                entry,
                "a MaxText path has no placeholder, and a per-layer leaf's starts with "
                "decoder/layers/ (or another decoder/...layers/)",
            )
        elif target == "flax" and named:
            self.problem(
                entry,
                "a Flax path has no placeholder: a per-layer leaf's layers are stacked on the "
                "layer axis (layer_axis:, 0 by default), as nnx.scan and nn.scan hold them",
            )
        elif per_layer and self.period and not path.startswith("decoder/layers/"):
            self.problem(
                entry,
                "with a layer_period, a per-layer leaf's path starts with decoder/layers/ (the "
                "period's places are decoder/layers/layers_K/)",
            )
        elif target == "tunix" and per_layer != named:
            self.problem(
                entry, "a per-layer leaf's path names its layer ({layer}); no other's does"
            )

    def stored(self, spec: Any, entry: str) -> Any:
        """A leaf's two axis orders (`_stored_order`), its sizes as located expressions."""
        try:
            parse_stored(spec, entry)
        except RecipeFormatError as error:
            self.problem(entry, str(error).removeprefix(f"{entry}: "))
            return spec
        shape = [
            self.expression(size, f"{entry}.shape[{i}]") for i, size in enumerate(spec["shape"])
        ]
        return {**spec, "shape": shape}

    def placeholders(self, name: str, entry: str, groups: list[str]) -> None:
        for found in _PLACEHOLDER.findall(name):
            if found != "expert" and found not in groups:
                self.problem(
                    entry,
                    f"{{{found}}} in {name!r} is no layer group ({', '.join(groups)}) nor "
                    f"{{expert}}",
                )

    def fused(self, spec: Any, entry: str, groups: list[str]) -> None:
        if not isinstance(spec, dict) or not isinstance(spec.get("hf"), str):
            self.problem(entry, "'fused' needs {hf: NAME[, split: {axis, mode, part, parts}]}")
            return
        self.mapping(spec, entry, ("hf", "split"))
        self.placeholders(spec["hf"], f"{entry}.hf", groups)
        if spec.get("split") is None:
            return
        split = self.mapping(
            spec["split"], f"{entry}.split", ("axis", "mode", "part", "parts", "sizes")
        )
        if split.get("sizes") is not None:  # unequal parts, in halves order
            sizes = self.listing(split["sizes"], f"{entry}.split.sizes", empty=False)
            for k, size in enumerate(sizes):
                self.expression(size, f"{entry}.split.sizes[{k}]")
            if split.get("mode", "halves") != "halves" or "parts" in split:
                self.problem(f"{entry}.split", "sizes gives the parts: no mode or parts beside it")
            split = {**split, "parts": len(sizes)}
        if not _whole(split.get("axis"), 0, MAX_AXIS):
            self.problem(
                f"{entry}.split",
                f"needs axis: N (0 to {MAX_AXIS}); got {_shown(split.get('axis'))}",
            )
        if split.get("mode", "halves") not in MODES:
            self.problem(
                f"{entry}.split.mode", f"must be halves or interleaved; got {_shown(split['mode'])}"
            )
        parts, part = split.get("parts", 2), split.get("part", 0)
        if not _whole(parts, 1, 1 << 10) or not _whole(part, 0, 1 << 10):
            self.problem(
                f"{entry}.split",
                f"part and parts must be whole numbers (0 <= part < parts); got part "
                f"{_shown(part)}, parts {_shown(parts)}",
            )
        elif part >= parts:
            self.problem(f"{entry}.split", f"split part {part} is not one of {parts} parts")

    def operation(self, spec: Any, entry: str) -> Any:
        """One operation, checked; its expressions as `Expression`."""
        if isinstance(spec, str) and spec in WORDS:
            return spec
        word = spec if isinstance(spec, str) else _only_key(spec)
        if word not in OPTIONS:
            hint = did_you_mean(str(word), [*WORDS, *OPTIONS]) if word is not None else ""
            self.problem(
                entry,
                f"{_shown(spec)} is not an operation.{hint} Use transpose, interleave_rope, "
                "{split_axis: {axis, sizes}}, {scale: {multiply|divide, "
                "back_multiply|back_divide}}, {add: NUMBER}, {pad_rows: {to, back_to}}, "
                "{fit_rows: {to, back_to}} or {permute: [AXES]}",
            )
            return spec
        ((word, options),) = spec.items()
        entry = f"{entry} {word}"
        if word == "add":
            if (
                isinstance(options, bool)
                or not isinstance(options, int | float)
                or not math.isfinite(options)
            ):
                self.problem(entry, f"needs a finite number; got {_shown(options)}")
            return spec
        if word == "permute":
            axes = self.listing(options, entry, empty=False)
            if axes and (
                not all(type(axis) is int for axis in axes)
                or sorted(axes) != list(range(len(axes)))
                or len(axes) > MAX_AXIS
            ):
                self.problem(
                    entry,
                    f"needs the axes in their new order (a permutation of 0..n-1); got "
                    f"{_shown(axes)}",
                )
            return spec
        given = isinstance(options, dict)  # else a problem already, and no more of its keys
        options = self.mapping(options, entry, OPTIONS[word])
        out = dict(options)
        if word == "split_axis":
            if not _whole(options.get("axis", 0), 0, MAX_AXIS):
                self.problem(
                    f"{entry}.axis",
                    f"must be an axis, 0 to {MAX_AXIS}; got {_shown(options['axis'])}",
                )
            if "sizes" not in options and given:
                self.problem(entry, "needs sizes: [expressions], the lengths the axis splits into")
            sizes = self.listing(options.get("sizes", [1]), f"{entry}.sizes", empty=False)
            if len(sizes) > MAX_AXIS:
                self.problem(f"{entry}.sizes", f"splits into over {MAX_AXIS} axes")
            out["sizes"] = [
                self.expression(size, f"{entry}.sizes[{i}]") for i, size in enumerate(sizes)
            ]
        elif word in ("pad_rows", "fit_rows"):
            for key in ("to", "back_to"):
                if key not in options and given:
                    self.problem(entry, f"needs {key!r} (an expression of the config)")
                out[key] = self.expression(options.get(key, 1), f"{entry}.{key}")
        elif word == "scale":
            ways = [key for key in ("multiply", "divide") if key in options]
            back = [key for key in ("back_multiply", "back_divide") if key in options]
            if len(ways) != 1 or len(back) > 1:
                self.problem(
                    entry,
                    "needs exactly one of multiply or divide, and at most one of "
                    "back_multiply or back_divide",
                )
            for key in (*ways, *back):
                out[key] = self.expression(options[key], f"{entry}.{key}")
            for key in ("compute", "back_compute"):
                if key in options and options[key] not in COMPUTE:
                    self.problem(
                        f"{entry}.{key}",
                        f"must be one of {', '.join(COMPUTE)}; got {_shown(options[key])}",
                    )
            if "factor_dtype" in options and options["factor_dtype"] not in FACTOR_DTYPES:
                self.problem(
                    f"{entry}.factor_dtype",
                    f"must be one of {', '.join(FACTOR_DTYPES)}; got "
                    f"{_shown(options['factor_dtype'])}",
                )
        return {word: out}
