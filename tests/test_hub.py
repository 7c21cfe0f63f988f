"""Hugging Face Hub sources: ``hf://ORG/NAME[@REVISION][/PATH]`` and cached ``org/name`` ids.

A small Hub-protocol server of the tests' own (tests/hub_server.py) runs on 127.0.0.1;
huggingface_hub's own ``hf_hub_download``, ``snapshot_download`` and ``HfFileSystem`` are
first shown to work against it. Models are tiny Llamas in ``save_pretrained``'s layout
(transformers' config.json, safetensors files written by the safetensors library, sharded
with an index), so no torch is needed. The cache is the one ``snapshot_download`` writes
from that server, then read offline with ``HF_ENDPOINT`` pointing nowhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.hub_server import HubServer, hub_server

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("huggingface_hub")

runner = CliRunner()
TOKEN = "hf_testTOKENnotARealOne0123456789"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    with hub_server(tmp_path_factory.mktemp("hub")) as server:
        yield server


@pytest.fixture
def cache(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment of a user of this Hub: its endpoint, an empty cache, no token."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # read at import
    monkeypatch.setattr(hf.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hf.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    return tmp_path / "hf-cache"


def llama(folder: Path, shard: int | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny random Llama laid out as ``save_pretrained`` lays it out: its config.json (from
    transformers), a tokenizer config, and ``model.safetensors`` or, given `shard` (bytes),
    ``model-0000K-of-0000N.safetensors`` shards with ``model.safetensors.index.json``."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (64, 64)}
    for i in range(2):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "self_attn.q_proj.weight": (64, 64),
            layer + "self_attn.k_proj.weight": (32, 64),
            layer + "self_attn.v_proj.weight": (32, 64),
            layer + "self_attn.o_proj.weight": (64, 64),
            layer + "mlp.gate_proj.weight": (96, 64),
            layer + "mlp.up_proj.weight": (96, 64),
            layer + "mlp.down_proj.weight": (64, 96),
            layer + "input_layernorm.weight": (64,),
            layer + "post_attention_layernorm.weight": (64,),
        }
    shapes |= {"model.norm.weight": (64,), "lm_head.weight": (64, 64)}
    tensors = {
        name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()
    }
    folder.mkdir(parents=True)
    config.to_json_file(folder / "config.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    if shard is None:
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return tensors
    groups: list[dict[str, np.ndarray]] = [{}]
    for name, array in tensors.items():
        if groups[-1] and sum(a.nbytes for a in groups[-1].values()) + array.nbytes > shard:
            groups.append({})
        groups[-1][name] = array
    weight_map = {}
    for number, group in enumerate(groups, start=1):
        file = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, folder / file, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(group, file)
    index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())}}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({**index, "weight_map": weight_map}, indent=2)
    )
    return tensors


def tensors_of(folder: Path) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}
    for file in sorted(folder.glob("*.safetensors")):
        found.update(load_file(file))
    return found


def flat(ckpt: suture.Checkpoint) -> dict[str, np.ndarray]:
    return {path.replace("/", "."): np.asarray(leaf.read()) for path, leaf in ckpt.arrays().items()}


# --- the server speaks the Hub's protocol ------------------------------------------------------
def test_huggingface_hub_itself_downloads_lists_and_reads_ranges(
    hub: HubServer, cache: Path, tmp_path: Path
) -> None:
    tensors = llama(tmp_path / "model", shard=100_000)
    commit = hub.publish(tmp_path / "model", "org/itself")
    index = "model.safetensors.index.json"
    one = hf.hf_hub_download("org/itself", index, endpoint=hub.url, cache_dir=cache)
    assert Path(one).read_bytes() == (tmp_path / "model" / index).read_bytes()
    snapshot = Path(hf.snapshot_download("org/itself", endpoint=hub.url, cache_dir=cache))
    assert snapshot.name == commit and (cache / "models--org--itself" / "refs" / "main").exists()
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(
        p.name for p in (tmp_path / "model").iterdir()
    )
    assert all((snapshot / name).is_symlink() for name in os.listdir(snapshot))
    assert tensors_of(snapshot).keys() == tensors.keys()
    fs = hf.HfFileSystem(endpoint=hub.url, skip_instance_cache=True)
    assert f"org/itself/{index}" in fs.ls("org/itself", detail=False)
    shard = sorted(fs.glob("org/itself/*.safetensors"))[0]
    hub.reset_counts()
    with fs.open(shard, "rb", cache_type="none") as stream:
        stream.seek(100)
        assert stream.read(10) == (tmp_path / "model" / Path(shard).name).read_bytes()[100:110]
    assert hub.bytes_sent == 10 and [r.range for r in hub.file_requests()] == ["bytes=100-109"]


# --- hf:// ---------------------------------------------------------------------------------------
def test_a_slice_reads_only_its_bytes(hub: HubServer, cache: Path, tmp_path: Path) -> None:
    tensors = llama(tmp_path / "model")
    hub.publish(tmp_path / "model", "org/slice")
    ckpt = suture.open("hf://org/slice")
    assert ckpt.format == "safetensors" and ckpt.location == "hf://org/slice"
    embed = ckpt["model/embed_tokens/weight"]
    hub.reset_counts()
    with suture.count_bytes_read() as counter:
        row = embed[5].read()
    np.testing.assert_array_equal(row, tensors["model.embed_tokens.weight"][5])
    assert hub.bytes_sent == counter.bytes == row.nbytes == 64 * 4
    assert len(hub.file_requests()) == 1 and hub.file_requests()[0].range.startswith("bytes=")


def test_a_source_is_read_at_one_commit(
    hub: HubServer, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from suture._location import hub as hub_module

    first = llama(tmp_path / "v1", seed=1)
    llama(tmp_path / "v2", seed=2)
    hub.publish(tmp_path / "v1", "org/pinned")
    hub.reset_counts()
    ckpt = suture.open("hf://org/pinned")
    hub.publish(tmp_path / "v2", "org/pinned")  # a push while the source is being read
    got = flat(ckpt)
    assert all(np.array_equal(got[k], first[k]) for k in first)
    commits = {r.path.split("/")[4] for r in hub.file_requests()}
    assert len(commits) == 1
    monkeypatch.setattr(hub_module, "PIN_SECONDS", 0.0)  # a later open sees the push
    again = flat(suture.open("hf://org/pinned"))
    assert not np.array_equal(again["lm_head.weight"], first["lm_head.weight"])


@pytest.fixture
def cdn(hub: HubServer, tmp_path: Path):
    """A second server (another origin) that the Hub redirects large files to, as its CDN."""
    with hub_server(tmp_path / "cdn") as server:
        hub.cdn = server
        try:
            yield server
        finally:
            hub.cdn = None


def test_ranges_follow_the_redirect_to_a_cdn_without_the_token_and_keep_it(
    hub: HubServer, cdn: HubServer, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = llama(tmp_path / "model")
    hub.publish(tmp_path / "model", "org/cdn", token=TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    downloaded = hf.hf_hub_download(
        "org/cdn", "model.safetensors", endpoint=hub.url, cache_dir=cache
    )
    assert load_file(downloaded).keys() == tensors.keys()  # huggingface_hub's own way
    hub.reset_counts()
    embed = suture.open("hf://org/cdn")["model/embed_tokens/weight"]  # reads the header
    weights = lambda: [r for r in hub.file_requests() if r.path.endswith(".safetensors")]  # noqa: E731
    assert [r.authorization for r in weights()] == [f"Bearer {TOKEN}"]  # (and config.json)
    sent_at_open = hub.bytes_sent
    cdn.reset_counts()
    row = embed[7].read()  # the CDN's address was kept: the Hub is not asked again
    np.testing.assert_array_equal(row, tensors["model.embed_tokens.weight"][7])
    assert cdn.bytes_sent == row.nbytes and hub.bytes_sent == sent_at_open
    assert len(weights()) == 1 and [r.authorization for r in cdn.requests] == [None]
    with cdn.lock:
        cdn.blobs.clear()  # the signed address expires
    row = embed[11].read()
    np.testing.assert_array_equal(row, tensors["model.embed_tokens.weight"][11])
    assert len(weights()) == 2 and cdn.bytes_sent == 2 * row.nbytes
    assert all(r.authorization is None for r in cdn.requests)  # the token stays with the Hub


def test_a_hub_that_ignores_ranges_is_refused(hub: HubServer, cache: Path, tmp_path: Path) -> None:
    llama(tmp_path / "model")
    hub.publish(tmp_path / "model", "org/no-ranges")
    ckpt = suture.open("hf://org/no-ranges")
    hub.honour_ranges = False
    try:
        with pytest.raises(suture.UnsupportedError, match="does not serve byte ranges"):
            ckpt["model/embed_tokens/weight"][3].read()
    finally:
        hub.honour_ranges = True


def test_sharded_folder_at_a_revision_and_in_a_subfolder(
    hub: HubServer, cache: Path, tmp_path: Path
) -> None:
    first = llama(tmp_path / "v1" / "weights", shard=100_000, seed=1)
    second = llama(tmp_path / "v2" / "weights", shard=100_000, seed=2)
    assert len(list((tmp_path / "v1" / "weights").glob("*.safetensors"))) > 1
    commit = hub.publish(tmp_path / "v1", "org/sharded", branch="v1")
    hub.publish(tmp_path / "v2", "org/sharded")  # main moves on
    for url, expected in [
        ("hf://org/sharded@v1/weights", first),
        (f"hf://org/sharded@{commit}/weights", first),
        ("hf://org/sharded/weights", second),
        ("hf://org/sharded/weights/model.safetensors.index.json", second),
    ]:
        got = flat(suture.open(url))
        assert got.keys() == expected.keys(), url
        assert all(np.array_equal(got[k], expected[k]) for k in expected), url


def test_convert_from_the_hub_copies_the_side_files(
    hub: HubServer, cache: Path, tmp_path: Path
) -> None:
    tensors = llama(tmp_path / "model", shard=100_000)
    hub.publish(tmp_path / "model", "org/convert")
    out = tmp_path / "out"
    result = runner.invoke(
        app, ["convert", "hf://org/convert", str(out), "--format", "safetensors", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    for name in ("config.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (tmp_path / "model" / name).read_bytes()
    assert (out / "model.safetensors.index.json").is_file()
    got = tensors_of(out)
    assert all(np.array_equal(got[k], tensors[k]) for k in tensors)


def test_cli_inspect_plan_and_recipe_convert_from_the_hub(
    hub: HubServer, cache: Path, tmp_path: Path
) -> None:
    tensors = llama(tmp_path / "model")
    hub.publish(tmp_path / "model", "org/cli")
    shown = runner.invoke(app, ["inspect", "hf://org/cli", "--flat"])
    assert shown.exit_code == 0, shown.output
    assert "hf://org/cli  (safetensors)" in shown.output
    assert "model/layers/1/mlp/down_proj/weight" in shown.output
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - drop: lm_head\n  - cast: {pattern: model, dtype: bfloat16}\n")
    planned = runner.invoke(app, ["plan", str(recipe), "hf://org/cli"])
    assert planned.exit_code == 0, planned.output
    assert "No problems." in planned.output and "lm_head" in planned.output
    forward = runner.invoke(
        app,
        ["convert", "hf://org/cli", str(tmp_path / "mt"), "--recipe", "llama3.1:maxtext"]
        + ["--no-progress"],
    )
    assert forward.exit_code == 0, forward.output
    back = runner.invoke(
        app,
        ["convert", str(tmp_path / "mt"), str(tmp_path / "back"), "--recipe", "llama3.1:maxtext"]
        + ["--reverse", "--no-progress"],
    )
    assert back.exit_code == 0, back.output
    assert (tmp_path / "back" / "tokenizer_config.json").is_file()  # kept by the forward run
    restored = tensors_of(tmp_path / "back")
    assert all(np.array_equal(restored[k], tensors[k]) for k in tensors)


def mergekit_config(path: Path, first: str, second: str) -> Path:
    path.write_text(
        "merge_method: linear\n"
        f"models:\n  - model: {first}\n    parameters: {{weight: 0.75}}\n"
        f"  - model: {second}\n    parameters: {{weight: 0.25}}\n"
        "dtype: float32\n"
    )
    return path


def test_merge_of_two_hub_models(hub: HubServer, cache: Path, tmp_path: Path) -> None:
    a = llama(tmp_path / "a", seed=1)
    b = llama(tmp_path / "b", seed=2)
    hub.publish(tmp_path / "a", "org/merge-a")
    hub.publish(tmp_path / "b", "org/merge-b")
    config = mergekit_config(tmp_path / "merge.yml", "hf://org/merge-a", "hf://org/merge-b")
    result = runner.invoke(
        app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    merged = load_file(tmp_path / "out" / "model.safetensors")
    for name in a:
        np.testing.assert_allclose(merged[name], 0.75 * a[name] + 0.25 * b[name], rtol=1e-6)
    assert {"config.json", "tokenizer_config.json", "README.md"} <= set(
        os.listdir(tmp_path / "out")
    )


def test_private_model_reads_with_hf_token_which_is_never_printed(
    hub: HubServer, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = llama(tmp_path / "model")
    hub.publish(tmp_path / "model", "org/private", token=TOKEN)
    refused = runner.invoke(app, ["inspect", "hf://org/private"])
    assert refused.exit_code == 2 and "HF_TOKEN" in refused.output, refused.output
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.reset_counts()
    shown = runner.invoke(app, ["inspect", "hf://org/private@main", "--stats"])
    assert shown.exit_code == 0, shown.output
    assert all(r.authorization == f"Bearer {TOKEN}" for r in hub.requests)
    missing = runner.invoke(app, ["inspect", "hf://org/private/nothing-here"])
    assert missing.exit_code == 2
    for output in (refused.output, shown.output, missing.output):
        assert TOKEN not in output
    got = flat(suture.open("hf://org/private"))
    assert all(np.array_equal(got[k], tensors[k]) for k in tensors)
    monkeypatch.delenv("HF_TOKEN")  # the file `hf auth login` writes works as well
    (tmp_path / "token").write_text(TOKEN)
    monkeypatch.setattr(hf.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    hub.reset_counts()
    assert suture.open("hf://org/private@main/model.safetensors")["lm_head/weight"].shape == (
        64,
        64,
    )
    assert hub.requests and all(r.authorization == f"Bearer {TOKEN}" for r in hub.requests)


def test_hub_errors_name_the_model_and_the_fix(hub: HubServer, cache: Path, tmp_path: Path) -> None:
    llama(tmp_path / "model")
    hub.publish(tmp_path / "model", "org/errors")
    with pytest.raises(suture.CheckpointNotFoundError, match="has no model 'org/absent'"):
        suture.open("hf://org/absent")
    with pytest.raises(suture.CheckpointNotFoundError, match="no revision 'nope'"):
        suture.open("hf://org/errors@nope")
    with pytest.raises(suture.CheckpointNotFoundError, match="No such file or folder"):
        suture.open("hf://org/errors/absent")
    with pytest.raises(suture.SurgeryError, match="names no Hub model"):
        suture.open("hf://just-a-name")
    with pytest.raises(suture.UnsupportedError, match="model repositories"):
        suture.open("hf://datasets/org/data")
    with pytest.raises(suture.SurgeryError, match="does not push"):
        suture.save({"w": np.ones(2)}, "hf://org/errors/out")


# --- the local cache, offline ----------------------------------------------------------------------
@pytest.fixture
def cached(hub: HubServer, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two models downloaded by snapshot_download, then the Hub made unreachable."""
    models = {}
    for seed, name in enumerate(("org/cached-a", "org/cached-b"), start=1):
        folder = tmp_path / name.replace("/", "-")
        models[name] = llama(folder, shard=100_000, seed=seed)
        hub.publish(folder, name)
        hf.snapshot_download(name, endpoint=hub.url, cache_dir=cache)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    hub.reset_counts()
    yield models
    assert hub.requests == []  # offline: the Hub was never asked


