"""Flax Linen: params trees and TrainStates as targets.

`load` is `suture.load_and_transform` with a Linen target: a params tree from
``model.init`` or ``jax.eval_shape(model.init, ...)`` (``FrozenDict`` in, ``FrozenDict`` out),
or a whole ``flax.training.train_state.TrainState``, whose params and optimizer state are
filled together (use `suture.optax.follow` so the optimizer state follows renamed params).

Example:
    >>> import jax, jax.numpy as jnp, suture
    >>> import flax.linen as nn
    >>> model = nn.Dense(3)
    >>> params = model.init(jax.random.key(0), jnp.ones((1, 2)))
    >>> again = suture.linen.load(params, jax.eval_shape(model.init, jax.random.key(1), jnp.ones((1, 2))))
    >>> bool(jnp.all(again["params"]["kernel"] == params["params"]["kernel"]))
    True
"""

from __future__ import annotations

from typing import Any

from ._jaxtypes import is_jax_array
from ._load.api import load_and_transform


def load(
    source: Any, target: Any, transform: Any = None, *, init: Any = None, partial: bool = False
) -> Any:
    """`source` (after `transform`) loaded into the structure, dtypes and shardings of `target`.

    Args:
        source: a checkpoint path, an opened checkpoint, or a tree.
        target: Linen params (``FrozenDict`` or dict; arrays or ``ShapeDtypeStruct``), or a
            ``TrainState`` (its ``params``, ``opt_state`` and ``step`` are loaded).
        transform: rules (wrap them in `suture.optax.follow` for TrainStates), a
            transformations tree, or a function.
        init: values for leaves the checkpoint lacks (default: a live target's own values).
        partial: ignore checkpoint leaves the target has no place for.
    """
    if init is None:
        init = _live_values(target)
    return load_and_transform(transform, source, target=target, init=init, partial=partial)


def _live_values(target: Any) -> Any:
    import jax  # heavy: loaded on first use, not at import

    leaves = jax.tree.leaves(target)
    if leaves and all(is_jax_array(leaf) for leaf in leaves):
        return target  # a live tree (model.init's output): it fills what the checkpoint lacks
    return None
