"""Runs MaxText's ``checkpoint_conversion.to_maxtext`` with its lazy loader working (run in MaxText's venv).

maxtext 0.2.5 always saves through Orbax's v1 checkpointer, but registers its ``LazyTensor``
leaf (the ``lazy_load_tensors=True`` path, which reads one HF tensor at a time) only with
Orbax's v0 type handlers, so the v1 PyTree handler rejects the tree ("Could not identify a valid
handler for the checkpointable: items"). The eager path needs torch. This launcher resolves
``LazyTensor`` to Orbax's numpy leaf handler (which writes it through ``np.asarray``, i.e. one
tensor at a time, as MaxText intends) and then runs the module unchanged, with the same
arguments:

    python bench/_maxtext_convert.py model_name=llama3.1-8b ... hf_model_path=DIR
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

if __name__ == "__main__":
    sys.argv[0] = "to_maxtext"
    runpy.run_module(
        "maxtext.checkpoint_conversion.to_maxtext", run_name="__main__", alter_sys=True
    )
