"""Where a multimodal Hugging Face folder keeps a vision tower, under whichever names it uses.

A tower table (``target: maxtext-multimodal``) names its tensors one way, the table's
(transformers v5's, as MaxText's mappings read them); folders spell the same prefixes in other
forms: Gemma 3's published folders keep the SigLIP tower under ``vision_tower.vision_model.``,
transformers 5.24's ``save_pretrained`` under ``vision_tower.``. A `Tower` reads every form
into the table's names and writes a chosen form back (`styled`): form 0 is the table's own,
form k the k-th alias of each prefix (the last alias stands in where a prefix has fewer).

A tower's fields are one sub-config (``vision_config``, or a dotted path), or several merged
under name prefixes: Qwen3-Omni's vision and audio encoders as one table, ``config: {vision_:
thinker_config.vision_config, audio_: thinker_config.audio_config}`` (``vision_depth``).

Example:
    >>> tower = Tower("vision_config", (("model.vt.vm.", ("vt.vm.", "vt.")),), ())
    >>> tower.read("vt.encoder.w"), tower.styled("model.vt.vm.encoder.w", 1)
    (('model.vt.vm.encoder.w', 2), 'vt.vm.encoder.w')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import RecipeFormatError
from .._patterns import compile_pattern, fullmatch
from ._expr import check
from ._multimodal import sub_config


@dataclass(frozen=True)
class Tower:
    # the sub-config holding the tower's fields (``vision_config``), or (name prefix, path) pairs
    config: str | tuple[tuple[str, str], ...]
    # (the table's prefix, (its aliases in folders, most specific first)), in order
    prefixes: tuple[tuple[str, tuple[str, ...]], ...]
    leave_out: tuple[str, ...]  # patterns (table names) of tensors the target has no place for
    # (expression of the tower's config, why): when it holds, the text may not be scanned
    # (Qwen3-VL's deepstack: MaxText "requires scan_layers=False")
    unscanned_only: tuple[str, str] | None = None

    @property
    def config_label(self) -> str:
        """The sub-config(s) in messages: ``vision_config``."""
        if isinstance(self.config, str):
            return self.config
        return " and ".join(path for _, path in self.config)

    def fields(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The tower's fields in `config`, or None where a sub-config is missing."""
        if isinstance(self.config, str):
            return sub_config(config, self.config)
        merged: dict[str, Any] = {}
        for prefix, path in self.config:
            inner = sub_config(config, path)
            if inner is None:
                return None
            merged.update({prefix + key: value for key, value in inner.items()})
        return merged

    def read(self, name: str) -> tuple[str, int] | None:
        """`name` in the table's form, and which form it had (0: the table's); None when no
        prefix of the tower holds it."""
        for table, aliases in self.prefixes:
            for form, prefix in enumerate((table, *aliases)):
                if name.startswith(prefix):
                    return table + name[len(prefix) :], form
        return None

    def styled(self, name: str, form: int) -> str:
        """The table's `name` written in `form`."""
        for table, aliases in self.prefixes:
            if name.startswith(table):
                if form == 0 or not aliases:
                    return name
                return aliases[min(form, len(aliases)) - 1] + name[len(table) :]
        return name

    def left_out(self, name: str) -> bool:
        """A tensor (in the table's names) the target has no place for."""
        return any(
            fullmatch(compile_pattern(pattern, "tower leave_out"), name)
            for pattern in self.leave_out
        )

    def split(self, hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], set[int]]:
        """`hf` as (the tower's tensors in the table's names, the rest, the forms seen)."""
        tower, rest, forms = {}, {}, set()
        for name, value in hf.items():
            found = self.read(name)
            if found is None:
                rest[name] = value
            else:
                tower[found[0]] = value
                forms.add(found[1])
        return tower, rest, forms


def parse_tower(spec: Any, where: str) -> Tower:
    """A `Tower` from its table form: ``{config, prefixes: {table: [aliases]}, leave_out}``."""
    rule = (
        f"{where}: 'tower' needs {{config: vision_config (or {{NAME_PREFIX: SUB_CONFIG}}), "
        "prefixes: {TABLE_PREFIX: [ALIASES]}, "
        "leave_out: [patterns], unscanned_only: {when: EXPRESSION, why: TEXT}}}"
    )
    if not isinstance(spec, dict):
        raise RecipeFormatError(f"{rule}; got {spec!r:.200}")
    config = spec.get("config")
    if (
        isinstance(config, dict)
        and config
        and all(isinstance(k, str) and isinstance(v, str) and v for k, v in config.items())
    ):
        config = tuple(config.items())
    elif not isinstance(config, str) or not config:
        raise RecipeFormatError(f"{rule}; got {spec!r:.200}")
    prefixes = spec.get("prefixes")
    if (
        not isinstance(prefixes, dict)
        or not prefixes
        or not all(
            isinstance(table, str)
            and table
            and isinstance(aliases, list)
            and all(isinstance(alias, str) and alias for alias in aliases)
            for table, aliases in prefixes.items()
        )
        or set(spec) - {"config", "prefixes", "leave_out", "unscanned_only"}
    ):
        raise RecipeFormatError(f"{rule}; got {spec!r:.200}")
    leave_out = spec.get("leave_out") or []
    if not isinstance(leave_out, list) or not all(isinstance(p, str) for p in leave_out):
        raise RecipeFormatError(f"{rule}; got {spec!r:.200}")
    for pattern in leave_out:
        compile_pattern(pattern, f"{where}: tower leave_out")
    only = spec.get("unscanned_only")
    if only is not None:
        if (
            not isinstance(only, dict)
            or set(only) != {"when", "why"}
            or not all(isinstance(value, str) for value in only.values())
        ):
            raise RecipeFormatError(f"{rule}; got {spec!r:.200}")
        check(only["when"])
    return Tower(
        config,
        tuple((table, tuple(aliases)) for table, aliases in prefixes.items()),
        tuple(leave_out),
        (only["when"], only["why"]) if only is not None else None,
    )
