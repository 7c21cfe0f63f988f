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
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture._hf import SideFileWarning
from suture.cli import app
from suture.families._convert import FAMILY_KEY, convert_with_recipe
from suture.families._file import family_recipe

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


# Item 1: every expert axis against the config's count ------------------------------------------

MOE = {
    "mixtral": (
        lambda: transformers.MixtralForCausalLM(
            transformers.MixtralConfig(
                **SMALL, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2
            )
        ),
        "num_local_experts",
        "model.layers.0.mlp.gate.weight",
    ),
    "qwen3-moe": (
        lambda: transformers.Qwen3MoeForCausalLM(
            transformers.Qwen3MoeConfig(
                **SMALL,
                head_dim=16,
                intermediate_size=96,
                moe_intermediate_size=24,
                num_experts=4,
                num_experts_per_tok=2,
                norm_topk_prob=True,
            )
        ),
        "num_local_experts",  # transformers 5 writes num_experts under this name
        "model.layers.0.mlp.gate.weight",
    ),
    "gpt-oss": (
        lambda: transformers.GptOssForCausalLM(
            transformers.GptOssConfig(
                **SMALL,
                head_dim=16,
                intermediate_size=32,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=16,
                rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
            )
        ),
        "num_local_experts",
        "model.layers.0.mlp.router.weight",
    ),
    "llama4": (
        lambda: transformers.Llama4ForCausalLM(
            transformers.Llama4TextConfig(
                **{**SMALL, "num_hidden_layers": 4},
                head_dim=16,
                intermediate_size=32,
                intermediate_size_mlp=48,
                num_local_experts=4,
                num_experts_per_tok=1,
            )
        ),
        "num_local_experts",
        "model.layers.0.feed_forward.router.weight",
    ),
}


def _fused_moe(family: str, folder: Path) -> None:
    """A tiny model of `family` with 4 experts, in transformers' fused layout."""
    torch.manual_seed(0)
    MOE[family][0]().save_pretrained(folder, save_original_format=False)


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    for family in MOE:
        _fused_moe(family, root / family)
    return {family: root / family for family in MOE}


def _copy(folder: Path, into: Path) -> Path:
    into.mkdir()
    for path in folder.iterdir():
        (into / path.name).write_bytes(path.read_bytes())
    return into


@pytest.mark.parametrize("family", list(MOE))
def test_a_config_with_fewer_experts_than_the_files_is_refused(moe, tmp_path, family):
    """4 experts in the files, 2 in config.json: the router and the fused tensors say 4."""
    field, router = MOE[family][1], MOE[family][2]
    folder = _copy(moe[family], tmp_path / "hf")
    _edit_config(folder, **{field: 2})
    before = _digest(folder)
    with pytest.raises(suture.ConfigMismatchError) as error:
        convert_with_recipe(folder, tmp_path / "out", f"{family}:maxtext", progress=False)
    message = str(error.value)
    assert f"{router!r}" in message and "expected 2 experts on axis" in message, message
    assert f"as config.json gives {field}=2: it holds 4." in message, message
    result = _cli("convert", folder, tmp_path / "out", "--recipe", f"{family}:maxtext")
    _refused(result, router, "expected 2 experts on axis", "it holds 4")
    _left_nothing(tmp_path / "out")
    assert _digest(folder) == before


@pytest.mark.parametrize("family", ["mixtral", "qwen3-moe"])
def test_fused_experts_past_the_config_are_refused_naming_the_fused_tensor(moe, tmp_path, family):
    """The router cut to 2 experts as the config says, the fused tensors still holding 4:
    experts 2 and 3 were dropped without a word; now the fused tensor is named."""
    field = MOE[family][1]
    folder = _copy(moe[family], tmp_path / "hf")
    _edit_config(folder, **{field: 2})
    (shard,) = folder.glob("*.safetensors")
    tensors = load_file(shard)
    for name in list(tensors):
        if name.endswith("mlp.gate.weight"):
            tensors[name] = np.ascontiguousarray(tensors[name][:2])
    save_file(tensors, shard, metadata={"format": "pt"})
    result = _cli("convert", folder, tmp_path / "out", "--recipe", f"{family}:maxtext")
    _refused(
        result,
        "Hugging Face tensor 'model.layers.0.mlp.experts.",
        "expected 2 experts on axis 0, as config.json gives num_local_experts=2: it holds 4.",
    )
    _left_nothing(tmp_path / "out")


