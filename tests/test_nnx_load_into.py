"""suture.nnx.load_into: no silent no-ops, both sides of a mismatch, in-place updates, padding."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import suture
from tests.test_flax_optax import ModifiedTwoLayerMLP, TwoLayerMLP


@pytest.fixture
def saved(tmp_path: Path) -> tuple[TwoLayerMLP, Path]:
    model = TwoLayerMLP(4, rngs=nnx.Rngs(0))
    ocp.PyTreeCheckpointer().save(tmp_path / "state", nnx.state(model))
    return model, tmp_path / "state"


def renamed_model() -> ModifiedTwoLayerMLP:
    return ModifiedTwoLayerMLP(4, rngs=nnx.Rngs(1))


def test_loading_nothing_is_an_error_listing_both_sides_paired(saved) -> None:
    _, path = saved
    for partial in (True, False):
        with pytest.raises(suture.SurgeryError) as caught:
            suture.nnx.load_into(renamed_model, path, partial=partial)
        message = str(caught.value)
        assert "The checkpoint gives the model nothing" in message
        assert "'layer1/kernel' (did you mean checkpoint 'linear1/kernel'?)" in message
        assert "checkpoint leaves with no model path (4):\n    'linear1/bias'" in message
        assert "partial=True" not in message  # it would not help: nothing matches


class Bigger(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(4, 4, rngs=rngs)
        self.linear2 = nnx.Linear(4, 4, rngs=rngs)
        self.head = nnx.Linear(4, 2, rngs=rngs)


class Smaller(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(4, 4, rngs=rngs)


def test_partial_is_suggested_only_when_the_checkpoint_covers_part(saved) -> None:
    old, path = saved
    with pytest.raises(suture.SurgeryError) as caught:
        suture.nnx.load_into(lambda: Smaller(nnx.Rngs(2)), path)
    message = str(caught.value)
    assert "covers 2 of the model's 2 leaves" in message and "partial=True" in message
    assert "'linear2/kernel'" in message
    smaller = suture.nnx.load_into(lambda: Smaller(nnx.Rngs(2)), path, partial=True)
    np.testing.assert_array_equal(smaller.linear1.kernel[...], old.linear1.kernel[...])
    # A model with more leaves: the checkpoint covers part, the rest keeps its own values.
    bigger = suture.nnx.load_into(lambda: Bigger(nnx.Rngs(2)), path)
    np.testing.assert_array_equal(bigger.linear2.bias[...], old.linear2.bias[...])
    assert bigger.head.kernel[...].shape == (4, 2)


def test_in_place_updates_the_given_module_as_nnx_update_does(saved) -> None:
    old, path = saved
    live = TwoLayerMLP(4, rngs=nnx.Rngs(7))
    stock = TwoLayerMLP(4, rngs=nnx.Rngs(7))
    nnx.update(stock, nnx.state(old))  # what Flax's own update gives
    returned = suture.nnx.load_into(live, path, in_place=True)
    assert returned is live
    x = jnp.ones((2, 4))
    np.testing.assert_array_equal(live(x), stock(x))
    with pytest.raises(
        suture.SurgeryError, match=r"in_place=True\) updates a live nnx.Module; got function"
    ):
        suture.nnx.load_into(lambda: TwoLayerMLP(4, rngs=nnx.Rngs(7)), path, in_place=True)
    abstract = nnx.eval_shape(lambda: TwoLayerMLP(4, rngs=nnx.Rngs(7)))
    with pytest.raises(suture.SurgeryError, match="abstract module .* no values to update"):
        suture.nnx.load_into(abstract, path, in_place=True)


class Embedder(nnx.Module):
    def __init__(self, vocabulary: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocabulary, 3, rngs=rngs)


def test_pad_truncate_grows_a_vocabulary(tmp_path: Path) -> None:
    old = Embedder(5, nnx.Rngs(0))
    ocp.PyTreeCheckpointer().save(tmp_path / "embed", nnx.state(old))
    with pytest.raises(suture.SurgeryError, match=r"embed/embedding"):
        suture.nnx.load_into(lambda: Embedder(8, nnx.Rngs(1)), tmp_path / "embed")
    grown = suture.nnx.load_into(
        lambda: Embedder(8, nnx.Rngs(1)), tmp_path / "embed", pad_truncate=True
    )
    table = np.asarray(grown.embed.embedding[...])
    np.testing.assert_array_equal(table[:5], np.asarray(old.embed.embedding[...]))
    assert not table[5:].any()
