"""A newcomer's first hour, round three (issue 41): offline remotes that fail at once, no
native log lines, the Hub cache offline, and the wording of errors and summaries.

Remote tests use a reserved ``.invalid`` name (which never resolves) and closed ports on
127.0.0.1 only; no real address is contacted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._location.remote import forget_stores
from tests.remote_servers import free_port

RETRY_NOTE = (
    "suture gives up at once on this, without retrying; transient failures (a timeout, a "
    "dropped connection, a 5xx answer) are retried SUTURE_REMOTE_RETRIES times (now 10) "
    "within SUTURE_REMOTE_TIMEOUT seconds (now 120)."
)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "suture", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _fails_at_once(url: str, **env: str) -> str:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    forget_stores()
    start = time.monotonic()
    try:
        with pytest.raises(suture.SurgeryError) as failed:
            suture.open(url)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        forget_stores()
    assert time.monotonic() - start < 5
    return str(failed.value)


# --- item 1: permanent failures are not retried ----------------------------------------


@pytest.mark.parametrize(
    ("url", "env", "shown"),
    [
        ("https://nowhere.invalid/model", {}, "https://nowhere.invalid"),
        (
            "gs://bucket/model",
            {"TENSORSTORE_GCS_HTTP_URL": "http://nowhere.invalid"},
            "gs://bucket",
        ),
        (
            "s3://bucket/model",
            {"AWS_ENDPOINT_URL_S3": "http://nowhere.invalid:9000"},
            "s3://bucket",
        ),
    ],
)
def test_a_host_name_that_does_not_resolve_fails_at_once(url, env, shown) -> None:
    message = _fails_at_once(url, **env)
    assert message == (
        f"Cannot reach {shown}: the host name 'nowhere.invalid' does not resolve "
        f"({message.split('(')[1].split(')')[0]}): offline, or a typo in the name. {RETRY_NOTE}"
    )


@pytest.mark.parametrize("scheme", ["http", "gs", "s3"])
def test_a_refused_connection_fails_at_once(scheme: str) -> None:
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    url = {"http": f"{endpoint}/model", "gs": "gs://bucket/m", "s3": "s3://bucket/m"}[scheme]
    env = {"gs": {"TENSORSTORE_GCS_HTTP_URL": endpoint}, "s3": {"AWS_ENDPOINT_URL_S3": endpoint}}
    message = _fails_at_once(url, **env.get(scheme, {}))
    shown = {"http": endpoint, "gs": "gs://bucket", "s3": "s3://bucket"}[scheme]
    assert message == (
        f"Cannot reach {shown}: 127.0.0.1:{port} refused the connection (Connection refused): "
        f"no server listens there, or the network is down. Check the address and that the "
        f"server runs. {RETRY_NOTE}"
    )


def test_the_retry_setting_is_named_and_checked(monkeypatch) -> None:
    monkeypatch.setenv("SUTURE_REMOTE_RETRIES", "3")
    message = _fails_at_once("https://nowhere.invalid/m")
    assert "retried SUTURE_REMOTE_RETRIES times (now 3)" in message
    monkeypatch.setenv("SUTURE_REMOTE_RETRIES", "many")
    with pytest.raises(suture.SurgeryError, match="SUTURE_REMOTE_RETRIES='many' is not a number"):
        suture.open("https://nowhere.invalid/m")


def test_the_command_line_fails_at_once_offline() -> None:
    start = time.monotonic()
    result = cli("inspect", "https://nowhere.invalid/model")
    assert time.monotonic() - start < 15  # the interpreter's start included
    assert result.returncode == 2
    assert result.stderr.startswith(
        "Error: Cannot reach https://nowhere.invalid: the host name 'nowhere.invalid' does not"
    )


# --- item 2: no native log line; a scheme's own credentials hint -----------------------


def test_gs_without_credentials_prints_no_native_line_and_says_what_is_missing(
    gcs: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # no gcloud credentials file
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_AUTH_TOKEN_FOR_TESTING"}
    env.update(HOME=str(home), GCE_METADATA_HOST="nowhere.invalid")
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    command = [sys.executable, "-m", "suture", "inspect", f"{gcs}/absent/m.safetensors"]
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert quiet.returncode != 0
    assert "google_auth_provider" not in quiet.stderr, quiet.stderr
    assert quiet.stderr.startswith("Error: ")
    debug = subprocess.run(
        [sys.executable, "-m", "suture", "--debug", *command[3:]],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "google_auth_provider" in debug.stderr  # --debug shows what the driver logged


def test_access_errors_name_each_schemes_credentials(monkeypatch, tmp_path: Path) -> None:
    from suture._location.credentials import credentials_hint

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (
        "GOOGLE_AUTH_TOKEN_FOR_TESTING",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_CONFIG",
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    gcloud = tmp_path / ".config/gcloud/application_default_credentials.json"
    assert credentials_hint("gs") == (
        f"No GCS credentials were found (GOOGLE_APPLICATION_CREDENTIALS is not set, and there "
        f"is no {gcloud}), so the request went without them, which reads public buckets only. "
        f"Check the path; for a private bucket run `gcloud auth application-default login`, "
        f"set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or run on a "
        f"Google Cloud machine (its metadata server)."
    )
    assert credentials_hint("s3").startswith("No AWS credentials were found")
    assert credentials_hint("https") == "Check the URL, and that the server serves it."
    assert "credential" not in credentials_hint("http")
    gcloud.parent.mkdir(parents=True)
    gcloud.write_text("{}")
    assert credentials_hint("gs") == (
        f"Check the path, and that the GCS credentials in use ({gcloud}) may read it."
    )


def test_an_http_error_says_nothing_of_credentials(http, tmp_path: Path) -> None:
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "m.safetensors"))
    url = http.publish(tmp_path / "m.safetensors", "creds3/m.safetensors")
    with pytest.raises(suture.SurgeryError) as failed:
        suture.open(url.replace("m.safetensors", "absent.safetensors"))
    assert "credential" not in str(failed.value)


# --- items 3 and 4: the Hub cache when the Hub cannot be reached; ORG/NAME@REV ---------

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TAGGED = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding ``org/model`` at `COMMIT` (``main``) and `TAGGED` (tag ``v1``), the
    Hub at a name that does not resolve, and HF_HUB_OFFLINE unset."""
    root = tmp_path / "hf-cache"
    for commit, value, ref in ((COMMIT, 1.0, "main"), (TAGGED, 2.0, "v1")):
        snapshot = root / "models--org--model" / "snapshots" / commit
        snapshot.mkdir(parents=True)
        save_file({"w": np.full(3, value, np.float32)}, str(snapshot / "model.safetensors"))
        (root / "models--org--model" / "refs").mkdir(exist_ok=True)
        (root / "models--org--model" / "refs" / ref).write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_ENDPOINT", "http://nowhere.invalid")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)  # `org/model` is no local path here
    return root