def test_a_cached_model_opens_by_its_id(cached: dict, cache: Path) -> None:
    ckpt = suture.open("org/cached-a")
    assert ckpt.location.startswith(str(cache / "models--org--cached-a" / "snapshots"))
    got = flat(ckpt)
    expected = cached["org/cached-a"]
    assert got.keys() == expected.keys()
    assert all(np.array_equal(got[k], expected[k]) for k in expected)
    assert flat(suture.open("hf://org/cached-a")).keys() == expected.keys()  # offline: the cache


def test_cli_reads_cached_ids_offline(cached: dict, tmp_path: Path) -> None:
    shown = runner.invoke(app, ["inspect", "org/cached-a", "--flat"])
    assert shown.exit_code == 0 and "model/norm/weight" in shown.output, shown.output
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - drop: lm_head\n")
    planned = runner.invoke(app, ["plan", str(recipe), "org/cached-a"])
    assert planned.exit_code == 0 and "No problems." in planned.output, planned.output
    converted = runner.invoke(
        app, ["convert", "org/cached-a", "mt", "--recipe", "llama3.1:maxtext", "--no-progress"]
    )
    assert converted.exit_code == 0, converted.output
    back = runner.invoke(
        app,
        ["convert", "mt", "back", "--recipe", "llama3.1:maxtext", "--reverse", "--no-progress"],
    )
    assert back.exit_code == 0, back.output
    for name in ("config.json", "tokenizer_config.json"):  # links in the cache, files here
        written = tmp_path / "back" / name
        assert written.is_file() and not written.is_symlink()
    restored, expected = tensors_of(tmp_path / "back"), cached["org/cached-a"]
    assert all(np.array_equal(restored[k], expected[k]) for k in expected)
    config = mergekit_config(tmp_path / "merge.yml", "org/cached-a", "org/cached-b")
    merged = runner.invoke(app, ["merge", str(config), "-o", "merged", "--no-progress"])
    assert merged.exit_code == 0, merged.output
    out = tensors_of(tmp_path / "merged")
    a, b = cached["org/cached-a"], cached["org/cached-b"]
    for name in a:
        np.testing.assert_allclose(out[name], 0.75 * a[name] + 0.25 * b[name], rtol=1e-6)
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["model_type"] == "llama"


