"""A built-in MaxText recipe knows its leaves' logical axes: a conversion for a mesh needs no
sharding rules, and each array's chunks tile the shard MaxText's own sharding gives it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import suture
from suture._errors import RecipeError
from suture._sharding import shard_lengths
from suture.cli.app import app
from tests.test_mesh_writes import written_chunk

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

MESH = {"fsdp": 4, "tensor": 2}
# The mesh-axis specs MaxText 0.2.5 gives Qwen3-MoE's parameters on fsdp=4,tensor=2 (its
# training sharding, `bench/maxtext_sharding.py`: shards of [8, 2, 256, 128] are [8, 2, 64, 64])
QWEN3_MOE = {
    "token_embedder/embedding": ("tensor", "fsdp"),
    "decoder/decoder_norm/scale": ("tensor",),
    "decoder/logits_dense/kernel": ("fsdp", "tensor"),
    "decoder/layers/self_attention/query/kernel": ("fsdp", None, "tensor", None),
    "decoder/layers/self_attention/key/kernel": ("fsdp", None, "tensor", None),
    "decoder/layers/self_attention/value/kernel": ("fsdp", None, "tensor", None),
    "decoder/layers/self_attention/out/kernel": ("tensor", None, None, "fsdp"),
    "decoder/layers/self_attention/query_norm/scale": ("tensor", None),
    "decoder/layers/self_attention/key_norm/scale": ("tensor", None),
    "decoder/layers/moe_block/gate/kernel": ("fsdp", None, None),
    "decoder/layers/moe_block/wi_0": (None, None, "fsdp", "tensor"),
    "decoder/layers/moe_block/wi_1": (None, None, "fsdp", "tensor"),
    "decoder/layers/moe_block/wo": (None, None, "tensor", "fsdp"),
    "decoder/layers/pre_self_attention_layer_norm/scale": ("tensor", None),
    "decoder/layers/post_self_attention_layer_norm/scale": ("tensor", None),
}


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3moe") / "hf"
    config = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama") / "hf"
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_moe_conversion_for_a_mesh_tiles_maxtexts_own_shards(qwen3_moe: Path, tmp_path: Path):
    out = tmp_path / "mt"
    suture.convert(
        qwen3_moe, out, recipe="qwen3-moe:maxtext", progress=False,
        target_sharding=suture.TargetSharding("fsdp=4,tensor=2"),
    )  # fmt: skip
    ckpt = suture.open(out)
    assert {path.removeprefix("params/params/") for path in ckpt.paths() if path != "step"} == set(
        QWEN3_MOE
    )
    for path, spec in QWEN3_MOE.items():
        shape = ckpt[f"params/params/{path}"].shape
        shard = shard_lengths(shape, spec, MESH)
        chunk = written_chunk(out, "params.params." + path.replace("/", "."))
        for axis, entry in enumerate(spec):
            if entry is not None:  # each sharded axis: one chunk per shard, exactly
                assert chunk[axis] == shard[axis] < shape[axis], (path, chunk, shard)
            else:
                assert shard[axis] % chunk[axis] == 0, (path, chunk, shard)


def test_unscanned_layers_keep_their_axes_without_the_layer_axis(qwen3_moe: Path, tmp_path: Path):
    out = tmp_path / "mt"
    suture.convert(
        qwen3_moe, out, recipe="qwen3-moe:maxtext-unscanned", progress=False,
        target_sharding=suture.TargetSharding("fsdp=4,tensor=2"),
    )  # fmt: skip
    # [exp, embed_moe, mlp_moe] = (4, 64, 32): shards of (4, 16, 16), one expert per chunk
    assert written_chunk(out, "params.params.decoder.layers_1.moe_block.wi_0") == (1, 16, 16)
    assert written_chunk(out, "params.params.decoder.layers_0.moe_block.wo") == (1, 16, 16)


def test_the_command_line_takes_the_mesh_alone_with_a_builtin_recipe(llama: Path, tmp_path: Path):
    runner = CliRunner()
    out = tmp_path / "mt"
    done = runner.invoke(
        app, ["convert", str(llama), str(out), "--recipe", "llama3.1:maxtext",
              "--mesh", "fsdp=4,tensor=2", "--no-progress"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    # wo [mlp, layers, embed] = (96, 2, 64) -> (tensor, -, fsdp): shards of (48, 2, 16)
    assert written_chunk(out, "params.params.decoder.layers.mlp.wo.kernel") == (48, 1, 16)
    # the embedding [vocab, embed_vocab] = (64, 64) -> (tensor, fsdp)
    assert written_chunk(out, "params.params.token_embedder.embedding") == (32, 16)
    refused = runner.invoke(
        app, ["convert", str(llama), str(tmp_path / "o"), "--mesh", "fsdp=4", "--no-progress"]
    )
    assert refused.exit_code == 2
    assert "--sharding" in refused.output and "FAMILY:maxtext" in refused.output


def test_a_table_without_logical_axes_asks_for_the_sharding(llama: Path, tmp_path: Path):
    table = suture.families.__path__[0] + "/llama3.1.yaml"
    text = Path(table).read_text().split("\nlogical_axes:")[0]
    (tmp_path / "mine.yaml").write_text(text)
    with pytest.raises(suture.SurgeryError, match=r"no 'logical_axes'.*--sharding"):
        suture.convert(
            llama, tmp_path / "mt", recipe=str(tmp_path / "mine.yaml"), progress=False,
            target_sharding=suture.TargetSharding("fsdp=4"),
        )  # fmt: skip
    assert not (tmp_path / "mt").exists()
    # on a mesh, a table's axes must name every leaf; without one, they need not
    partial = (
        text + "\nlogical_axes:\n  decoder/decoder_norm/scale: [norm]\n  decoder/nothing: [x]\n"
    )
    (tmp_path / "partial.yaml").write_text(partial)
    with pytest.raises(suture.SurgeryError) as error:
        suture.convert(
            llama, tmp_path / "mt", recipe=str(tmp_path / "partial.yaml"), progress=False,
            target_sharding=suture.TargetSharding("fsdp=4"),
        )  # fmt: skip
    assert "no entry for 'decoder/layers/mlp/wi_0/kernel'" in str(error.value)
    assert "--sharding" in str(error.value)
    assert not (tmp_path / "mt").exists()
    suture.convert(llama, tmp_path / "mt", recipe=str(tmp_path / "partial.yaml"), progress=False)
    assert (tmp_path / "mt").exists()
    # axes that are not lists of names or nulls break the table's format
    (tmp_path / "broken.yaml").write_text(text + "\nlogical_axes:\n  decoder/x: [embed, embed]\n")
    with pytest.raises(RecipeError, match="names an axis twice"):
        suture.convert(llama, tmp_path / "mt2", recipe=str(tmp_path / "broken.yaml"))


def test_every_builtin_table_with_logical_axes_names_every_leaf():
    from suture.families._index import read_table, table_heads
    from suture.families._logical_axes import missing_leaves

    carrying = 0
    for file in table_heads():
        table = read_table(file)
        if "logical_axes" not in table:
            continue
        carrying += 1
        paths = {leaf["maxtext"] for leaf in table["leaves"] if "maxtext" in leaf}
        assert missing_leaves(table["logical_axes"], paths) == [], file
    assert carrying >= 21
