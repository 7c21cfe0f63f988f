"""LoRA pairs in a JAX tree, and the recipe leaves they belong to.

Three layouts hold them (each leaf perhaps wrapped as ``.../value``, as ``nnx.state`` saved
by Orbax spells it):

- qwix (Tunix's ``PeftTrainer``): ``<weight>_lora_a`` and ``<weight>_lora_b`` beside the
  weight, applied with PEFT's scale ``alpha / rank`` (alpha is not in the checkpoint);
- Flax NNX ``LoRALinear`` (or an ``nnx.LoRA`` kept as ``lora``): ``<module>/lora/lora_a``,
  ``<module>/lora/lora_b`` beside ``<module>/kernel``; no scale;
- Flax NNX ``LoRA`` wrapping a module: ``<module>/lora_a``, ``<module>/lora_b`` beside
  ``<module>/base_module/...``; no scale.

Example:
    >>> import numpy as np
    >>> flat = {"q/w": 0, "q/w_lora_a": 1, "q/w_lora_b": 2, "m/lora/lora_a": 3, "m/lora/lora_b": 4}
    >>> [(p.owner, p.style) for p in found_pairs(flat)]
    [('m', 'nnx'), ('q/w', 'qwix')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import ArgumentError, MissingLeafError

QWIX, NNX = "qwix", "nnx"


@dataclass(frozen=True)
class Pair:
    owner: str  # qwix: the weight's path; NNX: the module's path
    a: Any
    b: Any
    style: str
    a_path: str


def found_pairs(flat: dict[str, Any]) -> list[Pair]:
    """Every LoRA pair of `flat` (paths without ``/value``), sorted by owner.

    Raises:
        ArgumentError: a factor without its partner.
    """
    pairs = []
    for path in sorted(flat):
        if path.endswith("_lora_a") and not path.endswith("/lora_a"):
            owner, partner, style = path[: -len("_lora_a")], path[:-1] + "b", QWIX
        elif path == "lora_a" or path.endswith("/lora_a"):
            owner, partner, style = path[: -len("lora_a")].rstrip("/"), path[:-1] + "b", NNX
            owner = owner.removesuffix("/lora") if owner.endswith("/lora") else owner
        else:
            if (path.endswith("_lora_b") or path.endswith("lora_b")) and _a_of(path) not in flat:
                _lone(path)
            continue
        if partner not in flat:
            _lone(path)
        pairs.append(Pair(owner, flat[path], flat[partner], style, path))
    return pairs


def _a_of(path: str) -> str:
    return path[:-1] + "a"


def _lone(path: str) -> None:
    raise ArgumentError(
        f"LoRA factor {path!r} has no partner (lora_a and lora_b come in pairs); the "
        f"checkpoint is incomplete. Export the checkpoint as it was saved, whole."
    )


def weight_path(pair: Pair, leaves: dict[str, Any]) -> str:
    """The recipe leaf (a key of `leaves`) the pair adapts: the qwix weight itself, or the one
    weight of the NNX module (``<module>/kernel``, ``/w``; ``base_module`` left out)."""
    if pair.style == QWIX:
        if pair.owner in leaves:
            return pair.owner
        wanted = [pair.owner]
    else:
        module = pair.owner
        candidates = {module, module.replace("/base_module", "")}
        wanted = sorted(candidates)
        inside = sorted(
            path for path in leaves if any(path.rpartition("/")[0] == m for m in candidates)
        )
        if len(inside) == 1:
            return inside[0]
    near = sorted(leaves)[:6]
    raise MissingLeafError(
        f"LoRA pair {pair.a_path!r} adapts {' or '.join(map(repr, wanted))}, which is no "
        f"linear weight of the recipe's layout (those are {', '.join(near)}, ...). Export "
        f"with the recipe of the model the adapter was trained on (`suture recipes` lists "
        f"them), or rename the tree's modules as the recipe names them."
    )
