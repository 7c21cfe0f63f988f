"""The tower operations as table features: docs/recipe-tables.md's example (a fused qkv split
in thirds, a 3-D patch kernel permuted, per-head biases, experts stored in either axis order)
run as it is there, a shape the same in both orders refused, and len() of a list field."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import suture
from suture import SurgeryError
from suture._errors import ConfigMismatchError, ExpressionError
from suture._lazy.array import as_lazy
from suture.families._expr import evaluate
from suture.families._stored_order import StoredOrder

PAGE = Path(__file__).resolve().parent.parent / "docs" / "recipe-tables.md"


def test_the_pages_tower_operations_example_runs(tmp_path, monkeypatch):
    section = PAGE.read_text().split("## Tower operations")[1].split("\n## ")[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    assert [language for language, _ in blocks] == ["yaml", "python"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tower_ops.yaml").write_text(blocks[0][1])
    exec(compile(blocks[1][1], str(PAGE), "exec"), {})  # noqa: S102 (the page's own code)
    assert (tmp_path / "toy_back" / "model.safetensors").exists()


def test_experts_of_a_shape_the_same_in_both_orders_are_refused():
    order = StoredOrder(("experts", "hidden", "2 * inner"), (0, 2, 1))
    square = as_lazy(np.zeros((2, 8, 8), np.float32), path="mlp.experts.gate_up_proj")
    with pytest.raises(ConfigMismatchError, match=r"same in both orders.*cannot tell"):
        order.read(square, {"experts": 2, "hidden": 8, "inner": 4}, "r")
    other = as_lazy(np.zeros((2, 8, 6), np.float32), path="w")
    with pytest.raises(SurgeryError, match=r"expected \(2, 8, 4\).*or \(2, 4, 8\)"):
        order.read(other, {"experts": 2, "hidden": 8, "inner": 2}, "r")


def test_len_counts_a_list_field_and_refuses_anything_else():
    assert evaluate("len(deepstack_visual_indexes)", {"deepstack_visual_indexes": [8, 16, 24]}) == 3
    with pytest.raises(ExpressionError, match=r"len\(\) counts the items of a list field"):
        evaluate("len(depth)", {"depth": 27})


def test_a_stored_entry_that_is_no_other_order_is_refused_naming_the_leaf(tmp_path, monkeypatch):
    section = PAGE.read_text().split("## Tower operations")[1].split("\n## ")[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    table = blocks[0][1].replace("also_permuted: [0, 2, 1]}", "also_permuted: [0, 1]}", 1)
    (tmp_path / "bad.yaml").write_text(table)
    (tmp_path / "hf").mkdir()
    with pytest.raises(SurgeryError, match=r"leaf 7 \('blocks/wi_0'\)\.stored: .*another order"):
        suture.convert(tmp_path / "hf", tmp_path / "out", recipe=tmp_path / "bad.yaml")
    assert not (tmp_path / "out").exists()
