"""safetensors output as Hugging Face lays it out, loaded by transformers' own model classes.

A path ending in ``.safetensors`` is one file; any other path is a folder as
``save_pretrained`` writes it. Side files of a Hugging Face source folder come along, but
only regular files inside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture.cli import app

torch = pytest.importorskip("torch", reason="transformers' models need torch (the dev extra)")
transformers = pytest.importorskip("transformers", reason="in the dev extra")

runner = CliRunner()


def tiny_llama(folder: Path, max_shard_size: str = "5GB") -> transformers.PreTrainedModel:
    """A randomly initialised 2-layer Llama, saved by transformers with a tokenizer-like file."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    return model


def logits(model: transformers.PreTrainedModel) -> np.ndarray:
    tokens = torch.arange(12).reshape(2, 6) % 64
    with torch.no_grad():
        return model(tokens).logits.numpy()


def test_save_to_a_folder_writes_what_from_pretrained_loads(tmp_path: Path) -> None:
    source = tiny_llama(tmp_path / "hf")
    suture.save(tmp_path / "hf", tmp_path / "hf_out", format="safetensors", progress=False)
    written = sorted(p.name for p in (tmp_path / "hf_out").iterdir())
    assert written == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer_config.json",
    ]
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf_out").eval()
    np.testing.assert_array_equal(logits(loaded), logits(source))


def test_convert_through_orbax_and_back_to_shards_loads_in_transformers(tmp_path: Path) -> None:
    source = tiny_llama(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    suture.convert(tmp_path / "hf", tmp_path / "orbax", progress=False)
    done = runner.invoke(
        app, ["convert", str(tmp_path / "orbax"), str(tmp_path / "back"), "--format", "safetensors"]
    )
    assert done.exit_code == 0, done.output
    back = tmp_path / "back"
    assert (back / "config.json").read_bytes() == (tmp_path / "hf" / "config.json").read_bytes()
    index = json.loads((back / "model.safetensors.index.json").read_text())
    original = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == original["weight_map"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(back).eval()
    np.testing.assert_array_equal(logits(loaded), logits(source))


def test_a_transformed_tree_to_a_folder_is_model_safetensors(tmp_path: Path) -> None:
    tree = {"layer": {"weight": np.ones((2, 2), np.float32)}}
    suture.save(tree, tmp_path / "plain", format="safetensors", progress=False)
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["model.safetensors"]
    assert load_file(tmp_path / "plain" / "model.safetensors")["layer.weight"].shape == (2, 2)
    suture.save(tree, tmp_path / "one.safetensors", format="safetensors", progress=False)
    assert (tmp_path / "one.safetensors").is_file()
    assert load_file(tmp_path / "one.safetensors")["layer.weight"].shape == (2, 2)


def test_shards_into_one_file_are_refused(tmp_path: Path) -> None:
    tree = {f"w{i}": np.ones(64, np.float32) for i in range(3)}
    with pytest.raises(
        suture.SurgeryError,
        match=r"need 3 shard files, but the output is one '\.safetensors' file\. Give a folder",
    ):
        suture.save(
            tree,
            tmp_path / "m.safetensors",
            format="safetensors",
            max_shard_size=300,
            progress=False,
        )
    assert list(tmp_path.iterdir()) == []


def test_shards_convert_to_a_single_file_without_the_side_files(tmp_path: Path) -> None:
    tree = {f"layer{i}": {"w": np.full(64, i, np.float32)} for i in range(3)}
    suture.save(tree, tmp_path / "hf", format="safetensors", max_shard_size=300, progress=False)
    (tmp_path / "hf" / "config.json").write_text("{}")
    suture.convert(tmp_path / "hf", tmp_path / "out.safetensors", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "out.safetensors"]
    loaded = load_file(tmp_path / "out.safetensors")
    assert sorted(loaded) == ["layer0.w", "layer1.w", "layer2.w"]
    np.testing.assert_array_equal(loaded["layer2.w"], tree["layer2"]["w"])


def test_links_and_outside_files_are_not_copied(tmp_path: Path) -> None:
    secret = tmp_path / "secret_key"
    secret.write_text("PRIVATE KEY")
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"a.w": np.ones(4, np.float32)}, folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    os.symlink(secret, folder / "tokenizer.json")
    os.symlink(folder / "config.json", folder / "linked_config.json")
    os.mkfifo(folder / "vocab.txt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        suture.convert(folder, tmp_path / "out", format="safetensors", progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    messages = sorted(str(w.message) for w in caught if "Not copying" in str(w.message))
    assert len(messages) == 3, messages
    assert "linked_config.json': it is a symbolic link" in messages[0]
    assert "tokenizer.json': it is a symbolic link" in messages[1]
    assert "vocab.txt': it is not a regular file" in messages[2]
    # The CLI path goes through the same check.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = runner.invoke(app, ["convert", str(folder), str(tmp_path / "orbax")])
    assert done.exit_code == 0, done.output
    assert len([w for w in caught if "Not copying" in str(w.message)]) == 3
    assert not (tmp_path / "orbax" / "tokenizer.json").exists()
    assert (tmp_path / "orbax" / "config.json").is_file()


def test_side_file_names_from_orbax_metadata_stay_inside(tmp_path: Path) -> None:
    """A hostile layout record naming ``../secret_key`` copies nothing from outside."""
    (tmp_path / "secret_key").write_text("PRIVATE KEY")
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"a.w": np.ones(4, np.float32)}, folder / "model.safetensors")
    suture.convert(folder, tmp_path / "orbax", progress=False)
    layout = suture.open(tmp_path / "orbax").custom_metadata["suture.safetensors_layout"]
    suture.save(
        suture.open(tmp_path / "orbax"),
        tmp_path / "hostile",
        metadata={"suture.safetensors_layout": {**layout, "side_files": ["../secret_key"]}},
        progress=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        suture.convert(tmp_path / "hostile", tmp_path / "out", format="safetensors", progress=False)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.safetensors"]
    messages = [str(w.message) for w in caught]
    assert any("secret_key': its name is not a plain file name" in m for m in messages), messages


def test_the_command_line_prints_a_skipped_link_as_one_warning_line(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"a.w": np.ones(4, np.float32)}, folder / "model.safetensors")
    os.symlink(tmp_path / "elsewhere.json", folder / "tokenizer.json")
    done = subprocess.run(
        [sys.executable, "-m", "suture", "convert", str(folder), str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        f"Warning: Not copying {str(folder / 'tokenizer.json')!r}: it is a symbolic link. Only "
        f"regular files inside the model folder are copied; copy it by hand if you trust it."
    )
