"""Hostile and broken family configs, and merge patterns that backtrack: each a clear error.

Issue 26, items 11 to 13. A config.json naming 10**9 layers fails at once in both directions,
naming the field and the layers the checkpoint holds; a config is read like a recipe (a
regular file of at most 1 MiB; a FIFO refused unopened); every wrong value a recipe reads is a
`SurgeryError` naming the field; merge ``per_leaf`` patterns are matched under a time bound.
Real tiny models (transformers' ``save_pretrained``), the CLI through typer's runner.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import suture
from suture.cli import app
from suture.families._convert import FAMILY_KEY, MAX_CONFIG_BYTES, convert_with_recipe, read_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

LLAMA = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
FAST = 5.0  # seconds: every refusal here comes before any planning or reading


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A tiny Llama (2 layers) in HF layout, and its MaxText conversions, scanned and not."""
    root = tmp_path_factory.mktemp("families")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(root / "hf")
    for layout in ("maxtext", "maxtext-unscanned"):
        convert_with_recipe(root / "hf", root / layout, f"llama3.1:{layout}", progress=False)
    return root


def _config(models: Path, folder: Path, **changes) -> Path:
    """The model's config.json with `changes` (None removes a field), written as JSON text
    (NaN and Infinity as Python's json writes them, the way a hostile file would hold them)."""
    config = json.loads((models / "hf" / "config.json").read_text())
    config.update(changes)
    path = folder / "config.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


def _convert(models: Path, out: Path, layout: str, reverse: bool, *extra: str):
    source = models / layout if reverse else models / "hf"
    arguments = ["convert", str(source), str(out), "--recipe", f"llama3.1:{layout}"]
    return CliRunner().invoke(
        app, [*arguments, *(["--reverse"] if reverse else []), "--no-progress", *extra]
    )


