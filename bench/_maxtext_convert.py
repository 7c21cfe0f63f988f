"""Runs MaxText's ``checkpoint_conversion.to_maxtext`` with its lazy loader working (run in MaxText's venv).

maxtext 0.2.5 always saves through Orbax's v1 checkpointer, but registers its ``LazyTensor``
leaf (the ``lazy_load_tensors=True`` path, which reads one HF tensor at a time) only with
Orbax's v0 type handlers, so the v1 PyTree handler rejects the tree ("Could not identify a valid
handler for the checkpointable: items"). The eager path needs torch. This launcher resolves
``LazyTensor`` to Orbax's numpy leaf handler (which writes it through ``np.asarray``, i.e. one
tensor at a time, as MaxText intends) and then runs the module unchanged, with the same
arguments:

    python bench/_maxtext_convert.py model_name=llama3.1-8b ... hf_model_path=DIR

MaxText maps names from its built-in Hugging Face config of ``model_name``
(``HF_MODEL_CONFIGS``), whose layer count is the published model's. An argument
``hf_config.KEY=VALUE`` (taken out before MaxText parses the rest) sets that config's KEY, so
that a model with fewer layers than the published one converts:
``hf_config.num_hidden_layers=8`` beside ``base_num_decoder_layers=8``; a dotted KEY reaches into
a sub-config (``hf_config.text_config.hidden_size=64``); a value in brackets is a list of
numbers (``hf_config.vision_config.deepstack_visual_indexes=[0,2]``).

``eager_numpy=True`` (also taken out) makes the eager path (``lazy_load_tensors=False``, which
MaxText needs for ``use_multimodal=True``) read the safetensors files with numpy rather than
torch, which MaxText's environment here lacks: the same tensors, by the same names.
"""

import runpy
import sys

import numpy as np
from orbax.checkpoint._src.serialization import type_handler_registry
from orbax.checkpoint.experimental.v1._src.serialization import registry


def _as_numpy(leaf_type):
    return np.ndarray if getattr(leaf_type, "__name__", "") == "LazyTensor" else leaf_type


_try_get = registry.BaseLeafHandlerRegistry._try_get
registry.BaseLeafHandlerRegistry._try_get = lambda self, leaf_type: _try_get(
    self, _as_numpy(leaf_type)
)
# The v1 leaf handler hands the leaves on to a v0 type-handler registry of its own.
_get = type_handler_registry._TypeHandlerRegistryImpl.get
type_handler_registry._TypeHandlerRegistryImpl.get = lambda self, ty: _get(self, _as_numpy(ty))


def _set_hf_config(argv: list[str]) -> list[str]:
    """`argv` without its ``hf_config.KEY=VALUE`` items, each set on MaxText's HF config."""
    # MaxText's own module, there only in its environment: imported when the launcher runs
    from maxtext.checkpoint_conversion.utils.hf_model_configs import HF_MODEL_CONFIGS

    model = next(item.split("=", 1)[1] for item in argv if item.startswith("model_name="))
    kept = []
    for item in argv:
        if item.startswith("hf_config."):
            key, value = item[len("hf_config.") :].split("=", 1)
            *parents, key = key.split(".")  # text_config.hidden_size: a sub-config's key
            owner = HF_MODEL_CONFIGS[model]
            for parent in parents:  # Qwen3-VL's sub-configs are plain dicts
                owner = owner[parent] if isinstance(owner, dict) else getattr(owner, parent)
            if isinstance(owner, dict):
                owner[key] = _value(value)
            else:
                setattr(owner, key, _value(value))
        else:
            kept.append(item)
    return kept


def _value(text: str):
    """A number, a list of numbers (``[0,2]``, Qwen3-VL's deepstack layers) or text."""
    if text.isdigit():
        return int(text)
    if text.startswith("["):
        return [int(item) for item in text.strip("[]").split(",") if item.strip()]
    return text


def _eager_numpy(argv: list[str]) -> list[str]:
    """`argv` without ``eager_numpy=True``; when given, MaxText's eager safetensors loader
    opens the files with numpy."""
    if "eager_numpy=True" not in argv:
        return argv
    from maxtext.checkpoint_conversion.utils import utils

    load = utils.load_hf_dict_from_safetensors
    utils.load_hf_dict_from_safetensors = lambda path, token, revision, framework="pt": load(
        path, token, revision, framework="np"
    )
    return [item for item in argv if item != "eager_numpy=True"]


if __name__ == "__main__":
    sys.argv = ["to_maxtext", *_set_hf_config(_eager_numpy(sys.argv[1:]))]
    runpy.run_module(
        "maxtext.checkpoint_conversion.to_maxtext", run_name="__main__", alter_sys=True
    )
