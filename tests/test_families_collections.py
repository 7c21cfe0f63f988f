"""MaxText's variable collections beside its parameters (`families._collections`)."""

from __future__ import annotations

import pytest

import suture
from suture.families._collections import gathered, root_of


def test_a_collections_leaves_are_read_where_the_parameters_are() -> None:
    flat = {"params/Tid2EidVar/decoder/t": 1, "params/params/decoder/w": 2, "step": 0}
    assert gathered(flat, {"Tid2EidVar"}) == {
        "params/params/decoder/w": 2,
        "step": 0,
        "params/params/decoder/t": 1,
    }
    assert root_of(None) == "params/params/" and root_of("MoEBiasVar") == "params/MoEBiasVar/"


def test_a_leaf_in_a_collection_and_in_the_parameters_is_refused() -> None:
    flat = {"params/Tid2EidVar/decoder/t": 1, "params/params/decoder/t": 2}
    with pytest.raises(suture.SurgeryError, match=r"both 'params/Tid2EidVar/decoder/t' and"):
        gathered(flat, {"Tid2EidVar"})


def test_a_leaf_in_two_collections_is_refused_not_one_dropped() -> None:
    flat = {"params/Tid2EidVar/decoder/t": 1, "params/MoEBiasVar/decoder/t": 2}
    with pytest.raises(
        suture.SurgeryError,
        match=r"both 'params/Tid2EidVar/decoder/t' and 'params/MoEBiasVar/decoder/t'",
    ):
        gathered(flat, ["Tid2EidVar", "MoEBiasVar"])