@pytest.mark.parametrize("family", list(MOE))
def test_a_reverse_with_fewer_experts_than_the_maxtext_leaves_is_refused(moe, tmp_path, family):
    """Back to HF with a config naming 2 of the 4 experts (no recorded config to compare)."""
    name = f"{family}:maxtext"
    convert_with_recipe(moe[family], tmp_path / "mt", name, progress=False)
    source = _no_record(tmp_path / "mt", tmp_path / "bare")
    config = tmp_path / "config.json"
    settings = json.loads((moe[family] / "config.json").read_text())
    config.write_text(json.dumps({**settings, MOE[family][1]: 2}))
    before = _digest(source)
    result = _cli(
        "convert", source, tmp_path / "back", "--recipe", name, "--reverse", "--config", config
    )
    _refused(result, "MaxText leaf 'decoder/", "expected 2 experts on axis", "it holds 4")
    _left_nothing(tmp_path / "back")
    assert _digest(source) == before


@pytest.mark.parametrize("family", list(MOE))
def test_fused_experts_matching_the_config_round_trip_exactly(moe, tmp_path, family):
    name = f"{family}:maxtext"
    convert_with_recipe(moe[family], tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    source, back = _tensors(moe[family]), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)


def test_a_table_axis_of_experts_needs_the_count(tmp_path):
    """A table marking an axis of experts (a router's) says how many there are."""
    table = tmp_path / "mine.yaml"
    text = (Path(suture.__file__).parent / "families" / "gpt-oss.yaml").read_text()
    table.write_text(text.replace("\nexperts: num_local_experts", "\n", 1))
    with pytest.raises(suture.SurgeryError, match=r"'axes: \{expert: N\}' needs a top-level"):
        family_recipe(str(table))


# Item 2: a reverse with another model's config -------------------------------------------------

HEADS = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)  # head_dim 4; OTHER: 2 heads of 8 (kv 1 of 8), every tensor the same shape


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("heads")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**HEADS)).save_pretrained(root / "hf")
    convert_with_recipe(root / "hf", root / "mt", "llama3.1:maxtext", progress=False)
    other = json.loads((root / "hf" / "config.json").read_text())
    other.update(num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    (root / "other").mkdir()
    (root / "other" / "config.json").write_text(json.dumps(other))
    return root


@pytest.mark.parametrize("how", ["--config", "--like"])
def test_a_reverse_with_another_models_config_is_refused(llama, tmp_path, how):
    """Same shapes, 2 heads of 8 instead of 4 of 4: q_proj came back 1.414x too large, with
    q and k in another rotary order. The recorded config names the field that differs."""
    given = llama / "other" / "config.json"
    if how == "--like":  # a folder of the other model: its config, the same tensors
        given = _copy(llama / "hf", tmp_path / "like")
        (given / "config.json").write_text((llama / "other" / "config.json").read_text())
    before = _digest(llama / "mt")
    with pytest.raises(suture.ConfigMismatchError, match=r"axes 1-2 are \(4, 4\), and the config"):
        convert_with_recipe(
            llama / "mt",
            tmp_path / "back",
            "llama3.1:maxtext",
            reverse=True,
            **({"config": given} if how == "--config" else {"like": given}),
            progress=False,
        )
    result = _cli(
        "convert", llama / "mt", tmp_path / "back", "--recipe", "llama3.1:maxtext",
        "--reverse", how, given,
    )  # fmt: skip
    _refused(result, "num_attention_heads=2 x head_dim=8", "--like the original")
    _left_nothing(tmp_path / "back")
    assert _digest(llama / "mt") == before


def test_a_reverse_config_that_differs_from_the_recorded_one_is_refused(llama, tmp_path):
    """A field that changes values but no shape (a table of the user's scaling the query by
    a field of its own): the config the forward run recorded names it, with both values."""
    text = (Path(suture.__file__).parent / "families" / "llama3.1.yaml").read_text()
    text = text.replace("names: [llama3.1]", "names: [scaled]")
    text = text.replace(
        "    head_dim: hidden_size", "    query_scale: head_dim\n    head_dim: hidden_size"
    )
    text = text.replace(
        "1/sqrt(head_dim), back_multiply: sqrt(head_dim)",
        "1/sqrt(query_scale), back_multiply: sqrt(query_scale)",
    )
    table = tmp_path / "scaled.yaml"
    table.write_text(text)
    convert_with_recipe(llama / "hf", tmp_path / "mt", str(table), progress=False)
    config = json.loads((llama / "hf" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "query_scale": 16}))
    result = _cli(
        "convert", tmp_path / "mt", tmp_path / "back", "--recipe", table, "--reverse",
        "--config", tmp_path / "config.json",
    )  # fmt: skip
    _refused(
        result,
        "has 'query_scale' = 16, and the config this checkpoint was converted with has 4",
        "leave --config out",
    )
    _left_nothing(tmp_path / "back")
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", str(table), reverse=True, progress=False
    )
    source, back = _tensors(llama / "hf"), _tensors(tmp_path / "back")
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)