def _refused(result, *phrases: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error:") and "Traceback" not in result.output, result.output
    for phrase in phrases:
        assert phrase in result.output, result.output


# Item 11: the layer count against the tensors present, before any planning ------------------


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_billion_layers_fail_at_once_naming_the_field_and_the_layers_held(
    models, tmp_path, layout, reverse
):
    config = _config(models, tmp_path, num_hidden_layers=10**9)
    started = time.perf_counter()
    result = _convert(models, tmp_path / "out", layout, reverse, "--config", str(config))
    assert time.perf_counter() - started < FAST
    _refused(result, "'num_hidden_layers' is 1000000000", "1000000000 layers", "holds 2")
    held = (
        "layers on axis 1"
        if reverse and layout == "maxtext"
        else "layers_N/self_attention/query/kernel' for N = 0-1"
        if reverse
        else "'model.layers.N.self_attn.q_proj.weight' for N = 0-1"
    )
    assert held in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_fewer_layers_than_the_checkpoint_holds_would_lose_one(models, tmp_path, layout, reverse):
    config = _config(models, tmp_path, num_hidden_layers=1)
    result = _convert(models, tmp_path / "out", layout, reverse, "--config", str(config))
    _refused(result, "'num_hidden_layers' is 1: 1 layer")
    assert "holds 2" in result.output
    assert ("layer 1 would be lost" in result.output) != (reverse and layout == "maxtext")


def test_a_recorded_config_is_checked_like_a_given_one(models, tmp_path):
    """The config a forward conversion recorded comes from the checkpoint: untrusted too."""
    ckpt = suture.open(models / "maxtext")
    metadata = dict(ckpt.custom_metadata)
    recorded = dict(metadata[FAMILY_KEY])
    recorded["config"] = {**recorded["config"], "num_hidden_layers": 10**9}
    metadata[FAMILY_KEY] = recorded
    suture.save(ckpt.tree, tmp_path / "maxtext", metadata=metadata, progress=False)
    started = time.perf_counter()
    result = _convert(tmp_path, tmp_path / "out", "maxtext", True)
    assert time.perf_counter() - started < FAST
    _refused(result, "'num_hidden_layers' is 1000000000", "holds 2")


def test_a_vocabulary_the_embedding_does_not_have_is_refused(tmp_path):
    """Gemma 2 pads the embedding from vocab_size rows: a vocab_size of 10**12 would pad a
    64-row embedding to 10**12 rows (terabytes) instead of failing."""
    torch.manual_seed(0)
    gemma = transformers.Gemma2Config(**LLAMA, head_dim=16, query_pre_attn_scalar=16)
    transformers.Gemma2ForCausalLM(gemma).save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(suture.SurgeryError, match=r"has 64 rows; the config says 1000000000000"):
        convert_with_recipe(
            tmp_path / "hf",
            tmp_path / "mt",
            "gemma2:maxtext",
            config={**config, "vocab_size": 10**12},
            progress=False,
        )
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma2:maxtext", progress=False)
    with pytest.raises(suture.SurgeryError, match=r"has 64 rows; the config says 100 \("):
        convert_with_recipe(
            tmp_path / "mt",
            tmp_path / "back",
            "gemma2:maxtext",
            reverse=True,
            config={**config, "vocab_size": 100},
            progress=False,
        )
    assert not (tmp_path / "back").exists()


# Item 11: a config file is read like a recipe ------------------------------------------------


@contextlib.contextmanager
def _unblocked(fifo: Path, seconds: float):
    """Opens `fifo` for writing after `seconds`, so that a reader blocked on it gets EOF and
    a regression fails the test instead of hanging it."""

    def release() -> None:
        with contextlib.suppress(OSError):  # no reader: nothing is blocked
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_fifo_given_as_config_is_refused_unopened(models, tmp_path, reverse):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with _unblocked(fifo, 2 * FAST):
        result = _convert(models, tmp_path / "out", "maxtext", reverse, "--config", str(fifo))
        shown = CliRunner().invoke(app, ["recipes", "llama3.1:maxtext", "--config", str(fifo)])
    assert time.perf_counter() - started < FAST
    _refused(result, "is not a regular file (a folder, pipe or device)", "config.json")
    _refused(shown, "is not a regular file")


def test_a_fifo_beside_the_weights_is_refused_by_name(models, tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(models / "hf" / "model.safetensors")
    os.mkfifo(folder / "config.json")
    started = time.perf_counter()
    with _unblocked(folder / "config.json", 2 * FAST):
        result = _convert(tmp_path, tmp_path / "out", "maxtext", False)
    assert time.perf_counter() - started < FAST
    _refused(result, f"{str(folder / 'config.json')!r} is not a regular file")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"a": "' + b"x" * MAX_CONFIG_BYTES + b'"}', "is over 1024 KiB; a config.json is small"),
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply to be a config.json"),
        (b'{"num_hidden_layers": 2', "Cannot read the model config"),
        (b"\xff\xfe{}", "Cannot read the model config"),
        (b"[1, 2]", "holds no JSON object"),
        (b"", "Cannot read the model config"),
    ],
    ids=["oversized", "deep", "truncated", "not-utf8", "a-list", "empty"],
)
def test_a_config_file_that_is_not_a_config_is_refused(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(suture.ConfigMismatchError, match=message):
        read_config(path)


def test_a_device_is_not_read_as_a_config(tmp_path):
    (tmp_path / "config.json").symlink_to("/dev/zero")  # endless: never read, refused unopened
    with pytest.raises(suture.ConfigMismatchError, match="is not a regular file"):
        read_config(tmp_path / "config.json")


def test_a_remote_config_is_read_up_to_the_cap_and_checked(models, http, tmp_path):
    """Over HTTP (a real range server on 127.0.0.1): at most the cap is fetched from an
    oversized config, and a served config naming 10**9 layers fails like a local one."""
    big = tmp_path / "big.json"
    big.write_bytes(b'{"a": "' + b"x" * (8 * MAX_CONFIG_BYTES) + b'"}')
    url = http.publish(big, f"{tmp_path.name}/big-config.json")
    before = http.bytes_sent
    with pytest.raises(suture.ConfigMismatchError, match="is over 1024 KiB"):
        read_config(url)
    assert http.bytes_sent - before <= 2 * MAX_CONFIG_BYTES
    served = http.publish(
        _config(models, tmp_path, num_hidden_layers=10**9), f"{tmp_path.name}/config.json"
    )
    started = time.perf_counter()
    result = _convert(models, tmp_path / "out", "maxtext", False, "--config", served)
    assert time.perf_counter() - started < FAST
    _refused(result, "'num_hidden_layers' is 1000000000", "holds 2")


# Item 13: every wrong value a SurgeryError naming the field ---------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_attention_heads": 0, "head_dim": None}, "'num_attention_heads' is 0"),
        ({"hidden_size": "16", "head_dim": None}, "'hidden_size' is '16'"),
        ({"num_key_value_heads": [1]}, "'num_key_value_heads' is [1]"),
        ({"num_hidden_layers": "two"}, "'num_hidden_layers' is 'two'"),
        ({"num_hidden_layers": math.nan}, "'num_hidden_layers' is nan"),
        ({"num_hidden_layers": math.inf}, "'num_hidden_layers' is inf"),
        ({"num_hidden_layers": 2.5}, "'num_hidden_layers' is 2.5"),
        ({"num_hidden_layers": True}, "'num_hidden_layers' is True"),
        ({"num_hidden_layers": -2}, "'num_hidden_layers' is -2"),
        ({"num_hidden_layers": 2**64}, "'num_hidden_layers' is 18446744073709551616"),
        ({"head_dim": 0}, "'head_dim' is 0"),
        ({"num_hidden_layers": None}, "config.json has no 'num_hidden_layers'"),
        ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' is 'false'"),
        ({"attention_bias": 0}, "'attention_bias' is 0"),
        ({"hidden_size": 16, "num_attention_heads": 32, "head_dim": None}, "'head_dim' is 0"),
    ],
    ids=lambda value: repr(value)[:40],
)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_wrong_config_value_names_the_field(models, tmp_path, changes, message, reverse):
    config = _config(models, tmp_path, **changes)
    result = _convert(models, tmp_path / "out", "maxtext", reverse, "--config", str(config))
    _refused(result, message)
    assert "needs" in result.output or "has no" in result.output
    assert not (tmp_path / "out").exists()


