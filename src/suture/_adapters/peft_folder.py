"""The folder PEFT writes for a LoRA adapter: ``adapter_config.json`` + ``adapter_model.safetensors``.

Tensor names are ``base_model.model.<HF module>.lora_A.weight`` (r, in) and
``...lora_B.weight`` (out, r): for a Llama, ``base_model.model.model.layers.0.self_attn.
q_proj.lora_A.weight`` (``model.`` twice: PEFT's wrapper, then the HF model's own). A name
without PEFT's prefix loads nothing, and peft leaves lora_B at zero without a word, so
reading refuses one. The delta PEFT applies is ``B @ A * lora_alpha / r`` (``/ sqrt(r)``
with ``use_rslora``).

Example:
    >>> module_of("base_model.model.model.layers.0.mlp.up_proj.lora_A.weight")
    ('model.layers.0.mlp.up_proj', 'A')
    >>> tensor_name("model.layers.0.mlp.up_proj", "B")
    'base_model.model.model.layers.0.mlp.up_proj.lora_B.weight'
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ArgumentError, CheckpointNotFoundError, NotACheckpointError, UnsupportedError
from .._json import loads as loads_json
from .._location import LocalLocation, location_of
from .._paths import flatten

PREFIX = "base_model.model."
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 1 << 20


@dataclass
class Adapter:
    """LoRA pairs by HF module (``model.layers.0.self_attn.q_proj``): ``(A (r, in), B (out, r))``."""

    pairs: dict[str, tuple[np.ndarray, np.ndarray]]
    lora_alpha: float
    use_rslora: bool = False
    base_model: str | None = None
    config: dict[str, Any] | None = None  # the adapter_config.json read, when read

    @property
    def rank(self) -> int:
        ranks = {a.shape[0] for a, _ in self.pairs.values()}
        if len(ranks) != 1:
            raise UnsupportedError(
                f"The adapter's pairs have ranks {sorted(ranks)}; one PEFT folder records one "
                f"r. Export adapters of one rank."
            )
        return ranks.pop()

    def scaling(self, rank: int | None = None) -> float:
        """PEFT's ``lora_alpha / r`` (``/ sqrt(r)`` with rslora)."""
        r = rank if rank is not None else self.rank
        return self.lora_alpha / (math.sqrt(r) if self.use_rslora else r)


def module_of(name: str) -> tuple[str, str]:
    """(HF module, ``"A"`` or ``"B"``) of a PEFT tensor name; refuses any other name."""
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if name.startswith(PREFIX) and name.endswith(suffix):
            return name[len(PREFIX) : -len(suffix)], part
    raise UnsupportedError(
        f"Adapter tensor {name!r} is not a LoRA factor PEFT names "
        f"'{PREFIX}<module>.lora_A.weight' / '.lora_B.weight'{_what(name)}. suture reads "
        f"LoRA pairs of linear layers alone (no trained biases, embedding LoRA, DoRA "
        f"magnitudes or modules_to_save): merge such an adapter with peft's merge_and_unload; "
        f"a name without {PREFIX!r} is one that peft would not load (it leaves lora_B at zero)."
    )


def _what(name: str) -> str:
    """What a tensor that is no LoRA factor holds, by PEFT's names."""
    if name.endswith(".bias"):
        return ": it is a bias PEFT trained (bias='all' or 'lora_only', or lora_bias=True)"
    if ".lora_embedding_" in name:
        return ": it is an embedding's LoRA factor"
    if ".lora_magnitude_vector" in name:
        return ": it is a DoRA magnitude"
    if name.startswith(PREFIX) and ".lora_" not in name:
        return ": it is a whole weight (modules_to_save, or a layer PEFT trained in full)"
    return ""


def tensor_name(module: str, part: str) -> str:
    return f"{PREFIX}{module}.lora_{part}.weight"