def test_hf_url_without_network_reads_the_cached_snapshot_with_one_warning(hf_cache) -> None:
    pytest.importorskip("huggingface_hub")
    with pytest.warns(suture.SutureWarning) as warned:
        ckpt = suture.open("hf://org/model")
        again = suture.open("hf://org/model/model.safetensors")  # no second warning
    assert len(warned) == 1
    assert str(warned[0].message) == (
        "http://nowhere.invalid cannot be reached (ConnectError: [Errno -2] Name or service "
        "not known): reading 'hf://org/model@main' from the local Hugging Face cache, at "
        f"commit {COMMIT}, as huggingface_hub does offline. Set HF_HUB_OFFLINE=1 to read the "
        "cache without asking the Hub."
    )
    np.testing.assert_array_equal(ckpt["w"].read(), np.ones(3, np.float32))
    np.testing.assert_array_equal(again["w"].read(), np.ones(3, np.float32))
    with pytest.warns(suture.SutureWarning, match=f"at commit {TAGGED}"):
        tagged = suture.open("hf://org/model@v1")
    np.testing.assert_array_equal(tagged["w"].read(), np.full(3, 2.0, np.float32))


def test_hf_url_without_network_and_not_cached_is_still_an_error(hf_cache) -> None:
    pytest.importorskip("huggingface_hub")
    with pytest.raises(suture.SurgeryError, match="Cannot read 'hf://org/other'"):
        suture.open("hf://org/other")["w"].read()


