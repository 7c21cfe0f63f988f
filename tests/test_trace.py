"""How user functions run on lazy trees: a bug surfaces at once; each fallback says why."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import suture
from suture._lazy.trace import call_function


def tree() -> dict:
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}


class Counted:
    """Wraps a function, counting its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0
        self.__name__ = fn.__name__

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def divides_by_zero(t):
    return {"w": t["w"] * (1 / 0)}


def missing_key(t):
    return {"w": t["nope"]}


def misspelt_method(t):
    return {"w": t["w"].tranpose()}


@pytest.mark.parametrize(
    ("fn", "error", "message"),
    [
        (divides_by_zero, ZeroDivisionError, "division by zero"),
        (missing_key, KeyError, "nope"),
        (misspelt_method, AttributeError, "tranpose"),
    ],
)
def test_a_functions_own_bug_is_raised_from_its_first_run(fn, error, message):
    counted = Counted(fn)
    with pytest.raises(error, match=message) as raised:
        suture.transform(counted, suture.open(tree()))
    assert counted.calls == 1
    assert raised.traceback[-1].name == fn.__name__  # its own traceback, ending in it
    assert raised.value.__context__ is None  # not raised while handling an earlier try


def test_a_bug_in_a_value_fn_is_raised_once_too():
    counted = Counted(divides_by_zero)
    lazy = suture.LazyArray.from_array(np.ones(3, np.float32))
    with pytest.raises(ZeroDivisionError):
        call_function(counted, {"w": lazy})
    assert counted.calls == 1


def test_a_function_needing_jax_runs_lazily_then_traced_and_the_plan_says_why():
    def gelu(t):
        return {"w": jnp.tanh(t["w"])}

    counted = Counted(gelu)
    plan = suture.plan(counted, suture.open(tree()))
    assert counted.calls == 2 and plan.ok
    (fallback,) = plan.fallbacks
    assert fallback.startswith("gelu: running lazily failed (ValueError: ")
    assert "__jax_array__" in fallback and fallback.endswith("; traced with jax.")
    assert (
        "Function call: gelu: computed by tracing with jax (on shapes and dtypes; nothing is read)."
        in str(plan)
    )
    assert "running lazily failed" not in str(plan)  # what happened, not a failure
    assert plan.to_dict()["fallbacks"] == [fallback]


def test_a_function_that_must_read_runs_three_times_and_the_plan_gives_both_reasons():
    def singular_values(t):
        return {"s": np.linalg.svd(t["w"], compute_uv=False)}

    counted = Counted(singular_values)
    plan = suture.plan(counted, suture.open(tree()))
    assert counted.calls == 3 and plan.ok
    (fallback,) = plan.fallbacks
    assert fallback.startswith(
        "singular_values: running lazily failed (ImplicitReadError: np.svd reads its LazyArray"
    )
    assert "; tracing with jax failed (TracerArrayConversionError: " in fallback
    assert fallback.endswith("; ran reading arrays.")
    assert "Function call: singular_values: running lazily failed" in str(plan)
    result = suture.transform(singular_values, suture.open(tree()))
    np.testing.assert_allclose(
        np.asarray(result["s"]), np.linalg.svd(tree()["w"], compute_uv=False), rtol=1e-5
    )


def test_the_reason_names_the_leaf_that_would_be_read():
    def scaled_by_max(t):
        return {"w": t["w"] * float(np.asarray(t["w"]).max())}

    plan = suture.plan(scaled_by_max, suture.open(tree()))
    (fallback,) = plan.fallbacks
    assert "running lazily failed (ImplicitReadError: np.asarray reads 'w')" in fallback
    assert plan.bytes_read_by_functions == 24


def test_a_lazy_function_runs_once_and_notes_nothing():
    counted = Counted(lambda t: {"w": t["w"] * 2 + 1})
    plan = suture.plan(counted, suture.open(tree()))
    assert counted.calls == 1 and plan.fallbacks == []
    assert "Function call" not in str(plan)


def test_a_surgery_error_inside_a_function_is_raised_at_once():
    counted = Counted(lambda t: {"w": suture.stack([t["w"], t["w"][:1]])})
    lazy = suture.LazyArray.from_array(np.ones((2, 3), np.float32))
    with pytest.raises(suture.ShapeMismatchError, match="does not fit"):
        call_function(counted, {"w": lazy})
    assert counted.calls == 1
