"""Family conversions that lost data or gave wrong values silently: each now a clear error.

Issue 37, items 1, 2, 5 and 12. Fused experts past the config's count, a router with more
outputs than experts, a reverse with another model's config (same shapes, other heads), a
config.json linked from outside the folder, a padded vocabulary of 10**13 rows. Each refusal
names the tensor or field, leaves no output and the source unchanged; each valid neighbour
still converts exactly. Real tiny models (transformers' ``save_pretrained``), the CLI through
typer's runner.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

import suture
from suture.cli import app
from suture.families._convert import FAMILY_KEY, convert_with_recipe

from .test_hostile_families import FAST, LLAMA, _refused

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def _digest(folder: Path) -> dict[str, str]:
    """Every file's content hash (links followed), to show a source is unchanged."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _edit_config(folder: Path, **changes) -> dict:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return config


def _cli(*arguments: str):
    return CliRunner().invoke(app, [*map(str, arguments), "--no-progress"])


def _left_nothing(out: Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*")), list(out.parent.iterdir())


def _no_record(maxtext: Path, into: Path) -> Path:
    """The MaxText checkpoint without its recorded config: as MaxText itself would write it."""
    ckpt = suture.open(maxtext)
    metadata = dict(ckpt.custom_metadata)
    metadata[FAMILY_KEY] = {k: v for k, v in metadata[FAMILY_KEY].items() if k != "config"}
    suture.save(ckpt.tree, into, metadata=metadata, progress=False)
    return into


# Item 12: a padded vocabulary of 10**13 rows --------------------------------------------------


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gemma")
    torch.manual_seed(0)
    config = transformers.Gemma2Config(**LLAMA, head_dim=16, query_pre_attn_scalar=16)
    transformers.Gemma2ForCausalLM(config).save_pretrained(root / "hf")
    return root / "hf"


@pytest.mark.parametrize("rows", [10**13, 10**6])
def test_an_absurd_padded_vocabulary_is_refused_naming_the_field(gemma, tmp_path, rows):
    settings = json.loads((gemma / "config.json").read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**settings, "padded_vocab_size": rows}))
    started = time.perf_counter()
    with pytest.raises(suture.ConfigMismatchError, match=rf"padded_vocab_size={rows}\)"):
        convert_with_recipe(gemma, tmp_path / "out", "gemma2:maxtext", config=config)
    result = _cli(
        "convert", gemma, tmp_path / "out", "--recipe", "gemma2:maxtext", "--config", config
    )
    _refused(result, "has 64 rows", f"pads it to {rows}", "at most 65600")
    assert time.perf_counter() - started < FAST
    _left_nothing(tmp_path / "out")


def test_a_normal_padded_vocabulary_converts_exactly(gemma, tmp_path):
    settings = json.loads((gemma / "config.json").read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**settings, "padded_vocab_size": 128}))
    convert_with_recipe(gemma, tmp_path / "mt", "gemma2:maxtext", config=config, progress=False)
    embedding = suture.open(tmp_path / "mt")["params/params/token_embedder/embedding"].read()
    source = _tensors(gemma)
    assert embedding.shape == (128, 64)
    np.testing.assert_array_equal(embedding[:64], source["model.embed_tokens.weight"] * 8)
    assert not embedding[64:].any()
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", "gemma2:maxtext", reverse=True, progress=False
    )
    back = _tensors(tmp_path / "back")
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)


def test_a_pad_to_10_13_rows_plans_and_reads_without_listing_them():
    """The pad node's in-bounds part is arithmetic: no index over the padded rows."""
    from suture._lazy.combine import fit_shape
    from suture._lazy.selection import full

    base = np.arange(12.0).reshape(3, 4)
    padded = fit_shape(suture.LazyArray.from_array(base), (10**13, 6))
    ((_, inside),) = padded.node.input_selections(full(padded.shape))  # as a save plans it
    assert inside == (range(3), range(4))
    np.testing.assert_array_equal(padded[:4, :5].read(), np.pad(base, ((0, 1), (0, 1)))[:4, :5])
    assert not padded[10**13 - 3 :].read().any()
    np.testing.assert_array_equal(padded[2::-1, 3].read(), base[::-1, 3])
    assert padded[:: 10**12, :4].read()[0].tolist() == base[0].tolist()
    small = fit_shape(suture.LazyArray.from_array(base), (7, 6))
    whole = np.pad(base, ((0, 4), (0, 2)))
    for index in [
        (slice(None, None, -1),),
        (slice(1, 6, 2), slice(None, None, -2)),
        (np.array([6, 0, 2]),),
        (np.array([5, 1]), slice(3, None)),
        (slice(2, 5), np.array([0, 5, 3])),
    ]:
        np.testing.assert_array_equal(small[index].read(), whole[index])
