"""Error paths not covered elsewhere: each raises a SurgeryError whose message says what to do."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture import rules
from tests.orbax_writers import save_manager, save_standard


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    save_standard(tmp_path / "ckpt", {"w": np.ones(2, np.float32)})
    return tmp_path / "ckpt"


def test_open_options_that_do_not_apply(tmp_path: Path, ckpt: Path) -> None:
    with pytest.raises(
        suture.SurgeryError,
        match=r"is a single checkpoint, not a CheckpointManager folder, so step=3",
    ):
        suture.open(ckpt, step=3)
    save_manager(tmp_path / "run", {"w": np.ones(2)}, steps=(1,))
    with pytest.raises(
        suture.SurgeryError, match=r"is one checkpoint step, so step=1 does not apply"
    ):
        suture.open(tmp_path / "run" / "1", step=1)
    with pytest.raises(
        suture.SurgeryError, match=r"format='memory' is for in-memory trees, not paths"
    ):
        suture.open(ckpt, format="memory")
    with pytest.raises(
        suture.SurgeryError,
        match=r"step= applies to CheckpointManager folders, not in-memory trees",
    ):
        suture.open({"w": np.ones(2)}, step=1)
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    with pytest.raises(
        suture.SurgeryError,
        match=r"step= applies to Orbax CheckpointManager folders, not safetensors files",
    ):
        suture.open(tmp_path / "m.safetensors", step=1)


def _index(folder: Path, weight_map: dict) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )


def test_safetensors_folder_and_index_problems(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(
        suture.NotACheckpointError, match=r"holds no .safetensors file and no index"
    ):
        suture.open(folder, format="safetensors")
    save_file({"a": np.ones(2, np.float32)}, folder / "one.safetensors")
    save_file({"a": np.ones(2, np.float32)}, folder / "two.safetensors")
    with pytest.raises(suture.CorruptCheckpointError, match=r"Tensor 'a' appears in two shards"):
        suture.open(folder)
    _index(folder, {"a": "../elsewhere.safetensors"})
    with pytest.raises(
        suture.CorruptCheckpointError,
        match=r"names a shard outside its folder; refusing to read it",
    ):
        suture.open(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(
        suture.CorruptCheckpointError, match=r"has no 'weight_map' of tensor names to shard files"
    ):
        suture.open(folder)
    (folder / "two.safetensors").unlink()
    _index(folder, {"a": "one.safetensors", "b": "one.safetensors"})
    with pytest.raises(
        suture.CorruptCheckpointError, match=r"lists tensor 'b', which no shard holds"
    ):
        suture.open(folder)


def test_fortran_ordered_npz_members_are_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "f.npz", w=np.asfortranarray(np.ones((3, 4), np.float32)))
    with pytest.raises(suture.CorruptCheckpointError, match=r"Member 'w' .* is Fortran-ordered"):
        suture.open(tmp_path / "f.npz")


def test_init_contract_errors(ckpt: Path) -> None:
    with pytest.raises(
        suture.SurgeryError,
        match=r"init for 'b' is a function, but the target leaf gives no shape and dtype",
    ):
        suture.load(ckpt, {"w": np.ndarray, "b": np.ndarray}, init={"b": np.zeros})
    with pytest.raises(suture.MissingLeafError, match=r"'b'.*init= has no entry for it either"):
        suture.load(ckpt, {"w": np.ndarray, "b": np.ndarray}, init={"c": np.ones(2)})
    with pytest.raises(
        suture.MissingLeafError, match=r"The init function's tree has no such leaf either"
    ):
        suture.load(
            ckpt,
            {"w": np.ndarray, "b": jax.ShapeDtypeStruct((2,), jnp.float32)},
            init=lambda: {"c": jnp.ones(2)},
        )


def test_rule_errors(ckpt: Path) -> None:
    tree = {"layers": np.ones((3, 2)), "layer1": np.ones(2), "layer01": np.ones(2)}
    with pytest.raises(rules.RuleError, match=r"into= must hold '\{i\}' where the index goes"):
        rules.apply_rules([rules.unstack("layers", into="layer")], tree)
    with pytest.raises(
        rules.RuleError,
        match=r"'layers' has shape \(3, 2\), which has no axis 5 \(valid: -2 to 1\)",
    ):
        rules.apply_rules([rules.unstack("layers", into="l{i}", axis=5)], tree)
    with pytest.raises(
        rules.RuleError,
        match=r"'layer01' and 'layer1' both have index 1|'layer1' and 'layer01' both have index 1",
    ):
        rules.apply_rules([rules.stack(r"layer(\d+)", into="stacked")], tree)


def test_save_errors(tmp_path: Path) -> None:
    with pytest.raises(
        suture.SurgeryError, match=r"An Orbax checkpoint needs a tree; wrap the array"
    ):
        suture.save(np.ones(2), tmp_path / "a", progress=False)
    with pytest.raises(
        suture.SurgeryError, match=r"Two leaves get the tensor name 'a_b'; choose another separator"
    ):
        suture.save(
            {"a": {"b": np.ones(1)}, "a_b": np.ones(1)},
            tmp_path / "m.safetensors",
            format="safetensors",
            separator="_",
            progress=False,
        )
    with pytest.raises(
        suture.SurgeryError, match=r"safetensors metadata must map strings to strings"
    ):
        suture.save(
            {"w": np.ones(1)},
            tmp_path / "m.safetensors",
            format="safetensors",
            metadata={"n": 1},
            progress=False,
        )
    with pytest.raises(suture.SurgeryError, match=r"extra_files= needs a folder output"):
        suture.save(
            {"w": np.ones(1)},
            tmp_path / "m.safetensors",
            format="safetensors",
            extra_files={"c.json": tmp_path / "x"},
            progress=False,
        )
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(
        suture.SurgeryError, match=r"extra file name '../c.json' must be a plain file name"
    ):
        suture.save(
            {"w": np.ones(1)},
            tmp_path / "out",
            extra_files={"../c.json": tmp_path / "c.json"},
            progress=False,
        )
    with pytest.raises(
        suture.SurgeryError, match=r"Shard file name '../w.safetensors' must be a plain file name"
    ):
        suture.save(
            {"w": np.ones(1)},
            tmp_path / "hf",
            format="safetensors",
            shard_map={"w": "../w.safetensors"},
            progress=False,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_merge_parameter_and_config_errors(tmp_path: Path) -> None:
    from suture._merge.config import load_merge_config

    a, b = {"w": np.ones(4, np.float32)}, {"w": np.zeros(4, np.float32)}
    with pytest.raises(
        suture.MergeError, match=r"ties parameter 'density' must be in \[0, 1\]; got -0.5"
    ):
        suture.merge([a, b], "ties", base=a, params={"density": -0.5})
    with pytest.raises(
        suture.MergeError, match=r"dare parameter 'drop' must be in \[0, 1\); got 1.0"
    ):
        suture.merge([a, b], "dare", base=a, params={"drop": 1.0})
    with pytest.raises(
        suture.MergeError,
        match=r"Leaf 'w': linear merge weights sum to 0 and cannot be normalized; pass normalize",
    ):
        suture.merge([a, b], "linear", weights=[1, -1])
    with pytest.raises(suture.MergeError, match=r"Leaf 'w' is missing from the base model"):
        suture.merge([a, b], "task_arithmetic", base={"other": np.ones(4, np.float32)})
    with pytest.raises(suture.MergeError, match=r"Leaf 'v': take=1, but model 1 lacks it"):
        suture.merge(
            [{"v": np.ones(2)}, {}], "linear", missing="available", per_leaf={"v": {"take": 1}}
        )
    with pytest.raises(suture.MergeError, match=r"Merge config .* does not exist"):
        load_merge_config(str(tmp_path / "none.yaml"))
    config = tmp_path / "m.yaml"
    config.write_text("models: [a]\n")
    with pytest.raises(suture.MergeError, match=r"needs method:"):
        load_merge_config(str(config))
    config.write_text("method: linear\nmodels: a\n")
    with pytest.raises(
        suture.MergeError, match=r"line 2 \(models\): models: must be a list of checkpoint paths"
    ):
        load_merge_config(str(config))
    config.write_text("- just a list\n")
    with pytest.raises(
        suture.MergeError, match=r"must be a mapping \(method: and models:, or mergekit's"
    ):
        load_merge_config(str(config))


def test_dtype_cannot_follow_a_transformations_tree() -> None:
    from suture._surgery.recipes import with_cast

    with pytest.raises(
        suture.SurgeryError, match=r"--dtype cannot follow an Orbax-style transformations tree"
    ):
        with_cast({"a": suture.Transform()}, "bfloat16")


def test_nnx_value_keys_that_collide() -> None:
    from suture.nnx import strip_variable_keys

    with pytest.raises(suture.SurgeryError, match=r"both become 'k' without their value key"):
        strip_variable_keys({"k": {"value": 1, "raw_value": 2}})