def test_a_split_checks_the_axes_it_merges_without_a_record(llama, tmp_path):
    """A MaxText checkpoint with no recorded config: the heads of the query kernel (4, 4)
    against the config's (2, 8) stop the run, naming both fields."""
    source = _no_record(llama / "mt", tmp_path / "bare")
    result = _cli(
        "convert", source, tmp_path / "back", "--recipe", "llama3.1:maxtext", "--reverse",
        "--config", llama / "other" / "config.json",
    )  # fmt: skip
    _refused(result, "are (4, 4)", "num_attention_heads=2 x head_dim=8", "--like the original")
    _left_nothing(tmp_path / "back")


def test_another_recipe_than_the_forward_runs_is_refused(llama, tmp_path):
    """llama3.1 interleaves the rotary halves; llama3 does not: the values would differ."""
    result = _cli(
        "convert", llama / "mt", tmp_path / "back", "--recipe", "llama3:maxtext", "--reverse",
        "--config", llama / "hf" / "config.json",
    )  # fmt: skip
    _refused(result, "converted with recipe 'llama3.1:maxtext'", "--recipe llama3.1:maxtext")
    _left_nothing(tmp_path / "back")


def test_a_config_leaving_out_a_leaf_the_checkpoint_holds_is_refused(llama, tmp_path):
    """No recorded config: tie_word_embeddings true would drop decoder/logits_dense."""
    source = _no_record(llama / "mt", tmp_path / "bare")
    config = json.loads((llama / "hf" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    result = _cli(
        "convert", source, tmp_path / "back", "--recipe", "llama3.1:maxtext", "--reverse",
        "--config", tmp_path / "config.json",
    )  # fmt: skip
    _refused(
        result,
        "MaxText leaf 'decoder/logits_dense/kernel' is in the checkpoint",
        "tie_word_embeddings=True",
        "would lose it",
    )
    _left_nothing(tmp_path / "back")


@pytest.mark.parametrize("how", ["recorded", "--config", "--like", "unread-field"])
def test_a_reverse_with_the_original_config_is_bit_exact(llama, tmp_path, how):
    """The neighbours: the recorded config, the original's, or one that differs only in a
    field the table does not read (rope_theta here) all give the original tensors back."""
    options: dict = {}
    if how == "--config":
        options["config"] = llama / "hf" / "config.json"
    elif how == "--like":
        options["like"] = llama / "hf"
    elif how == "unread-field":
        config = json.loads((llama / "hf" / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "rope_theta": 1234.0}))
        options["config"] = tmp_path / "config.json"
    convert_with_recipe(
        llama / "mt", tmp_path / "back", "llama3.1:maxtext", reverse=True, progress=False, **options
    )
    source, back = _tensors(llama / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)


# Item 5: a config.json beside the weights is read under the side-file rules ------------------

SECRET = "sk-do-not-leak-0123456789"


@pytest.fixture
def linked(tmp_path) -> Path:
    """A Llama folder whose config.json links to a private file outside it."""
    torch.manual_seed(0)
    folder = tmp_path / "hf"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(folder)
    private = tmp_path / "elsewhere" / "private.json"
    private.parent.mkdir()
    config = json.loads((folder / "config.json").read_text())
    private.write_text(json.dumps({**config, "api_token": SECRET}))
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to(Path("..") / "elsewhere" / "private.json")
    return folder


def _nowhere(root: Path, secret: str) -> None:
    """`secret` is in no file under `root` but the private one."""
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name != "private.json":
            assert secret.encode() not in path.read_bytes(), path


def test_a_config_linked_from_outside_the_folder_is_not_read(linked, tmp_path):
    before = _digest(linked)
    with pytest.raises(suture.ConfigMismatchError, match="is a symbolic link") as error:
        convert_with_recipe(linked, tmp_path / "out", "llama3.1:maxtext", progress=False)
    assert "--config PATH" in str(error.value) and SECRET not in str(error.value)
    result = _cli("convert", linked, tmp_path / "out", "--recipe", "llama3.1:maxtext")
    _refused(result, f"Not reading {str(linked / 'config.json')!r}", "--config PATH")
    assert SECRET not in result.output
    _left_nothing(tmp_path / "out")
    assert _digest(linked) == before
    _nowhere(tmp_path, SECRET)


def test_a_like_folder_whose_config_links_outside_is_not_read(linked, tmp_path):
    private = tmp_path / "elsewhere" / "private.json"
    with pytest.warns(SideFileWarning, match="Not copying"):  # an explicit --config is read
        convert_with_recipe(linked, tmp_path / "mt", "llama3.1:maxtext", config=private)
    with pytest.warns(SideFileWarning, match="Not copying"):  # as a side file: not copied
        result = _cli(
            "convert", tmp_path / "mt", tmp_path / "back", "--recipe", "llama3.1:maxtext",
            "--reverse", "--like", linked,
        )  # fmt: skip
    _refused(result, "is a symbolic link", "--config PATH")
    _left_nothing(tmp_path / "back")


def test_a_checkpoint_metadata_linked_from_outside_is_not_read(tmp_path):
    """A MaxText checkpoint whose _CHECKPOINT_METADATA links to a file elsewhere: what it
    records (a model's config, written back out as config.json) is not taken from it."""
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(
        tmp_path / "hf"
    )
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "llama3.1:maxtext", progress=False)
    metadata = tmp_path / "mt" / "_CHECKPOINT_METADATA"
    recorded = json.loads(metadata.read_text())
    recorded["custom_metadata"][FAMILY_KEY]["config"]["api_token"] = SECRET
    private = tmp_path / "elsewhere" / "private.json"
    private.parent.mkdir()
    private.write_text(json.dumps(recorded))
    metadata.unlink()
    metadata.symlink_to(Path("..") / "elsewhere" / "private.json")
    (tmp_path / "mt" / "config.json").unlink(missing_ok=True)  # the record is all there is
    with pytest.warns(SideFileWarning, match="Not reading the custom metadata"):
        assert suture.open(tmp_path / "mt").custom_metadata == {}
    with pytest.warns(SideFileWarning, match="Not reading the custom metadata"):
        result = _cli(
            "convert", tmp_path / "mt", tmp_path / "back", "--recipe", "llama3.1:maxtext",
            "--reverse",
        )  # fmt: skip
    _refused(result, "config.json")
    assert SECRET not in result.output
    _left_nothing(tmp_path / "back")
    _nowhere(tmp_path, SECRET)
    with pytest.warns(SideFileWarning):  # the valid neighbour: the original config given
        back = convert_with_recipe(
            tmp_path / "mt", tmp_path / "back", "llama3.1:maxtext", reverse=True,
            config=tmp_path / "hf" / "config.json", progress=False,
        )  # fmt: skip
    written, source = _tensors(back.path), _tensors(tmp_path / "hf")
    assert written.keys() == source.keys()
    assert all(np.array_equal(written[name], source[name]) for name in source)