def test_a_bare_cached_id_takes_a_revision(hf_cache) -> None:
    np.testing.assert_array_equal(suture.open("org/model@v1")["w"].read(), np.full(3, 2.0))
    np.testing.assert_array_equal(suture.open(f"org/model@{COMMIT}")["w"].read(), np.ones(3))
    with pytest.raises(suture.CheckpointNotFoundError) as missing:
        suture.open("org/model@v2")
    assert str(missing.value) == (
        f"No such file or folder: 'org/model@v2', and no Hugging Face model of that id at "
        f"revision 'v2' in the cache {str(hf_cache)!r} (looked for "
        f"{str(hf_cache / 'models--org--model')!r}). Check the path; for a model on the Hub, "
        f"download it first (`hf download org/model --revision v2`), read it as "
        f"'hf://org/model@v2', or set HF_HUB_CACHE to the cache that holds it."
    )


def test_offline_hint_for_a_missing_revision_names_it(hf_cache, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        suture.CheckpointNotFoundError, match=r"`hf download org/model --revision v2`"
    ):
        suture.open("hf://org/model@v2")


# --- items 6 and 7: a typo in a user's table blames the table --------------------------

GPT2_TABLE = (
    """\
names: [my_gpt2]
description: GPT-2 for a test.
follows: nothing
config:
  require:
    model_type: [gpt2]
  defaults:
    num_hidden_layers: n_layer
    num_attention_heads: n_head
ignore:
  - transformer\\.h\\.\\d+\\.attn\\.bias
leaves:
  - {maxtext: token_embedder/embedding, hf: transformer.wte.weight}
  - {maxtext: position_embedder/embedding, hf: transformer.wpe.weight}
  - {maxtext: decoder/ln_f/scale, hf: transformer.ln_f.weight}
  - {maxtext: decoder/ln_f/bias, hf: transformer.ln_f.bias}
"""
    + "".join(
        f'  - {{maxtext: decoder/layers/{path}, hf: "transformer.h.{{layer}}.{name}"}}\n'
        for path, name in [
            ("ln_1/scale", "ln_1.weight"),
            ("ln_1/bias", "ln_1.bias"),
            ("attn/c_attn/kernel", "attn.c_attn.weight"),
            ("attn/c_attn/bias", "attn.c_attn.bias"),
            ("attn/c_proj/bias", "attn.c_proj.bias"),
            ("ln_2/scale", "ln_2.weight"),
            ("ln_2/bias", "ln_2.bias"),
            ("mlp/c_fc/kernel", "mlp.c_fc.weight"),
            ("mlp/c_fc/bias", "mlp.c_fc.bias"),
            ("mlp/c_proj/kernel", "mlp.c_proj.weight"),
            ("mlp/c_proj/bias", "mlp.c_proj.bias"),
        ]
    )
    + """\
  - maxtext: decoder/layers/attn/c_proj/kernel
    hf: transformer.h.{layer}.attn.c_proj.weight
    ops:
      - split_axis: {axis: 0, sizes: [num_attention_heads, n_embd // num_attention_heads]}
"""
)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=3,
        n_head=2,
        n_embd=16,
        vocab_size=32,
        n_positions=16,
        eos_token_id=0,
        bos_token_id=0,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(root / "hf")
    return root