def test_an_id_in_no_cache_names_the_cache_folder(cached: dict, cache: Path) -> None:
    result = runner.invoke(app, ["inspect", "org/not-downloaded"])
    assert result.exit_code == 2
    assert str(cache) in result.output and "hf download org/not-downloaded" in result.output
    with pytest.raises(suture.CheckpointNotFoundError, match="HF_HUB_OFFLINE is set"):
        suture.open("hf://org/not-downloaded")


def test_a_cached_model_is_never_written(cached: dict, tmp_path: Path) -> None:
    with pytest.raises(suture.DestinationError, match="write './org/cached-a'"):
        suture.save({"w": np.ones(2, np.float32)}, "org/cached-a")
    (tmp_path / "org").mkdir()
    suture.save({"w": np.ones(2, np.float32)}, "./org/cached-a", format="safetensors")
    assert (tmp_path / "org" / "cached-a" / "model.safetensors").is_file()


def test_only_the_caches_own_links_are_followed(cached: dict, cache: Path, tmp_path: Path) -> None:
    from suture._hf import SideFileWarning, side_files

    snapshot = Path(suture.open("org/cached-a").location)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for copying")
    (snapshot / "tokenizer.json").symlink_to(secret)
    with pytest.warns(SideFileWarning, match="symbolic link"):
        found = side_files(snapshot)
    assert "tokenizer.json" not in found
    assert found["config.json"].parent == cache / "models--org--cached-a" / "blobs"


def test_bare_relative_paths_stay_local(cache: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    save_file({"w": np.ones(3, np.float32)}, str(tmp_path / "runs" / "model.safetensors"))
    assert suture.open("runs/model.safetensors").format == "safetensors"
    suture.save({"w": np.ones(2, np.float32)}, "runs/out", format="safetensors")
    assert (tmp_path / "runs" / "out" / "model.safetensors").is_file()
