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

from ._errors import RuleError
from ._surgery.rules import Edit, Rule

# Where the params live: Linen's and TrainState's `params`; Flax NNX's `model` (a checkpoint
# of ``{"model": nnx.state(model), "optimizer": nnx.state(optimizer)}``, or the items of a
# CheckpointManager step).
ROOTS = ("params", "model")


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
    root: str | None = None  # None: found in the tree (`find_root`)

    @property
    def pattern(self) -> str:  # type: ignore[override]
        return self.rule.pattern

    @property
    def optional(self) -> bool:  # type: ignore[override]
        return self.rule.optional

    def edit(self, leaves: dict[str, Any]) -> Edit:
        root = self.root if self.root is not None else find_root(list(leaves))
        combined = self.rule.edit(leaves)
        for prefix in mirrors(list(leaves), root):
            view = {
                self._rerooted(path, prefix, root): leaf
                for path, leaf in leaves.items()
                if path.startswith(prefix + "/")
            }
            mirrored = self.rule.edit(view)
            combined.removed.update(self._rerooted(path, root, prefix) for path in mirrored.removed)
            for target, (value, anchor) in mirrored.written.items():
                combined.written[self._rerooted(target, root, prefix)] = (
                    value,
                    self._rerooted(anchor, root, prefix),
                )
        return combined

    @staticmethod
    def _rerooted(path: str, old: str, new: str) -> str:
        return new + path[len(old) :] if path == old or path.startswith(old + "/") else path

    def __repr__(self) -> str:
        return f"follow({self.rule!r})"


def find_root(paths: Sequence[str]) -> str:
    """The subtree holding the params: the first of `ROOTS` that optimizer state mirrors, else
    any top-level subtree that one mirrors, else the first of `ROOTS` present.

    Raises:
        RuleError: when the tree has none, naming ``root=``.
    """
    tops = list(dict.fromkeys(path.split("/")[0] for path in paths if "/" in path))
    candidates = [root for root in ROOTS if root in tops] + [t for t in tops if t not in ROOTS]
    for candidate in candidates:
        if mirrors(paths, candidate):
            return candidate
    present = [root for root in ROOTS if root in tops]
    if present:
        return present[0]  # params without optimizer state: the rules apply to them alone
    raise RuleError(
        f"suture.optax.follow found no params to follow: the tree has no 'params' or 'model' "
        f"subtree, and no subtree that optimizer state mirrors (its top-level keys: "
        f"{', '.join(tops[:10]) or 'none'}). Pass root= naming the subtree that holds the "
        f"params: suture.optax.follow(rules, root='state')."
    )


def follow(rules: Sequence[Rule], root: str | None = None) -> list[Rule]:
    """`rules` applied to the params and, the same way, to every subtree mirroring them.

    The params are the `root` subtree; by default the one the tree has (`find_root`):
    ``params`` (Linen, TrainState), ``model`` (Flax NNX: ``{"model": nnx.state(model),
    "optimizer": nnx.state(optimizer)}``), or another that optimizer state mirrors.
    """
    return [Follow(rule, root) for rule in rules]
