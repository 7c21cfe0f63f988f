"""A multimodal Hugging Face folder's language model, as a family recipe converts it.

Gemma 3 and Llama 4 are also published as multimodal folders: the language model's tensors
sit under a prefix (``language_model.model.``, or ``model.language_model.`` as transformers v5
writes them) beside a vision tower, and its config under ``text_config``. A recipe with a
``language_model`` entry reads that config, renames the language model's tensors to the
plain ``model.`` names of its table, and leaves the rest out (MaxText's text model has no
place for it), saying so; back to HF, the names get the prefix again, and the original folder
(``like``) gives the left-out tensors back. Kimi K2.5 and K2.6 publish the whole causal LM
under one prefix (``language_model.model.layers...``, ``language_model.lm_head.weight``): a
``causal_lm_prefixes`` entry is such a prefix, taken off every name under it.

Example:
    >>> lm = LanguageModel("text_config", ("language_model.model.",), (r"vision_tower\\..*",))
    >>> hf = {"language_model.model.norm.weight": 1, "vision_tower.w": 2}
    >>> lm.prefix(hf), lm.left_out("vision_tower.w")
    ('language_model.model.', True)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .._errors import RecipeFormatError, SutureWarning
from .._format import first_and_more
from .._patterns import compile_pattern, fullmatch

TEXT_PREFIX = "model."  # the tables' names: a language-model folder's


class LeftOutWarning(SutureWarning):
    """A conversion to MaxText leaves part of the checkpoint out, as MaxText's own does (a
    multimodal folder's vision tower, vocabulary rows past MaxText's); ``--reverse --like
    ORIGINAL`` gives it back."""


@dataclass(frozen=True)
class LanguageModel:
    config: str  # the sub-config holding the language model's (``text_config``)
    prefixes: tuple[str, ...]  # where a multimodal folder keeps its model. tensors
    leave_out: tuple[str, ...]  # patterns of the tensors the target's text model has no place for
    causal_lm_prefixes: tuple[str, ...] = ()  # where a folder keeps the model. and lm_head both
    # fields the outer config sets for the whole model, over the text config's own (Qwen3-VL's
    # tie_word_embeddings: its lm_head sits beside the model, as transformers 5.24 reads it)
    outer: tuple[str, ...] = ()

    @property
    def default_prefix(self) -> str:
        """The prefix a conversion back to HF writes when nothing else says which."""
        return (*self.causal_lm_prefixes, *self.prefixes)[0]

    def text_prefix(self, prefix: str) -> str:
        """What `prefix` stands for in the table's names: ``model.``, or nothing."""
        return "" if prefix in self.causal_lm_prefixes else TEXT_PREFIX

    def hf_name(self, name: str, prefix: str) -> str:
        """The table's `name` as a folder with the language model under `prefix` holds it."""
        return renamed(name, self.text_prefix(prefix), prefix)

    def text_config(self, config: dict[str, Any]) -> dict[str, Any]:
        inner = sub_config(config, self.config)
        if inner is None:
            return dict(config)
        # the outer fields sit beside the sub-config (Qwen3-Omni's in thinker_config)
        outer = sub_config(config, self.config.rpartition(".")[0]) if "." in self.config else config
        outer = outer or {}
        return {**inner, **{field: outer[field] for field in self.outer if field in outer}}

    def is_multimodal(self, config: dict[str, Any]) -> bool:
        return sub_config(config, self.config) is not None

    def prefix(self, hf: dict[str, Any]) -> str | None:
        """The prefix of the language model's tensors in `hf`, or None (a text-only folder)."""
        for prefix in (*self.causal_lm_prefixes, *self.prefixes):
            if any(name.startswith(prefix) for name in hf):
                return prefix
        return None

    def left_out(self, name: str) -> bool:
        return matches_any(name, self.leave_out, "language_model leave_out")

    def to_text(
        self, hf: dict[str, Any], prefix: str, recipe: str, target: str = "MaxText"
    ) -> dict[str, Any]:
        """`hf` with the language model under the table's names and the rest left out."""
        left = sorted(name for name in hf if self.left_out(name))
        if left:
            warn_left_out(
                f"Recipe {recipe!r} converts the language model of this multimodal folder and",
                left,
                f"{target}'s text model",
                self._by_part(left),
                stacklevel=4,
            )
        return {
            renamed(name, prefix, self.text_prefix(prefix)): value
            for name, value in hf.items()
            if not self.left_out(name)
        }

    def _by_part(self, left: list[str]) -> str:
        """Each part left out (a vision tower, an MTP layer), its first tensor and its count."""
        parts = []
        for pattern in self.leave_out:
            names = [
                name for name in left if fullmatch(compile_pattern(pattern, "leave_out"), name)
            ]
            if names:
                parts.append(first_and_more(names, 1))
        return "; ".join(parts)

    def from_text(self, tensors: dict[str, Any], prefix: str) -> dict[str, Any]:
        return {self.hf_name(name, prefix): value for name, value in tensors.items()}

    def restore_left_out(self, original: dict[str, Any], tensors: dict[str, Any]) -> None:
        """Copies the tensors the forward conversion left out from the `original` folder."""
        for name, value in original.items():
            if self.left_out(name) and name not in tensors:
                tensors[name] = value


