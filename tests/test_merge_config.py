"""`suture merge CONFIG`: mergekit's YAML schema (gradients, filters, slices), Hugging Face
output like mergekit's, and clear errors for every wrong field of a merge config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

from suture.cli import app

LAYERS = 4


def hf_model(folder: Path, seed: int, layers: int = LAYERS) -> dict[str, np.ndarray]:
    """A tiny Llama-shaped Hugging Face folder: safetensors, config.json, tokenizer files."""
    rng = np.random.default_rng(seed)
    tensors = {"model.embed_tokens.weight": rng.standard_normal((8, 4)).astype(np.float32)}
    for i in range(layers):
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = rng.standard_normal((4, 4)).astype(
            np.float32
        )
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = rng.standard_normal((6, 4)).astype(
            np.float32
        )
    tensors["model.norm.weight"] = rng.standard_normal(4).astype(np.float32)
    tensors["lm_head.weight"] = rng.standard_normal((8, 4)).astype(np.float32)
    folder.mkdir()
    save_file(tensors, folder / "model.safetensors")
    config = {"model_type": "llama", "num_hidden_layers": layers, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text(json.dumps({"model": f"tokenizer {seed}"}))
    (folder / "tokenizer_config.json").write_text("{}")
    return tensors


def run_merge(config: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["merge", str(config), "-o", str(out), "--no-progress", *extra])


def test_mergekit_linear_config_writes_a_hugging_face_folder(tmp_path: Path) -> None:
    a, b = hf_model(tmp_path / "a", 1), hf_model(tmp_path / "b", 2)
    config = tmp_path / "mergekit.yml"
    config.write_text(
        "merge_method: linear\n"
        "models:\n"
        "  - model: a\n    parameters: {weight: 0.7}\n"
        "  - model: b\n    parameters: {weight: 0.3}\n"
        "dtype: float32\n"
    )
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "mergekit_config.yml",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    merged = load_file(out / "model.safetensors")
    assert sorted(merged) == sorted(a)
    for name in a:
        np.testing.assert_allclose(merged[name], 0.7 * a[name] + 0.3 * b[name], rtol=1e-6)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == LAYERS
    assert (out / "tokenizer.json").read_text() == (tmp_path / "a" / "tokenizer.json").read_text()
    card = (out / "README.md").read_text()
    assert "linear merge method" in card and "merge_method: linear" in card


def test_gradients_and_filters_interpolate_across_layers(tmp_path: Path) -> None:
    a, b = hf_model(tmp_path / "a", 1), hf_model(tmp_path / "b", 2)
    config = tmp_path / "slerp.yml"
    config.write_text(
        "merge_method: slerp\n"
        "base_model: a\n"
        "models:\n  - model: a\n  - model: b\n"
        "parameters:\n"
        "  t:\n"
        "    - filter: self_attn\n      value: [0, 1]\n"
        "    - filter: mlp\n      value: [1, 0.5, 0]\n"
        "    - value: 0.25\n"
    )
    assert run_merge(config, tmp_path / "out").exit_code == 0
    merged = load_file(tmp_path / "out" / "model.safetensors")
    q = "model.layers.{}.self_attn.q_proj.weight"
    up = "model.layers.{}.mlp.up_proj.weight"
    # t = i / 3 for layer i; [0, 1] gives t itself; [1, 0.5, 0] gives 1 - t.
    np.testing.assert_allclose(merged[q.format(0)], a[q.format(0)], rtol=1e-6)
    np.testing.assert_allclose(merged[q.format(3)], b[q.format(3)], rtol=1e-6)
    np.testing.assert_allclose(merged[up.format(0)], b[up.format(0)], rtol=1e-6)
    np.testing.assert_allclose(merged[up.format(3)], a[up.format(3)], rtol=1e-6)
    from suture._merge.methods import slerp

    expected = slerp(1 / 3, a[q.format(1)], b[q.format(1)])
    np.testing.assert_allclose(merged[q.format(1)], expected, rtol=1e-5, atol=1e-6)
    # The embedding matches no filter, so it takes the unfiltered 0.25 (gradients would be at 0).
    np.testing.assert_allclose(
        merged["model.embed_tokens.weight"],
        slerp(0.25, a["model.embed_tokens.weight"], b["model.embed_tokens.weight"]),
        rtol=1e-5,
    )


def test_slices_take_layers_from_each_model_renumbered(tmp_path: Path) -> None:
    a, b = hf_model(tmp_path / "a", 1), hf_model(tmp_path / "b", 2)
    config = tmp_path / "franken.yml"
    config.write_text(
        "merge_method: passthrough\n"
        "slices:\n"
        "  - sources:\n      - model: a\n        layer_range: [0, 2]\n"
        "  - sources:\n      - model: b\n        layer_range: [1, 4]\n"
        "dtype: float32\n"
    )
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    merged = load_file(tmp_path / "out" / "model.safetensors")
    name = "model.layers.{}.mlp.up_proj.weight"
    sources = [(a, 0), (a, 1), (b, 1), (b, 2), (b, 3)]
    for out_layer, (model, in_layer) in enumerate(sources):
        np.testing.assert_array_equal(merged[name.format(out_layer)], model[name.format(in_layer)])
    assert name.format(5) not in merged
    np.testing.assert_array_equal(
        merged["model.embed_tokens.weight"], a["model.embed_tokens.weight"]
    )
    np.testing.assert_array_equal(merged["lm_head.weight"], b["lm_head.weight"])
    np.testing.assert_array_equal(merged["model.norm.weight"], b["model.norm.weight"])
    out_config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert out_config["num_hidden_layers"] == 5 and out_config["torch_dtype"] == "float32"


def test_mergekit_ties_with_per_model_density_and_lambda(tmp_path: Path) -> None:
    base, a = hf_model(tmp_path / "base", 0), hf_model(tmp_path / "a", 1)
    config = tmp_path / "ties.yml"
    config.write_text(
        "merge_method: ties\nbase_model: base\n"
        "models:\n  - model: a\n    parameters: {weight: 2.0, density: 1.0}\n"
        "parameters: {lambda: 0.5, int8_mask: true}\n"
    )
    assert run_merge(config, tmp_path / "out").exit_code == 0
    merged = load_file(tmp_path / "out" / "model.safetensors")
    name = "model.layers.2.mlp.up_proj.weight"
    # One model, density 1, normalized by its own weight: base + lambda * (a - base).
    expected = base[name] + 0.5 * (a[name] - base[name])
    np.testing.assert_allclose(merged[name], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "merge_method: linear\nmodels:\n  - model: a\n    parameters: {weight: 1}\n"
            "tokenizer_source: union\n",
            r"line 5 \(tokenizer_source\): suture cannot honour 'tokenizer_source'",
        ),
        ("merge_method: linear\nmodels:\n  - model: a\n", r"linear needs a weight for"),
        (
            "merge_method: slerp\nbase_model: a\nmodels:\n  - model: a\n  - model: b\n"
            "parameters:\n  t: x\n",
            r"line 7 \(parameters.t\): slerp parameter 't' must be a number; got 'x'",
        ),
        (
            "merge_method: ties\nbase_model: a\nmodels:\n  - model: b\n"
            "    parameters: {weight: .nan}\n",
            r"line 5 \(models\[0\].parameters.weight\): weight must be a finite number; got nan",
        ),
        (
            "merge_method: ties\nmodels:\n  - model: b\n    parameters: {weight: 1, t: 1}\n",
            r"'t' is not a per-model parameter of ties",
        ),
        (
            "merge_method: linear\nmodels:\n  - 5\n",
            r"line 3 \(models\[0\]\): must be a mapping with model:",
        ),
        (
            "merge_method: passthrough\nslices:\n  - sources:\n      - model: a\n"
            "        layer_range: [2, 9]\n",
            r"\(slices\[0\].sources\[0\].layer_range\): \[2, 9\] is past the 4 layers",
        ),
        (
            "merge_method: linear\nmodels:\n  - model: org/not-here\n",
            r"No such file or folder: 'org/not-here', and no Hugging Face model of that id in "
            r"the cache",
        ),
        ("merge_method: blend\nmodels: []\n", r"\(merge_method\): Unknown merge method 'blend'"),
    ],
)
def test_mergekit_config_errors_name_the_field_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    hf_model(tmp_path / "a", 1)
    hf_model(tmp_path / "b", 2)
    config = tmp_path / "bad.yml"
    config.write_text(text)
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    import re

    assert re.search(message, result.stderr), result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "method: linear\nmodels: [a, b]\nweights: [.nan, 1]\n",
            r"line 3 \(weights\[0\]\): the weight of model 0 must be a finite number; got nan",
        ),
        ("method: linear\nmodels: [5]\n", r"line 2 \(models\[0\]\): must be a checkpoint path"),
        (
            'method: linear\nmodels: [a, b]\nweights: "ab"\n',
            r"line 3 \(weights\): must be a list of numbers, one per model; got 'ab'",
        ),
        (
            "method: slerp\nmodels: [a, b]\nparams: {t: x}\n",
            r"line 3 \(params\): slerp parameter 't' must be a number; got 'x'",
        ),
        (
            "method: linear\nmodels: [a, b]\nper_leaf: [1]\n",
            r"line 3 \(per_leaf\): must be a mapping of \{regex: \{parameter: value\}\}; got \[1\]",
        ),
        (
            "method: linear\nmodels: [a, b]\nper_leaf:\n  '(': {take: 0}\n",
            r"line 4 \(per_leaf\['\('\]\): '\(' is not a valid regex",
        ),
        ("method: linear\nmodels: &m [a, b]\nbase: *m\n", r"YAML aliases \(\*name\) are not"),
    ],
)
def test_suture_config_errors_name_the_field_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 2, result.output
    import re

    assert re.search(message, result.stderr), result.stderr


def test_non_utf8_config_is_refused_and_linked_side_files_are_not_followed(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_bytes(b"method: linear\nmodels: [\xff]\n")
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 2
    assert "line 2: not UTF-8 text (byte 24); save it as UTF-8" in result.stderr
    hf_model(tmp_path / "a", 1)
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    (tmp_path / "a" / "tokenizer.json").unlink()
    (tmp_path / "a" / "tokenizer.json").symlink_to(secret)
    config = tmp_path / "m.yml"
    config.write_text("merge_method: passthrough\nmodels:\n  - model: a\n")
    from suture._hf import SideFileWarning

    with pytest.warns(SideFileWarning, match=r"tokenizer.json': it is a symbolic link"):
        result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    assert (tmp_path / "out" / "tokenizer_config.json").exists()
    (tmp_path / "a" / "config.json").rename(tmp_path / "real.json")
    (tmp_path / "a" / "config.json").symlink_to(tmp_path / "real.json")
    with pytest.warns(SideFileWarning, match=r"config.json': it is a symbolic link"):
        result = run_merge(config, tmp_path / "out2")
    assert result.exit_code == 2
    assert "config.json' is a link or not a regular file" in result.stderr
    assert not (tmp_path / "out2").exists()


def test_toml_config_errors_name_the_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('method = "linear"\nmodels = ["a", "b"]\nweights = [1, "x"]\n')
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 2
    assert "line 3 (weights[1]): the weight of model 1 must be a finite number; got 'x'" in (
        result.stderr
    )


def test_suture_config_with_hugging_face_inputs_and_safetensors_output(tmp_path: Path) -> None:
    a, b = hf_model(tmp_path / "a", 1), hf_model(tmp_path / "b", 2)
    config = tmp_path / "merge.yaml"
    config.write_text("method: linear\nmodels: [a, b]\nweights: [1, 3]\n")
    result = run_merge(config, tmp_path / "out", "--format", "safetensors")
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert {"config.json", "README.md", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    merged = load_file(out / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    np.testing.assert_allclose(merged[name], (a[name] + 3 * b[name]) / 4, rtol=1e-6)


@pytest.mark.parametrize(
    ("text", "said"),
    [("{not json", "is not valid JSON"), ("[1, 2]", "holds list, not a JSON object")],
)
def test_a_donor_config_that_is_not_a_json_object_is_refused(tmp_path: Path, text, said) -> None:
    """The donor's config.json is copied beside a merged Hugging Face folder: a broken one
    is a MergeError naming it (a raw JSON error once), and nothing is written."""
    hf_model(tmp_path / "a", 1)
    hf_model(tmp_path / "b", 2)
    (tmp_path / "a" / "config.json").write_text(text)
    config = tmp_path / "mergekit.yml"
    config.write_text(
        "merge_method: linear\nmodels:\n  - model: a\n    parameters: {weight: 0.5}\n"
        "  - model: b\n    parameters: {weight: 0.5}\ndtype: float32\n"
    )
    result = run_merge(config, tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert said in result.output and "config.json" in result.output
    assert not (tmp_path / "out").exists()