def test_a_computed_default_names_where_it_came_from(models):
    config = json.loads((models / "hf" / "config.json").read_text())
    config.update(hidden_size=16, num_attention_heads=32)
    del config["head_dim"]
    with pytest.raises(
        suture.ConfigMismatchError,
        match=r"'head_dim' is 0 \(its default, hidden_size // num_attention_heads\)",
    ):
        suture.families.get_recipe("llama3.1:maxtext").operations_table(config)


@pytest.mark.parametrize("value", [10**400, -(10**400), math.nan, "16", None])
def test_a_scalar_field_must_be_a_finite_number(value):
    """Gemma 2's query_pre_attn_scalar is neither a count nor a flag: any finite number."""
    config = dict(LLAMA, model_type="gemma2", head_dim=16, query_pre_attn_scalar=value)
    recipe = suture.families.get_recipe("gemma2:maxtext")
    if value is None:  # null: its default, head_dim
        assert recipe.config_names(config)["query_pre_attn_scalar"] == 16
        return
    with pytest.raises(suture.ConfigMismatchError, match="'query_pre_attn_scalar' is .* finite"):
        recipe.config_names(config)


def test_a_config_that_is_not_a_mapping_is_refused():
    with pytest.raises(suture.ConfigMismatchError, match="a JSON object; got list"):
        suture.families.get_recipe("qwen3:maxtext").config_names([1, 2])  # type: ignore[arg-type]


# Item 12: merge per_leaf patterns are matched under a time bound -----------------------------

BACKTRACKING = "(a|a)+c"  # 2**n paths through n a's: `re` runs for ages on 40 of them


def test_a_per_leaf_pattern_that_backtracks_is_stopped():
    name = "a" * 40
    started = time.perf_counter()
    with pytest.raises(suture.SurgeryError, match=r"'\(a\|a\)\+c' took over 2 s to match"):
        suture.merge(
            [{name: np.ones(2, np.float32)}, {name: np.zeros(2, np.float32)}],
            "linear",
            per_leaf={BACKTRACKING: {"take": 0}},
        )
    assert time.perf_counter() - started < 3 * FAST


def test_a_per_leaf_pattern_in_a_merge_config_is_stopped(tmp_path):
    from safetensors.numpy import save_file

    for seed, model in enumerate(("m0", "m1")):
        (tmp_path / model).mkdir()
        save_file({"a" * 40: np.full(2, seed, np.float32)}, tmp_path / model / "w.safetensors")
    config = tmp_path / "merge.yaml"
    config.write_text(
        f"method: linear\nmodels: [m0/w.safetensors, m1/w.safetensors]\n"
        f"per_leaf:\n  '{BACKTRACKING}': {{take: 1}}\n"
    )
    started = time.perf_counter()
    result = CliRunner().invoke(
        app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"]
    )
    assert time.perf_counter() - started < 3 * FAST
    _refused(result, "took over 2 s to match", BACKTRACKING)


def test_a_per_leaf_pattern_the_regex_module_refuses_is_a_merge_error(tmp_path):
    with pytest.raises(suture.MergeError, match=r"per_leaf: '\(\?P<x' is not a valid regex"):
        suture.merge([{"w": np.ones(2)}, {"w": np.ones(2)}], "linear", per_leaf={"(?P<x": {}})


def test_a_fifo_given_as_merge_config_is_refused_unopened(tmp_path):
    """A merge config is read like a recipe and a family config (it was already size-capped,
    but read whole first)."""
    fifo = tmp_path / "merge.yaml"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with _unblocked(fifo, 2 * FAST):
        result = CliRunner().invoke(
            app, ["merge", str(fifo), "-o", str(tmp_path / "out"), "--no-progress"]
        )
    assert time.perf_counter() - started < FAST
    _refused(result, "is not a regular file (a folder, pipe or device)", "a merge config")
