"""Each of mergekit's methods against a reference written here from its paper's formula.

mergekit itself is not installed by the tests (it needs torch); `bench/merge.py` runs it side
by side on real models. The references below follow the papers and mergekit's documented
parameters, on small arrays, several of them checkable by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

import suture
from suture._merge.api import _seed

rng = np.random.default_rng(3)
BASE = rng.standard_normal((6, 5)).astype(np.float32)
MODELS = [BASE + rng.standard_normal((6, 5)).astype(np.float32) for _ in range(3)]


def run(models, method, base=None, **kwargs) -> np.ndarray:
    trees = [{"w": model} for model in models]
    tree = None if base is None else {"w": base}
    return suture.load(suture.merge(trees, method, base=tree, **kwargs))["w"]


def masks(params: dict, shape, probabilities) -> list[np.ndarray]:
    """The documented random masks: model i keeps element j where a uniform draw from
    ``default_rng([seed of the leaf, i])`` is below its keep probability."""
    seed = _seed("w", params)
    return [np.random.default_rng([seed, i]).random(shape) < p for i, p in enumerate(probabilities)]


def slerp_reference(t, a, b):
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    cosine = a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64)
    omega = np.arccos(cosine)
    return ((np.sin((1 - t) * omega) * a64 + np.sin(t * omega) * b64) / np.sin(omega)).reshape(
        a.shape
    )


def test_breadcrumbs_drops_the_largest_outliers_and_the_smallest_by_hand() -> None:
    base = np.zeros(10, np.float32)
    model = np.arange(1, 11, dtype=np.float32) * np.array([1, -1] * 5, np.float32)
    # density 0.5 keeps 5 of 10; gamma 0.1 drops the 1 largest (10); the 4 smallest go too.
    result = run([model], "breadcrumbs", base, params={"density": 0.5, "gamma": 0.1})
    expected = np.where((np.abs(model) >= 5) & (np.abs(model) <= 9), model, 0)
    np.testing.assert_array_equal(result, expected)


def test_breadcrumbs_ties_elects_signs_without_normalizing() -> None:
    base = np.zeros(4, np.float32)
    first = np.array([4.0, -3.0, 2.0, 1.0], np.float32)
    second = np.array([-1.0, 2.0, 3.0, 4.0], np.float32)
    params = {"density": 1.0, "gamma": 0.0}
    # Sums [3, -1, 5, 5] elect +, -, +, +: the disagreeing -1 and 2 are erased, then summed.
    result = run([first, second], "breadcrumbs_ties", base, params=params)
    np.testing.assert_array_equal(result, [4.0, -3.0, 5.0, 5.0])
    plain = run([first, second], "breadcrumbs", base, params=params)
    np.testing.assert_array_equal(plain, first + second)


def test_dare_linear_and_dare_ties_keep_with_probability_and_rescale_by_l1() -> None:
    params = {"density": 0.5, "seed": 4}
    kept = masks(params, BASE.shape, [0.5, 0.5])
    deltas = []
    for model, mask in zip(MODELS[:2], kept, strict=True):
        task = (model - BASE).astype(np.float64)
        masked = np.where(mask, task, 0)
        deltas.append(masked * np.abs(task).sum() / np.abs(masked).sum())  # mergekit's L1 ratio
    weights = [0.7, 0.3]
    linear = run(MODELS[:2], "dare_linear", BASE, weights=weights, params=params)
    expected = BASE + weights[0] * deltas[0] + weights[1] * deltas[1]
    np.testing.assert_allclose(linear, expected, rtol=1e-5, atol=1e-5)
    weighted = np.stack([w * d for w, d in zip(weights, deltas, strict=True)])
    elected = np.where(weighted.sum(0) >= 0, 1, -1)
    agree = (np.sign(weighted) == elected) & (weighted != 0)
    ties = run(MODELS[:2], "dare_ties", BASE, weights=weights, params=params)
    np.testing.assert_allclose(ties, BASE + (weighted * agree).sum(0), rtol=1e-5, atol=1e-5)
    inverse = run(MODELS[:1], "dare_linear", BASE, params={**params, "rescale": "inverse"})
    np.testing.assert_allclose(
        inverse, BASE + np.where(kept[0], (MODELS[0] - BASE) / 0.5, 0), rtol=1e-5, atol=1e-6
    )


def test_della_keeps_by_magnitude_rank_per_row() -> None:
    base = np.zeros((2, 5), np.float32)
    model = np.array([[5.0, -1.0, 3.0, -4.0, 2.0], [0.1, 0.2, -0.3, 0.4, 0.5]], np.float32)
    params = {"density": 0.5, "epsilon": 0.4, "seed": 2, "rescale": False}
    # Ranks by magnitude within each row map to keep probabilities 0.1, 0.3, 0.5, 0.7, 0.9.
    ranks = np.argsort(np.argsort(np.abs(model), axis=1), axis=1)
    probability = 0.1 + 0.2 * ranks
    (mask,) = masks(params, model.shape, [probability])
    result = run([model], "della_linear", base, params=params)
    np.testing.assert_array_equal(result, np.where(mask, model, 0))
    with pytest.raises(suture.MergeError, match=r"DELLA needs density - epsilon and density"):
        run([model], "della", base, params={"density": 0.5, "epsilon": 0.6})


def test_della_with_one_model_and_density_one_is_the_model() -> None:
    np.testing.assert_allclose(run(MODELS[:1], "della", BASE), MODELS[0], rtol=1e-6)


def test_model_stock_by_hand_and_against_the_formula() -> None:
    base = np.zeros(2, np.float32)
    orthogonal = run([np.array([1.0, 0.0]), np.array([0.0, 1.0])], "model_stock", base)
    np.testing.assert_allclose(orthogonal, [0.0, 0.0], atol=1e-7)  # cos 0: t = 0, the base
    same = run([np.array([1.0, 2.0]), np.array([1.0, 2.0])], "model_stock", base)
    np.testing.assert_allclose(same, [1.0, 2.0], rtol=1e-6)  # cos 1: t = 1, the average
    offsets = [(m - BASE).ravel().astype(np.float64) for m in MODELS]
    cosines = [
        offsets[i] @ offsets[j] / np.linalg.norm(offsets[i]) / np.linalg.norm(offsets[j])
        for i in range(3)
        for j in range(i + 1, 3)
    ]
    cosine = np.mean(cosines)
    t = 3 * cosine / (1 + 2 * cosine)
    expected = t * np.mean(MODELS, axis=0) + (1 - t) * BASE
    np.testing.assert_allclose(run(MODELS, "model_stock", BASE), expected, rtol=1e-5, atol=1e-6)


def test_sce_selects_by_variance_weights_by_energy_and_erases_signs() -> None:
    tasks = np.stack([m - BASE for m in MODELS]).astype(np.float64)
    variance = tasks.var(axis=0)
    keep = int(np.count_nonzero(variance) * 0.5)
    selected = variance >= np.sort(variance.ravel())[-keep]
    tasks = tasks * selected
    energy = (tasks**2).reshape(3, -1).mean(1)
    weights = (energy / energy.sum())[:, None, None]
    elected = np.where(tasks.sum(0) >= 0, 1, -1)
    agree = (np.sign(tasks) == elected) & (tasks != 0)
    expected = BASE + (tasks * weights * agree).sum(0) / np.maximum((weights * agree).sum(0), 1e-6)
    result = run(MODELS, "sce", BASE, params={"select_topk": 0.5})
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def test_nuslerp_is_slerp_at_the_weight_ratio_whole_or_row_by_row() -> None:
    a, b = MODELS[0], MODELS[1]
    whole = run([a, b], "nuslerp", weights=[1.0, 3.0])
    np.testing.assert_allclose(whole, slerp_reference(0.75, a, b), rtol=1e-5, atol=1e-6)
    rows = run([a, b], "nuslerp", weights=[2.0, 2.0], params={"flatten": False})
    expected = np.stack([slerp_reference(0.5, x, y) for x, y in zip(a, b, strict=True)])
    np.testing.assert_allclose(rows, expected, rtol=1e-5, atol=1e-6)
    columns = run([a, b], "nuslerp", params={"flatten": False, "row_wise": True})
    expected = np.stack([slerp_reference(0.5, x, y) for x, y in zip(a.T, b.T, strict=True)]).T
    np.testing.assert_allclose(columns, expected, rtol=1e-5, atol=1e-6)
    with_base = run([a, b], "nuslerp", BASE, weights=[1.0, 1.0])
    np.testing.assert_allclose(
        with_base, BASE + slerp_reference(0.5, a - BASE, b - BASE), rtol=1e-5, atol=1e-6
    )


def test_multislerp_of_two_orthogonal_vectors_is_their_bisector() -> None:
    result = run([np.array([2.0, 0.0]), np.array([0.0, 2.0])], "multislerp")
    np.testing.assert_allclose(result, [np.sqrt(2), np.sqrt(2)], rtol=1e-6)


def test_multislerp_against_the_tangent_space_formula() -> None:
    weights = np.array([0.5, 0.3, 0.2])
    flat = np.stack([m.ravel() for m in MODELS]).astype(np.float64)
    norms = np.linalg.norm(flat, axis=1)
    units = flat / norms[:, None]
    mean = (units * weights[:, None]).sum(0)
    mean /= np.linalg.norm(mean)
    tangent = ((units - (units @ mean)[:, None] * mean) * weights[:, None]).sum(0)
    length = np.linalg.norm(tangent)
    direction = mean * np.cos(length) + tangent * np.sin(length) / length
    expected = (direction * (norms * weights).sum()).reshape(BASE.shape)
    for scale in (1, 10):  # normalized weights: the scale does not matter
        result = run(MODELS, "multislerp", weights=list(weights * scale))
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_karcher_mean_of_directions_scaled_by_the_mean_norm() -> None:
    result = run([np.array([2.0, 0.0]), np.array([0.0, 4.0])], "karcher")
    np.testing.assert_allclose(result, 3 * np.array([1, 1]) / np.sqrt(2), rtol=1e-5)
    three = run(
        [np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0]), np.array([0.0, 0.0, 1.0])],
        "karcher",
    )
    np.testing.assert_allclose(three, np.ones(3) / np.sqrt(3), rtol=1e-5)


def test_nearswap_by_hand() -> None:
    base = np.zeros(3, np.float32)
    other = np.array([0.05, 1.0, -2.0], np.float32)
    # weight = clip(t / |base - other|, 0, 1) = [1, 0.1, 0.05]
    result = run([other], "nearswap", base, params={"t": 0.1})
    np.testing.assert_allclose(result, [0.05, 0.1, -0.1], rtol=1e-6)


def test_arcee_fusion_keeps_the_important_differences() -> None:
    base, other = BASE.astype(np.float64), MODELS[0].astype(np.float64)

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    p, q = softmax(other) + 1e-8, softmax(base) + 1e-8
    importance = np.abs(other - base) * (p * np.log(p / q)).sum(-1, keepdims=True)
    ordered = np.sort(importance.ravel())
    quantile = lambda f: ordered[int(f * (ordered.size - 1))]  # noqa: E731
    threshold = quantile(0.5) + 1.5 * (quantile(0.75) - quantile(0.25))
    expected = np.where(importance >= threshold, other, base)
    result = run([MODELS[0]], "arcee_fusion", BASE)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    assert 0 < (result != BASE).sum() < BASE.size


def test_passthrough_with_and_without_scale() -> None:
    np.testing.assert_array_equal(run(MODELS[:1], "passthrough"), MODELS[0])
    scaled = run(MODELS[:1], "passthrough", model_params=[{"scale": 0.5}])
    np.testing.assert_allclose(scaled, MODELS[0] * 0.5, rtol=1e-6)
    with pytest.raises(suture.MergeError, match=r"passthrough merges exactly 1 model\(s\)"):
        run(MODELS[:2], "passthrough")


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("linear", {}),
        ("ties", {"density": 0.5}),
        ("della", {"density": 0.5, "epsilon": 0.1}),
        ("breadcrumbs_ties", {"density": 0.6, "gamma": 0.1, "normalize": True}),
        ("nuslerp", {}),
        ("multislerp", {}),
    ],
)
def test_normalizing_methods_do_not_depend_on_the_weights_scale(method, params) -> None:
    models = MODELS[:2]
    uses_base = method not in ("linear", "nuslerp", "multislerp")
    base = BASE if uses_base else None
    small = run(models, method, base, weights=[0.6, 0.4], params=params)
    large = run(models, method, base, weights=[3.0, 2.0], params=params)
    np.testing.assert_allclose(small, large, rtol=1e-5, atol=1e-6)


def test_per_model_density() -> None:
    base = np.zeros(4, np.float32)
    first = np.array([4.0, 3.0, 2.0, 1.0], np.float32)
    second = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    result = run(
        [first, second],
        "ties",
        base,
        params={"normalize": False},
        model_params=[{"density": 0.25}, {"density": 0.5}],
    )
    np.testing.assert_array_equal(result, [4.0, 0.0, 3.0, 4.0])


def test_ties_keeps_at_least_one_element_of_a_small_leaf_as_mergekit() -> None:
    base = np.zeros(4, np.float32)
    model = np.array([1.0, -3.0, 2.0, 0.5], np.float32)
    # int(0.1 * 4) = 0, but a positive density keeps at least the largest magnitude.
    np.testing.assert_array_equal(
        run([model], "ties", base, params={"density": 0.1}), [0.0, -3.0, 0.0, 0.0]
    )
    np.testing.assert_array_equal(run([model], "ties", base, params={"density": 0.0}), base)


@pytest.mark.parametrize("method", ["ties", "dare_ties", "della", "breadcrumbs_ties", "sce"])
def test_zero_dimensional_leaves(method) -> None:
    base = {"s": np.float32(1.0)}
    models = [{"s": np.float32(3.0)}, {"s": np.float32(2.0)}]
    result = suture.load(suture.merge(models, method, base=base))["s"]
    assert result.shape == () and np.isfinite(result)