def test_an_explicit_config_may_point_anywhere(linked, tmp_path):
    private = tmp_path / "elsewhere" / "private.json"
    with pytest.warns(SideFileWarning, match="Not copying"):  # the link itself is not copied
        result = _cli(
            "convert", linked, tmp_path / "out", "--recipe", "llama3.1:maxtext", "--config", private
        )
    assert result.exit_code == 0, result.output
    recorded = suture.open(tmp_path / "out").custom_metadata[FAMILY_KEY]["config"]
    assert recorded["api_token"] == SECRET  # given on purpose, so recorded
    assert not (tmp_path / "out" / "config.json").exists()


def test_a_config_in_the_folder_is_read_as_before(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "hf"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(folder)
    convert_with_recipe(folder, tmp_path / "mt", "llama3.1:maxtext", progress=False)
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", "llama3.1:maxtext", reverse=True, progress=False
    )
    source, back = _tensors(folder), _tensors(tmp_path / "back")
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)


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
    before = _digest(gemma)
    started = time.perf_counter()
    with pytest.raises(suture.ConfigMismatchError, match=rf"padded_vocab_size={rows}\)"):
        convert_with_recipe(gemma, tmp_path / "out", "gemma2:maxtext", config=config)
    result = _cli(
        "convert", gemma, tmp_path / "out", "--recipe", "gemma2:maxtext", "--config", config
    )
    _refused(result, "has 64 rows", f"pads it to {rows}", "at most 65600")
    assert time.perf_counter() - started < FAST
    _left_nothing(tmp_path / "out")
    assert _digest(gemma) == before


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


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_fit_rows_of_a_vocabulary_of_another_size_is_refused(tmp_path, reverse):
    """Gemma 3's fit_rows cut or padded any embedding to the config's sizes: 64 rows with
    vocab_size 100 got 36 zero rows invented (or, cut, rows dropped), with exit 0."""
    torch.manual_seed(0)
    text = dict(LLAMA, head_dim=16, query_pre_attn_scalar=16, num_hidden_layers=6)
    model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**text))
    model.save_pretrained(tmp_path / "hf")
    settings = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**settings, "vocab_size": 100}))
    source = tmp_path / "hf"
    if reverse:
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma3:maxtext", progress=False)
        source = tmp_path / "mt"
    result = _cli(
        "convert", source, tmp_path / "out", "--recipe", "gemma3:maxtext",
        *(["--reverse"] if reverse else []), "--config", tmp_path / "config.json",
    )  # fmt: skip
    leaf = "params/params/token_embedder/embedding" if reverse else "model/embed_tokens/weight"
    field = "maxtext_vocab_size=100" if reverse else "vocab_size=100"
    _refused(result, f"Leaf {leaf!r} has shape (64, 64), and the config says 100 rows ({field})")
    _left_nothing(tmp_path / "out")
