"""One Hugging Face tensor feeding several target leaves (`families/_shared_sources.py`).

docs/recipe-tables.md's my_llama_shared_kv.yaml, run as it is written, on a tiny Llama whose
keys and values share one projection (saved by transformers, its v_proj removed): k_proj
feeds both MaxText's key kernel (rotary halves interleaved) and its value kernel (not). Back
to HF, k_proj is written once, bit for bit; a checkpoint whose two kernels no longer agree is
refused naming the tensor and both leaves, and nothing is written.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import suture
from suture import families
from suture._paths import unflatten

from .test_families import _assert_same_tensors, _cli, _tensors

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

E, KV, D = 32, 2, 8
KEY = "decoder/layers/self_attention/key/kernel"
VALUE = "decoder/layers/self_attention/value/kernel"


def _docs_table(folder: Path) -> Path:
    """docs/recipe-tables.md's my_llama_shared_kv.yaml, as written, in `folder`."""
    page = (Path(__file__).parents[1] / "docs" / "recipe-tables.md").read_text()
    (block,) = re.findall(r"```yaml\n(  # file: my_llama_shared_kv\.yaml\n.*?)  ```", page, re.S)
    path = folder / "my_llama_shared_kv.yaml"
    path.write_text(textwrap.dedent(block))
    return path


@pytest.fixture(scope="module")
def shared_kv(tmp_path_factory):
    """(an HF folder of a Llama with k_proj and no v_proj, the docs' table)."""
    from safetensors.numpy import load_file, save_file

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=E,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=KV,
        head_dim=D,
    )
    root = tmp_path_factory.mktemp("shared_kv")
    folder = root / "hf"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    (file,) = folder.glob("*.safetensors")
    tensors = {k: v for k, v in load_file(file).items() if ".v_proj." not in k}
    save_file(tensors, file, metadata={"format": "pt"})
    return folder, _docs_table(root)


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_the_docs_shared_source_table_converts_both_ways(tmp_path, shared_kv, layout):
    """k_proj goes to both kernels, each through its own operations, and comes back once."""
    folder, table = shared_kv
    recipe = f"{table}:{layout}"
    suture.convert(folder, tmp_path / "mt", recipe=recipe, progress=False)
    tree = suture.open(tmp_path / "mt")

    def layer_1(path):
        if layout == "maxtext":
            return tree[f"params/params/{path}"].read()[:, 1]
        return tree[f"params/params/{path.replace('layers/', 'layers_1/')}"].read()

    k = _tensors(folder)["model.layers.1.self_attn.k_proj.weight"]
    value, key = layer_1(VALUE), layer_1(KEY)
    np.testing.assert_array_equal(value, k.T.reshape(E, KV, D))
    np.testing.assert_array_equal(key[..., 0::2], value[..., : D // 2])  # halves into pairs
    np.testing.assert_array_equal(key[..., 1::2], value[..., D // 2 :])
    suture.convert(tmp_path / "mt", tmp_path / "back", recipe=recipe, reverse=True, progress=False)
    _assert_same_tensors(folder, tmp_path / "back")  # k_proj once, no v_proj


def _changed_checkpoint(source: Path, target: Path, change) -> None:
    """The MaxText checkpoint at `source` with its value kernel changed by `change`."""
    tree = suture.open(source)
    flat = {path: np.asarray(tree[path].read()) for path in tree.paths()}
    flat[f"params/params/{VALUE}"] = change(flat[f"params/params/{VALUE}"])
    suture.save(unflatten(flat), target, progress=False)


def test_leaves_that_no_longer_agree_are_refused_naming_both(tmp_path, shared_kv):
    """One value of the value kernel changed (as if trained apart): refused, nothing written."""
    folder, table = shared_kv
    suture.convert(folder, tmp_path / "mt", recipe=str(table), progress=False)

    def one_changed(value):
        value = value.copy()
        value[3, 1, 1, 2] += 1  # layer 1 (the scan axis), key head 1
        return value

    _changed_checkpoint(tmp_path / "mt", tmp_path / "apart", one_changed)
    message = (
        rf"Hugging Face tensor 'model\.layers\.1\.self_attn\.k_proj\.weight' feeds MaxText "
        rf"leaves '{KEY}' and '{VALUE}' .* give it back different values: 1 of .* differ"
    )
    with pytest.raises(families.ConfigMismatchError, match=message):
        suture.convert(
            tmp_path / "apart",
            tmp_path / "back",
            recipe=str(table),
            reverse=True,
            config=folder / "config.json",
            progress=False,
        )
    assert not (tmp_path / "back").exists()


def test_leaves_giving_back_other_dtypes_are_refused_before_reading(tmp_path, shared_kv):
    folder, table = shared_kv
    suture.convert(folder, tmp_path / "mt", recipe=str(table), progress=False)
    _changed_checkpoint(tmp_path / "mt", tmp_path / "apart", lambda v: v.astype(np.float64))
    with pytest.raises(families.ConfigMismatchError, match=rf"'{KEY}' and '{VALUE}'.*float64"):
        suture.convert(
            tmp_path / "apart",
            tmp_path / "back",
            recipe=str(table),
            reverse=True,
            config=folder / "config.json",
            progress=False,
        )
    assert not (tmp_path / "back").exists()


def test_recipes_shows_the_shared_source(shared_kv):
    folder, table = shared_kv
    shown = _cli("recipes", str(table), "--config", str(folder / "config.json"))
    assert shown.exit_code == 0, shown.output
    assert f"its source also feeds {VALUE}; written back once" in shown.output
    assert f"its source also feeds {KEY}; written back once" in shown.output
