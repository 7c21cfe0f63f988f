"""suture.merge against plain numpy references, on real Orbax and safetensors inputs."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.orbax_writers import save_standard

rng = np.random.default_rng(0)
A = {
    "attn": {"w": rng.standard_normal((8, 4)).astype(np.float32)},
    "mlp": {"w": rng.standard_normal(16).astype(np.float32)},
    "step": 3,
}
B = {
    "attn": {"w": rng.standard_normal((8, 4)).astype(np.float32)},
    "mlp": {"w": rng.standard_normal(16).astype(np.float32)},
    "step": 4,
}
C = {
    "attn": {"w": rng.standard_normal((8, 4)).astype(np.float32)},
    "mlp": {"w": rng.standard_normal(16).astype(np.float32)},
    "step": 5,
}
BASE = {
    "attn": {"w": np.zeros((8, 4), np.float32)},
    "mlp": {"w": np.full(16, 0.5, np.float32)},
    "step": 0,
}


def merged(*args, **kwargs) -> dict:
    return suture.load(suture.merge(*args, **kwargs))


def reference_slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    omega = np.arccos(
        np.clip(
            np.dot(a64.ravel(), b64.ravel()) / (np.linalg.norm(a64) * np.linalg.norm(b64)), -1, 1
        )
    )
    return (np.sin((1 - t) * omega) * a64 + np.sin(t * omega) * b64) / np.sin(omega)


def test_linear_weighted_average_normalized_or_not() -> None:
    result = merged([A, B, C], "linear", weights=[1, 2, 1])
    np.testing.assert_allclose(
        result["attn"]["w"], (A["attn"]["w"] + 2 * B["attn"]["w"] + C["attn"]["w"]) / 4, rtol=1e-6
    )
    assert result["step"] == 3  # non-array leaves come from the first model
    raw = merged([A, B], "linear", weights=[1, 1], params={"normalize": False})
    np.testing.assert_allclose(raw["mlp"]["w"], A["mlp"]["w"] + B["mlp"]["w"], rtol=1e-6)


def test_slerp_matches_the_formula_and_falls_back_to_linear() -> None:
    result = merged([A, B], "slerp", params={"t": 0.3})
    np.testing.assert_allclose(
        result["attn"]["w"],
        reference_slerp(A["attn"]["w"], B["attn"]["w"], 0.3),
        rtol=1e-5,
        atol=1e-6,
    )
    parallel = merged(
        [{"w": np.ones(4, np.float32)}, {"w": np.full(4, 3.0, np.float32)}],
        "slerp",
        params={"t": 0.25},
    )
    np.testing.assert_allclose(parallel["w"], np.full(4, 1.5))


def test_slerp_dot_threshold_is_mergekits_by_default_and_selectable() -> None:
    first = {"w": np.array([1.0, 0.0], np.float32)}
    angle = 0.02  # cos = 0.9998: above mergekit's 0.9995, so linear by default
    second = {"w": np.array([np.cos(angle), np.sin(angle)], np.float32) * 2}
    linear = (first["w"] + second["w"]) / 2
    np.testing.assert_allclose(merged([first, second], "slerp")["w"], linear, rtol=1e-6)
    spherical = merged([first, second], "slerp", params={"dot_threshold": 0.99999})["w"]
    np.testing.assert_allclose(spherical, reference_slerp(first["w"], second["w"], 0.5), rtol=1e-5)
    assert not np.allclose(spherical, linear, rtol=1e-7, atol=0)


def test_task_arithmetic() -> None:
    result = merged([A, B], "task_arithmetic", base=BASE, weights=[1.0, 0.5], params={"scale": 0.8})
    expected = BASE["mlp"]["w"] + 0.8 * (
        (A["mlp"]["w"] - BASE["mlp"]["w"]) + 0.5 * (B["mlp"]["w"] - BASE["mlp"]["w"])
    )
    np.testing.assert_allclose(result["mlp"]["w"], expected, rtol=1e-6)
    normalized = merged(
        [A, B], "task_arithmetic", base=BASE, weights=[2.0, 1.0], params={"normalize": True}
    )
    expected = (
        BASE["mlp"]["w"]
        + (2 * (A["mlp"]["w"] - BASE["mlp"]["w"]) + (B["mlp"]["w"] - BASE["mlp"]["w"])) / 3
    )
    np.testing.assert_allclose(normalized["mlp"]["w"], expected, rtol=1e-6)


def test_ties_on_a_hand_checked_example() -> None:
    base = {"w": np.array([1.0, 1.0, 1.0, 1.0], np.float32)}
    first = {"w": base["w"] + np.array([1.0, -2.0, 3.0, 0.1], np.float32)}
    second = {"w": base["w"] + np.array([2.0, 1.5, -1.0, 0.2], np.float32)}
    # Trim to 50% (2 of 4): [0, -2, 3, 0] and [2, 1.5, 0, 0]. Weighted by 3 and 1:
    # [0, -6, 9, 0] and [2, 1.5, 0, 0]; sums [2, -4.5, 9, 0] elect +, -, +, + (0 elects +).
    # Agreeing: element 0 only the second (weight 1): 2 / 1; element 1 only the first: -6 / 3;
    # element 2 the first: 9 / 3; element 3 nobody: 0.
    result = merged([first, second], "ties", base=base, weights=[3, 1], params={"density": 0.5})
    np.testing.assert_allclose(result["w"], base["w"] + np.array([2.0, -2.0, 3.0, 0.0]), rtol=1e-6)
    unnormalized = merged(
        [first, second],
        "ties",
        base=base,
        weights=[3, 1],
        params={"density": 0.5, "normalize": False, "scale": 0.5},
    )
    np.testing.assert_allclose(
        unnormalized["w"], base["w"] + 0.5 * np.array([2.0, -6.0, 9.0, 0.0]), rtol=1e-6
    )


def test_ties_sign_ties_elect_plus_or_drop() -> None:
    base = {"w": np.zeros(2, np.float32)}
    up, down = {"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([-1.0, 1.0], np.float32)}
    # Element 0 sums to 0: mergekit elects +, so the +1 is kept; "drop" keeps the base.
    plus = merged([up, down], "ties", base=base, params={"density": 1.0})
    np.testing.assert_allclose(plus["w"], [1.0, 1.5])
    drop = merged([up, down], "ties", base=base, params={"density": 1.0, "sign_tie": "drop"})
    np.testing.assert_allclose(drop["w"], [0.0, 1.5])


def ties_reference(models, base, weights, density):
    """TIES as the paper and mergekit (normalize=True): trim, elect, disjoint weighted mean."""
    deltas = []
    for model, weight in zip(models, weights, strict=True):
        task = (model - base).astype(np.float64)
        keep = int(density * task.size)
        threshold = np.sort(np.abs(task).ravel())[-keep]
        deltas.append(weight * np.where(np.abs(task) >= threshold, task, 0))
    deltas = np.stack(deltas)
    elected = np.where(deltas.sum(0) >= 0, 1, -1)
    agree = (np.sign(deltas) == elected) & (deltas != 0)
    divisor = (np.array(weights)[:, None, None] * agree).sum(0)
    return base + (deltas * agree).sum(0) / np.where(divisor == 0, 1, divisor)


def test_ties_against_the_formula_and_independent_of_weight_scale() -> None:
    models = [A["attn"]["w"], B["attn"]["w"], C["attn"]["w"]]
    for weights in ([0.6, 0.3, 0.1], [6.0, 3.0, 1.0]):
        result = merged([A, B, C], "ties", base=BASE, weights=weights, params={"density": 0.3})
        expected = ties_reference(models, BASE["attn"]["w"], weights, 0.3)
        np.testing.assert_allclose(result["attn"]["w"], expected, rtol=1e-5, atol=1e-6)


def test_ties_of_a_model_with_itself_returns_the_model() -> None:
    for density in (1.0, 0.5):
        result = merged([A, A], "ties", base=BASE, weights=[0.5, 0.5], params={"density": density})
        trimmed = merged([A], "ties", base=BASE, weights=[1.0], params={"density": density})
        np.testing.assert_allclose(result["attn"]["w"], trimmed["attn"]["w"], rtol=1e-6)
    full = merged([A, A], "ties", base=BASE, weights=[0.5, 0.5], params={"density": 1.0})
    np.testing.assert_allclose(full["attn"]["w"], A["attn"]["w"], rtol=1e-6, atol=1e-7)


def test_dare_is_seeded_deterministic_and_rescales() -> None:
    params = {"drop": 0.5, "seed": 7}
    first = merged([A, B], "dare", base=BASE, params=params)
    again = merged([A, B], "dare", base=BASE, params=params)
    other = merged([A, B], "dare", base=BASE, params={"drop": 0.5, "seed": 8})
    np.testing.assert_array_equal(first["attn"]["w"], again["attn"]["w"])
    assert not np.array_equal(first["attn"]["w"], other["attn"]["w"])
    single = merged([A], "dare", base=BASE, params={"drop": 0.5, "seed": 1})["mlp"]["w"]
    task = A["mlp"]["w"] - BASE["mlp"]["w"]
    delta = single - BASE["mlp"]["w"]
    kept = ~np.isclose(delta, 0)
    np.testing.assert_allclose(
        delta[kept], 2 * task[kept], rtol=1e-5
    )  # kept elements rescaled by 1/(1-p), the paper's default for "dare"
    assert 0 < kept.sum() < kept.size
    l1 = merged([A], "dare", base=BASE, params={"drop": 0.5, "seed": 1, "rescale": "l1"})
    l1_delta = l1["mlp"]["w"] - BASE["mlp"]["w"]
    np.testing.assert_array_equal(~np.isclose(l1_delta, 0), kept)  # the same elements kept
    factor = np.abs(task).sum() / np.abs(task[kept]).sum()  # mergekit's L1 ratio
    np.testing.assert_allclose(l1_delta[kept], factor * task[kept], rtol=1e-5)
    no_drop = merged([A, B], "dare", base=BASE, params={"drop": 0.0})
    np.testing.assert_allclose(
        no_drop["attn"]["w"], merged([A, B], "task_arithmetic", base=BASE)["attn"]["w"], rtol=1e-6
    )


def test_per_leaf_parameters_and_take() -> None:
    result = merged(
        [A, B], "slerp", params={"t": 0.5}, per_leaf={r"attn": {"t": 0.1}, r"mlp/w": {"take": 1}}
    )
    np.testing.assert_allclose(
        result["attn"]["w"],
        reference_slerp(A["attn"]["w"], B["attn"]["w"], 0.1),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_array_equal(result["mlp"]["w"], B["mlp"]["w"])


def test_missing_leaves_error_or_available() -> None:
    partial = {"attn": {"w": A["attn"]["w"]}, "step": 1}
    with pytest.raises(
        suture.MergeError,
        match=r"Leaf 'mlp/w' is missing from model\(s\) \[1\]. Pass missing='available'",
    ):
        suture.merge([A, partial], "linear")
    result = merged([A, partial, C], "linear", missing="available")
    np.testing.assert_allclose(result["mlp"]["w"], (A["mlp"]["w"] + C["mlp"]["w"]) / 2, rtol=1e-6)


def test_compute_and_output_dtypes() -> None:
    low = {"w": np.array([1.0, 2.0], ml_dtypes.bfloat16)}
    high = {"w": np.array([3.0, 4.0], ml_dtypes.bfloat16)}
    lazy = suture.merge([low, high], "linear", dtype="float16")
    assert lazy["w"].dtype == np.float16
    np.testing.assert_array_equal(suture.load(lazy)["w"], np.array([2.0, 3.0], np.float16))
    assert suture.merge([low, high], "linear")["w"].dtype == ml_dtypes.bfloat16


def test_merge_errors_are_clear() -> None:
    with pytest.raises(suture.MergeError, match=r"Unknown merge method 'average'"):
        suture.merge([A, B], "average")
    with pytest.raises(suture.MergeError, match=r"ties needs base="):
        suture.merge([A, B], "ties")
    with pytest.raises(suture.MergeError, match=r"slerp merges exactly 2 model\(s\); 3 were given"):
        suture.merge([A, B, C], "slerp")
    with pytest.raises(
        suture.MergeError, match=r"linear has no parameter 't'; its parameters are normalize"
    ):
        suture.merge([A, B], "linear", params={"t": 0.5})
    with pytest.raises(suture.MergeError, match=r"2 models but 3 weights"):
        suture.merge([A, B], "linear", weights=[1, 2, 3])
    with pytest.raises(
        suture.ShapeMismatchError,
        match=r"Leaf 'w' has different shapes in the models: \[\(2,\), \(3,\)\]",
    ):
        suture.merge([{"w": np.ones(2)}, {"w": np.ones(3)}], "linear")
    with pytest.raises(suture.MergeError, match=r"per_leaf: '\(' is not a valid regex"):
        suture.merge([A, B], "linear", per_leaf={"(": {"t": 1}})
    with pytest.raises(
        suture.MergeError, match=r"the weight of model 0 must be a finite number; got nan"
    ):
        suture.merge([A, B], "linear", weights=[float("nan"), 1])
    with pytest.raises(
        suture.MergeError, match=r"ties parameter 'density' must be a number; got 'x'"
    ):
        suture.merge([A, B], "ties", base=BASE, params={"density": "x"})
    with pytest.raises(
        suture.MergeError, match=r"slerp parameter 't' must be a finite number; got inf"
    ):
        suture.merge([A, B], "slerp", params={"t": float("inf")})
    with pytest.raises(
        suture.MergeError,
        match=r"ties parameter 'sign_tie' must be one of 'positive', 'drop'; got 'up'",
    ):
        suture.merge([A, B], "ties", base=BASE, params={"sign_tie": "up"})
    with pytest.raises(suture.MergeError, match=r"nearswap needs the parameter 't'"):
        suture.merge([A], "nearswap", base=BASE)
    with pytest.raises(
        suture.MergeError, match=r"linear takes no base model; list it among the models"
    ):
        suture.merge([A, B], "linear", base=BASE)
    with pytest.raises(
        suture.MergeError, match=r"model 1: ties has no per-model parameter 't'; those are density"
    ):
        suture.merge([A, B], "ties", base=BASE, model_params=[{}, {"t": 1}])
    with pytest.raises(suture.MergeError, match=r"take=5 is not a model index"):
        suture.merge([A, B], "linear", per_leaf={"attn": {"take": 5}})


def test_real_orbax_and_safetensors_inputs_stream_to_disk(tmp_path: Path) -> None:
    arrays = lambda m: {"attn": m["attn"], "mlp": m["mlp"]}  # noqa: E731
    save_standard(tmp_path / "a", arrays(A))
    save_file({"attn.w": B["attn"]["w"], "mlp.w": B["mlp"]["w"]}, tmp_path / "b.safetensors")
    save_standard(tmp_path / "base", arrays(BASE))
    result = suture.merge(
        [tmp_path / "a", tmp_path / "b.safetensors"], "task_arithmetic", base=tmp_path / "base"
    )
    suture.save(result, tmp_path / "merged", progress=False)
    expected = A["attn"]["w"] + B["attn"]["w"] - BASE["attn"]["w"]
    np.testing.assert_allclose(
        suture.open(tmp_path / "merged")["attn/w"].read(), expected, rtol=1e-6
    )
    plan = suture.plan(None, result)
    assert {output.path for output in plan.outputs} == {"attn/w", "mlp/w"}


def test_merge_command_with_a_yaml_config(tmp_path: Path) -> None:
    save_standard(tmp_path / "a", {"w": np.zeros(4, np.float32)})
    save_standard(tmp_path / "b", {"w": np.ones(4, np.float32)})
    config = tmp_path / "merge.yaml"
    config.write_text("method: linear\nmodels: [a, b]\nweights: [1, 3]\ndtype: bfloat16\n")
    runner = CliRunner()
    result = runner.invoke(
        app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    merged_leaf = suture.open(tmp_path / "out")["w"]
    assert merged_leaf.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(
        merged_leaf.read().astype(np.float32), np.full(4, 0.75, np.float32)
    )
    config.write_text("method: linear\nmodel: [a]\n")
    bad = runner.invoke(app, ["merge", str(config), "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown key 'model'" in bad.stderr