def parse_language_model(spec: Any, where: str) -> LanguageModel | None:
    """A `LanguageModel` from its table form: ``{config, prefixes, leave_out,
    causal_lm_prefixes}``."""
    if spec is None:
        return None
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("config"), str)
        or not spec.get("prefixes")
        or not all(isinstance(p, str) for p in spec["prefixes"])
    ):
        raise RecipeFormatError(
            f"{where}: 'language_model' needs {{config: text_config, prefixes: [...], "
            f"leave_out: [patterns]}}."
        )
    causal = spec.get("causal_lm_prefixes") or ()
    if not isinstance(causal, list | tuple) or not all(isinstance(p, str) for p in causal):
        raise RecipeFormatError(
            f"{where}: 'language_model.causal_lm_prefixes' is a list of prefixes."
        )
    return LanguageModel(
        spec["config"],
        tuple(spec["prefixes"]),
        tuple(spec.get("leave_out") or ()),
        tuple(causal),
        tuple(spec.get("outer") or ()),
    )


def matches_any(name: str, patterns: tuple[str, ...], what: str) -> bool:
    """Whether one of a table's `patterns` (its key `what`) matches all of `name`, each
    under a time bound: a user's pattern may backtrack.

    Example:
        >>> matches_any("mtp.0.norm.weight", (r"mtp\\..*",), "leave_out")
        True
    """
    return any(fullmatch(compile_pattern(pattern, what), name) for pattern in patterns)


def warn_left_out(
    doing: str, left: list[str], place: str, shown: str | None = None, stacklevel: int = 2
) -> None:
    """Warns (`LeftOutWarning`, `stacklevel` counted from the caller) that a conversion
    `doing` leaves out the tensors `left` (sorted), which `place` has no place for; `shown`
    says which (default: the first and how many more)."""
    if shown is None:
        shown = first_and_more(left, 1)
    warnings.warn(
        f"{doing} leaves out {len(left)} tensor(s) {place} has no place for ({shown}); "
        "`suture convert ... --reverse --like ORIGINAL` restores them.",
        LeftOutWarning,
        stacklevel=stacklevel + 1,
    )


def sub_config(config: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The sub-config at a dotted `path` (``thinker_config.text_config``), or None.

    Example:
        >>> sub_config({"thinker_config": {"text_config": {"a": 1}}}, "thinker_config.text_config")
        {'a': 1}
    """
    inner: Any = config
    for key in path.split("."):
        inner = inner.get(key) if isinstance(inner, dict) else None
    return inner if isinstance(inner, dict) else None


def renamed(name: str, prefix: str, replacement: str) -> str:
    return replacement + name[len(prefix) :] if name.startswith(prefix) else name
