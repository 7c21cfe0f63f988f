"""Optax: optimizer state that follows the params through surgery.

Optimizer states hold subtrees with the params' structure: Adam's ``mu`` and ``nu``,
momentum ``trace``. `follow` wraps rules so that each applies to the params and, the same
way, to every such mirror, so a renamed, stacked or cast model can resume training with its
optimizer state.

Example:
    >>> import numpy as np, suture
    >>> from suture import rules
    >>> state = {"params": {"dense": {"w": np.ones(2)}},
    ...          "opt_state": [{"mu": {"dense": {"w": np.zeros(2)}}, "nu": {"dense": {"w": np.zeros(2)}}}]}
    >>> moved = rules.apply_rules(suture.optax.follow([rules.rename("params/dense", "params/head")]), state)
    >>> sorted(suture.flatten(moved))
    ['opt_state/0/mu/head/w', 'opt_state/0/nu/head/w', 'params/head/w']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._surgery.rules import Edit, Rule


def mirrors(paths: Sequence[str], root: str = "params") -> list[str]:
    """The prefixes whose subtrees have exactly the leaf paths of the `root` subtree."""
    prefix = root + "/"
    relative = {path[len(prefix) :] for path in paths if path.startswith(prefix)}
    if not relative:
        return []
    found: dict[str, set[str]] = {}
    for path in paths:
        if path.startswith(prefix):
            continue
        parts = path.split("/")
        for split in range(1, len(parts)):
            suffix = "/".join(parts[split:])
            if suffix in relative:
                found.setdefault("/".join(parts[:split]), set()).add(suffix)
    below = {candidate: {p for p in paths if p.startswith(candidate + "/")} for candidate in found}
    return [
        candidate
        for candidate, suffixes in found.items()
        if suffixes == relative and len(below[candidate]) == len(relative)
    ]


@dataclass(frozen=True, repr=False)
class Follow(Rule):
    """A rule on the params, applied the same way to every subtree that mirrors them."""

    rule: Rule
    root: str = "params"

    @property
    def pattern(self) -> str:  # type: ignore[override]
        return self.rule.pattern

    @property
    def optional(self) -> bool:  # type: ignore[override]
        return self.rule.optional

    def edit(self, leaves: dict[str, Any]) -> Edit:
        combined = self.rule.edit(leaves)
        for prefix in mirrors(list(leaves), self.root):
            view = {
                self._rerooted(path, prefix, self.root): leaf
                for path, leaf in leaves.items()
                if path.startswith(prefix + "/")
            }
            mirrored = self.rule.edit(view)
            combined.removed.update(
                self._rerooted(path, self.root, prefix) for path in mirrored.removed
            )
            for target, (value, anchor) in mirrored.written.items():
                combined.written[self._rerooted(target, self.root, prefix)] = (
                    value,
                    self._rerooted(anchor, self.root, prefix),
                )
        return combined

    @staticmethod
    def _rerooted(path: str, old: str, new: str) -> str:
        return new + path[len(old) :] if path == old or path.startswith(old + "/") else path

    def __repr__(self) -> str:
        return f"follow({self.rule!r})"


def follow(rules: Sequence[Rule], root: str = "params") -> list[Rule]:
    """`rules` applied to the `root` subtree and, the same way, to every subtree mirroring it."""
    return [Follow(rule, root) for rule in rules]
