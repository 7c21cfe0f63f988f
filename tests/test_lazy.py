"""LazyArray: every view equals numpy's, reads only what it needs, and fails clearly."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import suture
from suture._iostats import count_bytes_read

BASE = np.arange(2 * 3 * 4 * 5, dtype=np.int32).reshape(2, 3, 4, 5)


def lazy(array: np.ndarray = BASE) -> suture.LazyArray:
    return suture.LazyArray.from_array(array, path="w")


@pytest.mark.parametrize(
    "index",
    [
        1,
        -1,
        (0, 2),
        (slice(None), slice(None, None, -1)),
        (Ellipsis, 3),
        (None, 1, Ellipsis, None),
        (slice(None), [2, 0, 2]),
        (1, slice(None), np.array([True, False, True, False])),
        (slice(1, 1),),
        (0, 1, 2, 3),
        np.int64(1),
        (slice(None), slice(None), slice(None), np.array([-1, 0])),
        (1, slice(None, None, 2), slice(3, 0, -2)),
    ],
)
def test_indexing_matches_numpy(index) -> None:
    expected = BASE[index]
    view = lazy()[index]
    assert view.shape == expected.shape
    np.testing.assert_array_equal(view.read(), expected)
    np.testing.assert_array_equal(np.asarray(view), expected)


def test_structural_operations_match_numpy() -> None:
    x = lazy()
    cases = [
        (x.T, BASE.T),
        (x.transpose(2, 0, 3, 1)[1], BASE.transpose(2, 0, 3, 1)[1]),
        (x.transpose((1, 0, 2, 3)), BASE.transpose((1, 0, 2, 3))),
        (x.reshape(6, 20)[4, 3:9], BASE.reshape(6, 20)[4, 3:9]),
        (x.reshape(2, -1)[:, ::7], BASE.reshape(2, -1)[:, ::7]),
        (x.reshape((-1,))[::11], BASE.reshape(-1)[::11]),
        (x.astype(np.float32)[1, 2], BASE.astype(np.float32)[1, 2]),
        (x[1].T.reshape(20, 3)[::-3], BASE[1].T.reshape(20, 3)[::-3]),
        (x[None][[0, 0]], BASE[None][[0, 0]]),
    ]
    for view, expected in cases:
        assert view.shape == expected.shape
        assert view.dtype == expected.dtype
        np.testing.assert_array_equal(view.read(), expected)


def test_stack_and_concatenate_match_numpy() -> None:
    parts = [BASE[i] for i in range(2)]
    lazies = [lazy(part) for part in parts]
    for axis in (0, 1, -1):
        stacked = suture.stack(lazies, axis=axis)
        np.testing.assert_array_equal(stacked.read(), np.stack(parts, axis=axis))
        joined = suture.concatenate(lazies, axis=axis)
        np.testing.assert_array_equal(joined.read(), np.concatenate(parts, axis=axis))
    joined = suture.concatenate([lazy(BASE[0]), lazy(BASE[1][:1])], axis=0)
    np.testing.assert_array_equal(
        joined[[3, 0, 3, 1]].read(), np.concatenate([BASE[0], BASE[1][:1]])[[3, 0, 3, 1]]
    )
    np.testing.assert_array_equal(joined[::-2].read(), np.concatenate([BASE[0], BASE[1][:1]])[::-2])


def test_stack_promotes_dtypes_like_numpy() -> None:
    mixed = suture.stack([lazy(np.ones(2, np.int8)), lazy(np.ones(2, np.float32))])
    assert mixed.dtype == np.stack([np.ones(2, np.int8), np.ones(2, np.float32)]).dtype


def test_bfloat16_and_float8_casts() -> None:
    x = lazy(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))
    for name in ("bfloat16", "float16", "float8_e4m3fn", "int8"):
        view = x.astype(name)
        assert view.dtype.name == name
        np.testing.assert_array_equal(view.read(), x.read().astype(view.dtype))
    assert x.astype(jnp.bfloat16).dtype == np.dtype(ml_dtypes.bfloat16)


def test_map_infers_shape_with_jax_and_reads_when_asked() -> None:
    a = lazy(np.arange(6, dtype=np.float32).reshape(2, 3))
    summed = suture.map(lambda x: jnp.sum(x, axis=0), a)
    assert summed.shape == (3,) and summed.dtype == np.float32
    np.testing.assert_array_equal(summed.read(), np.arange(6).reshape(2, 3).sum(0))
    averaged = suture.map(lambda x, y: (x + y) / 2, a, a, elementwise=True)
    np.testing.assert_array_equal(averaged[1].read(), a.read()[1])


def test_map_with_numpy_function_runs_it_on_small_inputs_and_needs_shape_for_large() -> None:
    a = lazy(np.arange(4, dtype=np.float32))
    small = suture.map(lambda x: np.asarray(x).cumsum(), a)  # jax cannot trace it: run once
    assert (small.shape, small.dtype) == ((4,), np.float32)
    large = lazy(np.zeros((1 << 21,), np.float32))
    with pytest.raises(suture.SurgeryError, match="Pass shape= and dtype= to suture.map"):
        suture.map(lambda x: np.asarray(x).cumsum(), large)
    cumulative = suture.map(lambda x: np.cumsum(x), a, shape=(4,), dtype=np.float32)
    np.testing.assert_array_equal(cumulative.read(), np.cumsum(np.arange(4, dtype=np.float32)))


def test_map_that_lies_about_its_shape_fails_on_read() -> None:
    liar = suture.map(lambda x: np.zeros(3), lazy(np.ones(4)), shape=(4,), dtype=np.float64)
    with pytest.raises(suture.ShapeMismatchError, match=r"returned shape \(3,\), expected \(4,\)"):
        liar.read()


def test_views_of_stored_arrays_read_only_their_member(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    layers = {f"layer{i}": rng.standard_normal((256, 256), dtype=np.float32) for i in range(4)}
    ocp.PyTreeCheckpointer().save(tmp_path / "ckpt", layers)
    ckpt = suture.open(tmp_path / "ckpt")
    stacked = (
        suture.stack([ckpt[f"layer{i}"] for i in range(4)]).astype("bfloat16").transpose(0, 2, 1)
    )
    stacked[0].read()  # first read also loads the checkpoint's index
    with count_bytes_read() as one_member:
        member = stacked[2].read()
    np.testing.assert_array_equal(member, layers["layer2"].T.astype(ml_dtypes.bfloat16))
    with count_bytes_read() as everything:
        stacked.read()
    assert one_member.bytes * 3.5 < everything.bytes


def test_description_needs_no_read() -> None:
    x = lazy()
    assert (x.shape, x.ndim, x.size, x.nbytes, len(x)) == ((2, 3, 4, 5), 4, 120, 480, 2)
    assert repr(x[0]) == "LazyArray(path='w', shape=(3, 4, 5), dtype=int32)"
    assert suture.stack([lazy(), lazy(BASE + 1)]).path == "w"
    assert x[0].sources()[0].path == "w"


def test_item_reads_one_element() -> None:
    assert lazy(np.asarray(3.5)).item() == 3.5
    with pytest.raises(suture.SurgeryError, match=r"item\(\) of 'w' needs exactly one element"):
        lazy().item()


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ((0, 0, 0, 0, 0), r"Too many indices of 'w': the array has 4 axes"),
        ((5,), r"Index 5 is out of bounds for axis 0 of 'w', which has length 2"),
        ((Ellipsis, Ellipsis), r"more than one '\.\.\.'"),
        (([0, 1], [0, 1]), r"more than one array.*Index one axis at a time"),
        ((slice(None), [7]), r"Index array for axis 1 of 'w' holds values outside"),
        ((np.array([True]),), r"Boolean index for axis 0 of 'w' has shape \(1,\); expected \(2,\)"),
        (("a",), r"Unsupported index 'a' of 'w'"),
    ],
)
def test_bad_indices_are_clear_errors(index, message) -> None:
    with pytest.raises(suture.InvalidIndexError, match=message):
        lazy()[index]


def test_bad_operations_are_clear_errors() -> None:
    x = lazy()
    with pytest.raises(
        suture.ShapeMismatchError, match=r"Cannot reshape 'w' with 120 elements to \(7, 7\)"
    ):
        x.reshape(7, 7)
    with pytest.raises(suture.ShapeMismatchError, match=r"120 is not a multiple of 7"):
        x.reshape(7, -1)
    with pytest.raises(suture.InvalidIndexError, match=r"expected a permutation of \(0, 1, 2, 3\)"):
        x.transpose(0, 0, 1, 2)
    with pytest.raises(suture.ShapeMismatchError, match=r"does not fit .* Slice or pad"):
        suture.stack([x, x[0]])
    with pytest.raises(suture.ShapeMismatchError, match=r"along axis 1"):
        suture.concatenate([x, x[:, :, :2, :2]], axis=1)
    with pytest.raises(suture.SurgeryError, match="Unknown dtype 'float77'"):
        x.astype("float77")
    with pytest.raises(suture.ShapeMismatchError, match="at least one array"):
        suture.stack([])


index_entry = st.one_of(
    st.integers(-3, 2),
    st.builds(
        slice,
        st.none() | st.integers(-4, 4),
        st.none() | st.integers(-4, 4),
        st.sampled_from([None, 1, 2, -1, -2]),
    ),
    st.just(None),
    st.lists(st.integers(-2, 1), min_size=0, max_size=3).map(np.array),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(index_entry, max_size=3), min_size=1, max_size=3))
def test_chains_of_views_match_numpy(chain) -> None:
    expected = BASE
    view = lazy()
    for raw_index in chain:
        index = tuple(raw_index)
        try:
            expected_next = expected[index]
        except (IndexError, ValueError, TypeError):
            continue  # numpy refuses it; suture is expected to refuse too, checked elsewhere
        arrays = sum(isinstance(entry, np.ndarray) for entry in index)
        if arrays > 1:
            continue
        expected, view = expected_next, view[index]
    assert view.shape == expected.shape
    np.testing.assert_array_equal(view.read(), expected)