def _convert_with(gpt2: Path, tmp_path: Path, table: str) -> str:
    file = tmp_path / "gpt2.yaml"
    file.write_text(table)
    with pytest.raises(suture.SurgeryError) as failed:
        suture.convert(gpt2 / "hf", tmp_path / "out", recipe=str(file), progress=False)
    assert not (tmp_path / "out").exists()
    return str(failed.value).replace(str(file), "TABLE")


def test_the_table_converts_as_written(gpt2: Path, tmp_path: Path) -> None:
    (tmp_path / "gpt2.yaml").write_text(GPT2_TABLE)
    suture.convert(
        gpt2 / "hf", tmp_path / "out", recipe=str(tmp_path / "gpt2.yaml"), progress=False
    )
    assert (tmp_path / "out").is_dir()


def test_a_typo_in_an_hf_name_names_the_leaf_and_the_closest_tensors(gpt2, tmp_path) -> None:
    table = GPT2_TABLE.replace("attn.c_attn.weight", "attn.c_atn.weight")
    assert _convert_with(gpt2, tmp_path, table) == (
        "Recipe 'my_gpt2:maxtext' (table leaf 'decoder/layers/attn/c_attn/kernel', TABLE line "
        "19): no tensor of the checkpoint matches the leaf's hf: name "
        "'transformer.h.{layer}.attn.c_atn.weight', for any layer. Closest tensor names in the "
        "checkpoint: 'transformer.h.{layer}.attn.c_attn.weight', "
        "'transformer.h.{layer}.attn.c_proj.weight', 'transformer.h.{layer}.attn.c_attn.bias'. "
        "Check the hf: name in the table."
    )


def test_a_typo_in_an_expression_names_the_leaf_line_and_closest_field(gpt2, tmp_path) -> None:
    table = GPT2_TABLE.replace("n_embd // num_attention_heads", "n_embd // num_attention_head")
    assert _convert_with(gpt2, tmp_path, table) == (
        "Recipe 'my_gpt2:maxtext' (table leaf 'decoder/layers/attn/c_proj/kernel', TABLE line "
        "31) reads the config field 'num_attention_head', which config.json does not have. "
        "Did you mean 'num_attention_heads'? Fix the table's expression, or pass the model's "
        "own config.json (--config)."
    )


# --- items 8 and 9: leaves the target adds: init= first, one close "Did you mean" -------


def test_leaves_only_the_target_has_say_init_first_and_suggest_once(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    old = {"m": {"linear": {"kernel": np.ones((2, 2), np.float32)}}}
    suture.save(old, tmp_path / "run")
    target = {
        "m": {
            "linear": {
                "kernal": np.zeros((2, 2), np.float32),  # a typo: suggested
                "lora": {"lora_a": np.zeros(2, np.float32), "lora_b": np.zeros(2, np.float32)},
            }
        },
        "opt": {"mu": {"linear": {"lora": {"lora_a": np.zeros(2, np.float32)}}}},
    }
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), target)
    with pytest.raises(suture.MissingLeafError) as missing:
        suture.load(tmp_path / "run", target=abstract, partial=True)
    assert str(missing.value).strip("'\"") == (
        "The target has 4 leaf path(s) that no source provides: 'm/linear/kernal', "
        "'m/linear/lora/lora_a', 'm/linear/lora/lora_b', 'opt/mu/linear/lora/lora_a'. Did you "
        "mean 'm/linear/kernel'? To create them, pass init= (a tree of values or initializers; "
        "for a Flax NNX model and optimizer built fresh, init={'model': nnx.state(model), "
        "'optimizer': nnx.state(optimizer)}); else fix the target's paths, or map them with "
        "rules."
    )
    loaded = suture.load(tmp_path / "run", target=abstract, init=target, partial=True)
    np.testing.assert_array_equal(loaded["m"]["linear"]["lora"]["lora_a"], np.zeros(2))


# --- items 13 and 18: the plan's summary, and the progress bar's early estimate ---------


