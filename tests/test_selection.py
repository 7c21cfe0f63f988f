"""suture._lazy.selection: selections, checked against numpy's own indexing.

A selection has one entry per axis (a ``range`` or a 1-D integer array) and indexes each
axis on its own. `parse_index` must give numpy's meaning to what users write between
brackets; `compose` must give ``base[outer][inner]`` directly on ``base``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suture._errors import InvalidIndexError
from suture._lazy.selection import (
    as_range,
    compose,
    full,
    is_full,
    outer_index,
    parse_index,
    positions,
    selection_shape,
    to_slice,
)

FAST = settings(max_examples=150, deadline=None)


def apply_parsed(array: np.ndarray, index: Any) -> np.ndarray:
    """``array[index]`` as suture computes it: the selection, then drop, insert, move."""
    parsed = parse_index(index, array.shape)
    values = outer_index(array, parsed.selection)
    kept = [n for axis, n in enumerate(values.shape) if axis not in parsed.dropped_axes]
    values = values.reshape(kept)
    for position in parsed.new_axes:
        values = np.expand_dims(values, position)
    assert values.shape == parsed.shape
    if parsed.array_axis_to_front is not None:
        values = np.moveaxis(values, parsed.array_axis_to_front, 0)
    return values


@st.composite
def slices(draw: st.DrawFn, length: int) -> slice:
    bound = st.none() | st.integers(-length - 2, length + 2)
    step = draw(st.none() | st.integers(-3, 3).filter(bool))
    return slice(draw(bound), draw(bound), step)


@st.composite
def arrays_and_indices(draw: st.DrawFn) -> tuple[np.ndarray, Any]:
    """An array of up to 4 axes and an index numpy and suture both support."""
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
    array = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    entries: list[Any] = []
    array_used = False
    for length in shape:
        kinds = ["slice", "full"] + (["int"] if length else [])
        if not array_used:
            kinds += ["ints", "bools"]
        kind = draw(st.sampled_from(kinds))
        if kind == "slice":
            entries.append(draw(slices(length)))
        elif kind == "full":
            entries.append(slice(None))
        elif kind == "int":
            value = draw(st.integers(-length, length - 1))
            entries.append(draw(st.sampled_from([value, np.int64(value)])))
        elif kind == "ints":
            array_used = True
            picks = st.integers(-length, length - 1) if length else st.nothing()
            values = draw(st.lists(picks, max_size=5)) if length else []
            entries.append(np.asarray(values, dtype=np.int64))
        else:
            array_used = True
            entries.append(
                np.asarray(draw(st.lists(st.booleans(), min_size=length, max_size=length)), bool)
            )
    # drop trailing entries (implied full slices), or stand an Ellipsis for a run of them
    form = draw(st.sampled_from(["all", "short", "ellipsis"]))
    if form == "short":
        entries = entries[: draw(st.integers(0, len(entries)))]
    elif form == "ellipsis":
        start = draw(st.integers(0, len(entries)))
        stop = draw(st.integers(start, len(entries)))
        entries[start:stop] = [Ellipsis]
    for _ in range(draw(st.integers(0, 2))):  # new axes anywhere
        entries.insert(draw(st.integers(0, len(entries))), None)
    if len(entries) == 1 and draw(st.booleans()):
        return array, entries[0]  # x[i], not x[(i,)]
    return array, tuple(entries)


@FAST
@given(arrays_and_indices())
def test_parse_index_has_numpys_meaning(case: tuple[np.ndarray, Any]) -> None:
    array, index = case
    expected = array[index]
    actual = apply_parsed(array, index)
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


def test_an_ellipsis_of_no_axes_still_separates_an_integer_from_an_array() -> None:
    array = np.arange(60).reshape(3, 4, 5)
    index = (slice(None), 0, Ellipsis, [1, 2])
    assert array[index].shape == (2, 3)  # numpy: the array's axis first
    np.testing.assert_array_equal(apply_parsed(array, index), array[index])


@st.composite
def axis_selections(draw: st.DrawFn, length: int) -> Any:
    """An axis selection of an axis of `length`: a range (from a slice) or a gather."""
    if draw(st.booleans()):
        return range(length)[draw(slices(length))]
    picks = st.integers(0, length - 1) if length else st.nothing()
    return np.asarray(draw(st.lists(picks, max_size=6)) if length else [], dtype=np.int64)


@st.composite
def composed(draw: st.DrawFn) -> tuple[int, Any, Any]:
    length = draw(st.integers(0, 12))
    outer = draw(axis_selections(length))
    inner = draw(axis_selections(len(outer)))
    return length, outer, inner


@FAST
@given(composed())
def test_compose_is_indexing_twice(case: tuple[int, Any, Any]) -> None:
    length, outer, inner = case
    base = np.arange(length)
    once = compose(outer, inner)
    twice = base[np.asarray(positions(outer), dtype=np.int64)][
        np.asarray(positions(inner), dtype=np.int64)
    ]
    assert list(positions(once)) == twice.tolist()
    if isinstance(outer, range) and isinstance(inner, range):
        assert isinstance(once, range)  # strided runs stay runs: no index arrays


@FAST
@given(st.integers(0, 12).flatmap(lambda n: st.tuples(st.just(n), slices(n))))
def test_to_slice_selects_the_range(case: tuple[int, slice]) -> None:
    length, written = case
    axis = range(length)[written]
    items = list(range(100, 100 + length))
    assert items[to_slice(axis)] == [items[i] for i in axis]
    assert positions(axis) is axis


def test_to_slice_of_a_descending_range_to_the_start() -> None:
    """range(2, -1, -1) is [2, 1, 0]; the slice 2:-1:-1 would be empty."""
    assert [0, 1, 2, 3][to_slice(range(2, -1, -1))] == [2, 1, 0]
    assert [0, 1, 2][to_slice(range(0))] == []


@FAST
@given(st.lists(st.integers(-20, 20), max_size=8))
def test_as_range_keeps_the_positions(values: list[int]) -> None:
    indices = np.asarray(values, dtype=np.int64)
    result = as_range(indices)
    assert list(positions(result)) == values
    steps = set(np.diff(indices).tolist())
    progression = len(values) <= 1 or (len(steps) == 1 and 0 not in steps)
    assert isinstance(result, range) == progression


def test_positions_of_a_gather_are_a_list() -> None:
    assert positions(np.asarray([3, 1, 3])) == [3, 1, 3]
    assert positions(range(1, 7, 2)) == range(1, 7, 2)


def test_full_is_full_and_selection_shape() -> None:
    shape = (3, 0, 5)
    assert full(shape) == (range(3), range(0), range(5))
    assert is_full(full(shape), shape)
    assert selection_shape(full(shape)) == shape
    assert not is_full((range(3), range(0), range(4)), shape)
    assert not is_full((range(2, -1, -1), range(0), range(5)), shape)  # reversed
    assert not is_full((np.arange(3), range(0), range(5)), shape)  # a gather of everything
    assert selection_shape((np.asarray([0, 0, 2, 1]), range(1, 5, 2))) == (4, 2)


@FAST
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=3).flatmap(
        lambda shape: st.tuples(
            st.just(tuple(shape)), st.tuples(*(axis_selections(n) for n in shape))
        )
    )
)
def test_outer_index_indexes_each_axis_on_its_own(case: tuple[tuple[int, ...], Any]) -> None:
    shape, selection = case
    array = np.arange(int(np.prod(shape))).reshape(shape)
    expected = array[np.ix_(*(np.asarray(positions(s), dtype=np.int64) for s in selection))]
    result = outer_index(array, selection)
    assert result.shape == selection_shape(selection)
    np.testing.assert_array_equal(result, expected)
    if all(isinstance(axis, range) for axis in selection) and result.size:
        assert np.shares_memory(result, array)  # ranges only: a view, no copy


def test_parse_index_reports_drops_new_axes_and_the_array_moved_to_front() -> None:
    parsed = parse_index((1, None, slice(None), [0, 2]), (4, 5, 3))
    assert parsed.selection[0] == range(1, 2) and parsed.selection[1] == range(5)
    assert parsed.selection[2] == range(0, 4, 2)  # an arithmetic gather becomes a range
    assert parsed.dropped_axes == (0,) and parsed.new_axes == (0,)
    assert parsed.shape == (1, 5, 2)
    assert parsed.array_axis_to_front == 2  # the int and the array are not adjacent
    adjacent = parse_index((slice(None), 1, [0, 2]), (4, 5, 3))
    assert adjacent.array_axis_to_front is None
    gather = parse_index(np.asarray([3, 0, 3]), (4,))
    assert isinstance(gather.selection[0], np.ndarray)
    assert gather.selection[0].tolist() == [3, 0, 3]
    negative = parse_index(-1, (4, 2))
    assert negative.selection == (range(3, 4), range(2)) and negative.shape == (2,)


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ((0, 0, 0), r"Too many indices of 'w': the array has 2 axes \(shape \(4, 3\)\)"),
        ((Ellipsis, 0, Ellipsis), r"Index of 'w' has more than one '\.\.\.'"),
        (4, r"Index 4 is out of bounds for axis 0 of 'w', which has length 4"),
        ((0, -4), r"Index -4 is out of bounds for axis 1 of 'w', which has length 3"),
        (([0], [1]), r"more than one array; LazyArray supports one array per index"),
        (np.ones(3, bool), r"Boolean index for axis 0 of 'w' has shape \(3,\); expected \(4,\)"),
        (np.zeros((2, 2), np.int64), r"(?s)Unsupported index .* of 'w': expected an int, a slice"),
        (np.asarray([0.5]), r"Unsupported index .* of 'w'"),
        ("a", r"Unsupported index 'a' of 'w'"),
        ((slice(None), [3]), r"Index array for axis 1 of 'w' holds values outside \[-3, 3\)"),
    ],
)
def test_parse_index_errors_name_the_array(index: Any, message: str) -> None:
    with pytest.raises(InvalidIndexError, match=message):
        parse_index(index, (4, 3), path="w")
    with pytest.raises(InvalidIndexError):
        parse_index(index, (4, 3))  # without a path too


def test_parse_index_with_an_empty_array_and_booleans() -> None:
    parsed = parse_index((np.asarray([], dtype=np.int64),), (4,))
    assert parsed.shape == (0,) and len(parsed.selection[0]) == 0
    mask = np.asarray([True, False, True, True])
    assert list(positions(parse_index(mask, (4, 2)).selection[0])) == [0, 2, 3]
