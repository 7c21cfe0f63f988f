"""CheckpointManager and v1 items: paths named as Orbax's own restore names them.

A leaf's path must not depend on which other items a step holds, and JSON items are part
of the tree, not dropped. Each test restores the same step with stock Orbax and compares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import orbax.checkpoint.experimental.v1 as ocp_v1
import pytest

import suture

STATE = {"w": np.arange(4, dtype=np.float32)}
META = {"lr": 0.1, "name": "run-7", "sizes": [1, 2]}


def manager_save(root: Path, **items: ocp.args.CheckpointArgs) -> None:
    with ocp.CheckpointManager(root, item_names=tuple(items)) as manager:
        manager.save(1, args=ocp.args.Composite(**items))
        manager.wait_until_finished()


def manager_restore(root: Path, **handlers: ocp.CheckpointHandler) -> dict:
    with ocp.CheckpointManager(root, item_names=tuple(handlers), item_handlers=handlers) as m:
        return dict(m.restore(1))


@pytest.mark.parametrize("other", ["json", "pytree", "none"])
def test_a_named_item_keeps_its_name_whatever_else_the_step_holds(
    tmp_path: Path, other: str
) -> None:
    items: dict = {"state": ocp.args.StandardSave(STATE)}
    handlers: dict = {"state": ocp.StandardCheckpointHandler()}
    if other == "json":
        items["meta"] = ocp.args.JsonSave(META)
        handlers["meta"] = ocp.JsonCheckpointHandler()
    elif other == "pytree":
        items["ema"] = ocp.args.StandardSave(STATE)
        handlers["ema"] = ocp.StandardCheckpointHandler()
    manager_save(tmp_path / "run", **items)
    restored = manager_restore(tmp_path / "run", **handlers)
    ckpt = suture.open(tmp_path / "run")
    assert sorted(ckpt.tree) == sorted(restored)  # the same top-level names as Orbax's
    np.testing.assert_array_equal(ckpt["state/w"].read(), restored["state"]["w"])
    if other == "json":
        assert ckpt.tree["meta"] == restored["meta"] == META
        assert "meta/name" in ckpt.paths() and ckpt["meta/name"] == "run-7"
        assert suture.load(ckpt)["meta"] == META


def test_json_items_load_and_plan_as_values(tmp_path: Path) -> None:
    manager_save(tmp_path / "run", state=ocp.args.StandardSave(STATE), meta=ocp.args.JsonSave(META))
    without_meta = suture.load_and_transform([suture.rules.drop("meta")], tmp_path / "run")
    assert list(without_meta) == ["state"]
    kept = suture.load_and_transform([suture.rules.drop("state")], tmp_path / "run")
    assert list(kept) == ["meta"] and kept["meta"]["lr"] == 0.1 and kept["meta"]["name"] == "run-7"


def test_the_default_item_alone_is_the_tree(tmp_path: Path) -> None:
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, args=ocp.args.StandardSave(STATE))
        manager.wait_until_finished()
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        restored = manager.restore(1)
    ckpt = suture.open(tmp_path / "run")
    assert sorted(ckpt.tree) == sorted(restored) == ["w"]


def test_v1_save_is_the_tree_and_v1_checkpointables_are_named(tmp_path: Path) -> None:
    ocp_v1.save(tmp_path / "alone", STATE)
    assert sorted(suture.open(tmp_path / "alone").tree) == ["w"]
    assert sorted(ocp_v1.load(tmp_path / "alone")) == ["w"]
    ocp_v1.save_checkpointables(tmp_path / "both", {"state": STATE, "extra": STATE})
    restored = ocp_v1.load_checkpointables(tmp_path / "both")
    assert sorted(suture.open(tmp_path / "both").tree) == sorted(restored) == ["extra", "state"]


def test_a_broken_json_item_is_a_clear_error(tmp_path: Path) -> None:
    manager_save(tmp_path / "run", state=ocp.args.StandardSave(STATE), meta=ocp.args.JsonSave(META))
    (tmp_path / "run" / "1" / "meta" / "metadata").write_text("{not json")
    with pytest.raises(suture.CorruptCheckpointError, match=r"meta/metadata' as JSON .* restore"):
        suture.open(tmp_path / "run")