def test_a_plan_of_one_output_and_a_traced_function_read_as_what_happened() -> None:
    jnp = pytest.importorskip("jax.numpy")

    def scaled(tree):
        return {"w": jnp.tanh(tree["w"])}

    text = str(suture.plan(scaled, suture.open({"w": np.ones(3, np.float32)})))
    assert "\n1 output; reads " in text
    assert (
        "Function call: scaled: computed by tracing with jax (on shapes and dtypes; nothing is "
        "read).\nNo problems." in text
    )
    assert "failed" not in text and "ImplicitReadError" not in text


def test_the_estimate_of_time_left_starts_from_the_first_bytes() -> None:
    from suture._exec.progress import Eta

    eta = Eta()
    assert eta(4.0, 0, 1000) is None  # nothing written yet: no estimate
    assert eta(6.0, 10, 1000) is None  # the first bytes: the clock starts here
    # then 100 bytes a second: 990 bytes left after the first take 9.9 s in all
    assert eta(6.5, 60, 1000) is None  # under a second of writing: no guide yet
    assert eta(8.0, 210, 1000) == pytest.approx(7.9)


# --- item 17: diff --values names its tolerances, and --ulp N -----------------------------


def test_diff_values_hints_at_tolerances_and_takes_ulp(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from suture.cli import app

    a = np.array([1.0, 3.0, -2.0, 0.5], np.float32)
    b = a.copy()
    b[1] = np.nextafter(a[1], np.float32(4))  # one ulp
    b[2] = np.nextafter(a[2], np.float32(-4))
    save_file({"w": a}, str(tmp_path / "a.safetensors"))
    save_file({"w": b}, str(tmp_path / "b.safetensors"))
    runner = CliRunner()
    paths = [str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    exact = runner.invoke(app, ["diff", *paths, "--values"])
    assert exact.exit_code == 1
    assert exact.stdout.endswith(
        "1 difference(s).\nValues were compared exactly: --rtol/--atol allow a tolerance, and "
        "--ulp N allows N units in the last place (--ulp 1 for a round trip within 1 ulp).\n"
    )
    within = runner.invoke(app, ["diff", *paths, "--values", "--ulp", "1"])
    assert within.exit_code == 0 and within.stdout == "Equal.\n"
    b[3] = np.nextafter(np.nextafter(a[3], np.float32(1)), np.float32(1))  # two ulps
    save_file({"w": b}, str(tmp_path / "b.safetensors"))
    two = runner.invoke(app, ["diff", *paths, "--values", "--ulp", "1"])
    assert two.exit_code == 1 and "1 elements differ" in two.stdout
    assert "compared exactly" not in two.stdout


# --- item 16: recipe names in any case, a family alone, a short "Did you mean" -----------


def test_recipe_names_in_any_case_and_a_family_alone() -> None:
    from suture.families import get_recipe

    assert get_recipe("Llama3.1:MaxText").name == "llama3.1:maxtext"
    assert get_recipe("LLAMA3.1").name == "llama3.1:maxtext"  # its only target
    assert get_recipe("qwen3-next").name == "qwen3-next:maxtext"
    with pytest.raises(suture.RecipeError) as several:
        get_recipe("Llama3")
    assert str(several.value) == (
        "'Llama3' names the family 'llama3', which several targets take; name one:\n"
        "  --recipe llama3:maxtext\n  --recipe llama3:maxtext-unscanned\n"
        "  --recipe llama3:tunix\n(`suture recipes` says what each target is.)"
    )


def test_an_unknown_recipe_name_gets_a_short_list(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from suture.cli import app
    from suture.families import recipe_names

    suture.save({"w": np.ones(2, np.float32)}, tmp_path / "ckpt")
    done = CliRunner().invoke(
        app, ["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--recipe", "lama3.1"]
    )
    assert done.exit_code == 2
    lines = done.output.splitlines()
    assert lines[:3] == [
        "Error: No built-in recipe 'lama3.1', and no recipe file of that name. Did you mean:",
        "  llama3.1:maxtext",
        "  llama3:maxtext",
    ]
    assert lines[-1].endswith(
        f"`suture recipes` lists all {len(recipe_names())}; a recipe file ends in .py, .yaml, "
        ".yml, .toml."
    )
    assert len(lines) <= 6 and all(len(line) < 200 for line in lines)


# --- item 14: --dequantize of a Hugging Face folder writes a Hugging Face folder ----------


def test_dequantize_without_format_writes_a_bfloat16_hugging_face_folder(tmp_path: Path) -> None:
    import json

    import ml_dtypes
    from typer.testing import CliRunner

    from suture.cli import app

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 128)).astype(ml_dtypes.bfloat16)
    suture.save({"model": {"up": {"weight": weight}}}, tmp_path / "bf16", format="safetensors")
    (tmp_path / "bf16" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    suture.convert(tmp_path / "bf16", tmp_path / "fp8", format="safetensors", quantize="fp8-block")
    done = CliRunner().invoke(
        app, ["convert", str(tmp_path / "fp8"), str(tmp_path / "out"), "--dequantize"]
    )
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    assert (out / "model.safetensors").is_file() and not (out / "_METADATA").exists()
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"
    leaf = suture.open(out)["model/up/weight"]
    assert leaf.dtype == ml_dtypes.bfloat16 and leaf.shape == (256, 128)
    orbax = CliRunner().invoke(
        app,
        [
            "convert",
            str(tmp_path / "fp8"),
            str(tmp_path / "ob"),
            "--dequantize",
            "--format",
            "orbax",
        ],
    )
    assert orbax.exit_code == 0 and suture.open(tmp_path / "ob").format == "orbax"


# --- item 11: one truth about quantized sources of DeepSeek-V3 and gpt-oss ----------------


def test_quantized_families_say_they_dequantize_everywhere() -> None:
    from suture.families import get_recipe

    root = Path(__file__).resolve().parent.parent
    families_page = (root / "docs" / "families.md").read_text()
    for name in ("deepseek3:maxtext", "gpt-oss:maxtext"):
        description = get_recipe(name).description
        assert "unquantized" not in description and "dequantized as read" in description
    for row in families_page.splitlines():
        if row.startswith(("| `deepseek3` |", "| `gpt-oss` |")):
            assert "unquantized" not in row and "dequantized as read" in row


# --- item 5: a user's table for a Flax model (target: flax), from the docs as pasted ------


def test_the_recipe_tables_flax_example_runs_as_pasted(gpt2: Path, tmp_path, monkeypatch) -> None:
    import re
    import shutil

    page = (Path(__file__).resolve().parent.parent / "docs" / "recipe-tables.md").read_text()
    (table,) = [b for b in re.findall(r"```yaml\n(.*?)```", page, re.S) if "gpt2_flax" in b]
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "class GPT2" in b]
    monkeypatch.chdir(tmp_path)
    shutil.copytree(gpt2 / "hf", tmp_path / "gpt2_hf")
    (tmp_path / "gpt2_flax.yaml").write_text(table)
    namespace: dict = {}
    exec(compile(code, "recipe-tables.md", "exec"), namespace)
    ckpt = suture.open(tmp_path / "gpt2_flax")
    assert "step" not in ckpt.paths() and "h/c_attn/kernel" in ckpt.paths()
    assert ckpt["h/c_attn/kernel"].shape == (3, 16, 48)  # layers first, for nnx.scan


def test_a_flax_table_refuses_a_layer_placeholder_in_its_paths(gpt2: Path, tmp_path) -> None:
    table = (
        "names: [f]\ntarget: flax\nleaves:\n"
        '  - {flax: "h/{layer}/ln_1/scale", hf: "transformer.h.{layer}.ln_1.weight"}\n'
    )
    (tmp_path / "f.yaml").write_text(table)
    with pytest.raises(suture.RecipeError, match="a Flax path has no placeholder"):
        suture.convert(gpt2 / "hf", tmp_path / "out", recipe=str(tmp_path / "f.yaml"))