def adapter_config(adapter: Adapter) -> dict[str, Any]:
    """The ``adapter_config.json`` PEFT's ``LoraConfig`` writes, for these pairs."""
    targets = sorted({module.rsplit(".", 1)[-1] for module in adapter.pairs})
    return {
        "base_model_name_or_path": adapter.base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": _number(adapter.lora_alpha),
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": adapter.rank,
        "target_modules": targets,
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": adapter.use_rslora,
    }


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def write(adapter: Adapter, destination: str | os.PathLike, overwrite: bool = False) -> Path:
    """Writes the folder PEFT writes, atomically (a finished folder or none)."""
    from safetensors.numpy import save_file

    from .._location.publish import begin, exclusive

    if not adapter.pairs:
        raise ArgumentError("No LoRA pairs to write: the adapter is empty.")
    place = location_of(destination)
    if not isinstance(place, LocalLocation):
        raise UnsupportedError(
            f"An adapter folder is written to a local path; {str(destination)!r} is not one. "
            f"Write it locally and copy it."
        )
    tensors = {}
    for module, (a, b) in sorted(adapter.pairs.items()):
        tensors[tensor_name(module, "A")] = np.ascontiguousarray(a)
        tensors[tensor_name(module, "B")] = np.ascontiguousarray(b)
    config = adapter_config(adapter)
    with exclusive(place) as held:
        if place.exists():
            _check_replaceable(place.path, overwrite)
        publication = begin(place, overwrite, False, reclaimed=held.reclaimed)
        try:
            folder = publication.temporary.path  # type: ignore[attr-defined]
            folder.mkdir()
            save_file(tensors, folder / WEIGHTS_NAME, metadata={"format": "pt"})
            (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
            publication.commit(overwrite)
        except BaseException:
            publication.abort()
            raise
    return place.path


PEFT_FILES = {CONFIG_NAME, WEIGHTS_NAME, "README.md"}  # what save_pretrained writes


def _check_replaceable(destination: Path, overwrite: bool) -> None:
    """Only an adapter folder is replaced, and only with `overwrite`."""
    from .._errors import DestinationError
    from .._location.publish import destination_exists

    if not overwrite:
        raise destination_exists(location_of(destination))
    entries = {entry.name for entry in destination.iterdir()} if destination.is_dir() else None
    if entries is None or not entries <= PEFT_FILES:
        found = "is not a folder" if entries is None else f"holds {sorted(entries - PEFT_FILES)}"
        raise DestinationError(
            f"--overwrite replaces an adapter folder ({', '.join(sorted(PEFT_FILES))}), and "
            f"{str(destination)!r} {found}. Nothing was changed. Write elsewhere."
        )


def read(source: str | os.PathLike) -> Adapter:
    """The pairs and scaling of a PEFT LoRA folder."""
    from .._surgery.recipes import read_limited
    from ..sources.open import open as open_checkpoint

    folder = Path(source)
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"PEFT adapter folder {str(source)!r} does not exist (or is not a folder). Pass "
            f"the folder holding {CONFIG_NAME} and {WEIGHTS_NAME}."
        )
    if not (folder / CONFIG_NAME).is_file() or not (folder / WEIGHTS_NAME).is_file():
        raise NotACheckpointError(
            f"{str(source)!r} is not a PEFT adapter folder: it needs {CONFIG_NAME} and "
            f"{WEIGHTS_NAME} (as PeftModel.save_pretrained writes them)."
        )
    raw = read_limited(
        folder / CONFIG_NAME,
        "Adapter config",
        "an adapter_config.json",
        MAX_CONFIG_BYTES,
        NotACheckpointError,
    )
    try:
        config = loads_json(raw)
    except ValueError as error:
        raise NotACheckpointError(
            f"{str(folder / CONFIG_NAME)!r} is not JSON ({error}). Write it again with peft."
        ) from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        found = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise UnsupportedError(
            f"{str(folder / CONFIG_NAME)!r} has peft_type {found!r}; suture reads LoRA "
            f"adapters (peft_type 'LORA')."
        )
    for field, plain in (("use_dora", False), ("fan_in_fan_out", False)):
        if config.get(field, plain) != plain:
            raise UnsupportedError(
                f"{str(folder / CONFIG_NAME)!r} sets {field} = {config[field]!r}; suture reads "
                f"plain LoRA of linear layers ({field} {plain})."
            )
    for field in ("rank_pattern", "alpha_pattern"):
        if config.get(field):
            raise UnsupportedError(
                f"{str(folder / CONFIG_NAME)!r} has a {field} ({config[field]!r:.80}); suture "
                f"reads adapters with one r and one lora_alpha."
            )
    alpha, rank = config.get("lora_alpha"), config.get("r")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise NotACheckpointError(
            f"{str(folder / CONFIG_NAME)!r}: lora_alpha is {alpha!r}, expected a number."
        )
    tensors = flatten(open_checkpoint(folder / WEIGHTS_NAME, separator=".").tree)
    halves: dict[str, dict[str, np.ndarray]] = {}
    for path, array in tensors.items():
        module, part = module_of(path.replace("/", "."))
        halves.setdefault(module, {})[part] = np.asarray(array.read())
    pairs = {}
    for module, half in sorted(halves.items()):
        if set(half) != {"A", "B"}:
            lone = tensor_name(module, next(iter(half)))
            raise NotACheckpointError(
                f"Adapter tensor {lone!r} has no partner (lora_A and lora_B come in pairs)."
            )
        a, b = half["A"], half["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1] or not a.shape[0]:
            raise NotACheckpointError(
                f"Adapter pair of {module!r}: lora_A {a.shape} and lora_B {b.shape}; PEFT's are "
                f"(r, in) and (out, r) with one r of at least 1."
            )
        if isinstance(rank, int) and a.shape[0] != rank:
            raise NotACheckpointError(
                f"Adapter pair of {module!r} has rank {a.shape[0]}, and {CONFIG_NAME} says r = "
                f"{rank}. The folder's files do not belong together."
            )
        pairs[module] = (a, b)
    return Adapter(
        pairs,
        float(alpha),
        bool(config.get("use_rslora", False)),
        config.get("base_model_name_or_path"),
        config,
    )
