"""Hostile family configs: every generated config.json ends in a SurgeryError or a correct plan,
within the deadline, in both directions and both layouts.

Two generators. One mutates the config.json of a real tiny model (Llama 3.1, and Gemma 2 with
its paired layer groups) field by field: counts of 0, -1, 10**9, 2**63 and 10**30, NaN and
Infinity, 2.5 and 2.0, text, lists, mappings, true/false, null, removed fields. The other
writes config files that are not JSON objects or barely are: random bytes, valid text with a
slice overwritten, deep nesting, thousands of digits. Each config is read as a file
(`read_config`), then planned with the recipe (`to_maxtext`, or `to_hf` on the model's own
MaxText conversion) and every planned tensor read. A plan that succeeds must come from a
config naming the model's 2 layers. `make test` runs a few cases; `make fuzz` runs
``SUTURE_FUZZ_EXAMPLES`` (1,000) per generator and, with ``SUTURE_FUZZ_REPORT`` set, writes
the counts of outcomes to that file.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import suture
from suture import families
from suture._lazy.array import LazyArray
from suture._paths import flatten
from suture.families._convert import convert_with_recipe, read_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

EXAMPLES = int(os.environ.get("SUTURE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=5000,
    suppress_health_check=list(HealthCheck),
    derandomize=EXAMPLES <= 100,
)
OUTCOMES: dict[str, Counter] = {}
SMALL = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)
MODELS = {
    "llama3.1": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)),
    "gemma2": lambda: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**SMALL, head_dim=16, query_pre_attn_scalar=16)
    ),
}
CASES = [
    (family, layout, reverse)
    for family in MODELS
    for layout in ("maxtext", "maxtext-unscanned")
    for reverse in (False, True)
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, object]:
    """Each family's tiny model in HF layout and converted to both MaxText layouts, opened
    once (lazily: every read goes to the files); ``"configs"``: a folder for config files."""
    root = tmp_path_factory.mktemp("fuzz-families")
    opened: dict[str, object] = {"configs": root}
    for family, make in MODELS.items():
        torch.manual_seed(0)
        make().save_pretrained(root / family)
        opened[family] = suture.open(root / family, separator=".").tree
        opened[f"{family} config"] = (root / family / "config.json").read_bytes()
        for layout in ("maxtext", "maxtext-unscanned"):
            convert_with_recipe(
                root / family, root / f"{family}-{layout}", f"{family}:{layout}", progress=False
            )
            opened[f"{family}-{layout}"] = suture.open(root / f"{family}-{layout}").tree
    return opened


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    target = os.environ.get("SUTURE_FUZZ_REPORT")
    if target:
        Path(target).write_text(
            json.dumps({kind: dict(counts) for kind, counts in OUTCOMES.items()}, indent=1)
        )


def plan(models: dict[str, object], config_file: Path, case: tuple, generator: str) -> str:
    """Reads the config file, plans the conversion and reads every planned tensor.

    Returns the outcome ("planned" or the error's kind); fails on anything but a
    SurgeryError, on a plan from a config that does not name the model's 2 layers, and on
    a case slower than the deadline.
    """
    family, layout, reverse = case
    started = time.perf_counter()
    try:
        config = read_config(config_file)
        recipe = families.get_recipe(f"{family}:{layout}")
        if reverse:
            tree = recipe.to_hf(models[f"{family}-{layout}"], config)
        else:
            tree = recipe.to_maxtext(models[family], config)
        for leaf in flatten(tree).values():
            if isinstance(leaf, LazyArray):
                leaf.read()
        outcome = "planned"
        layers = config["num_hidden_layers"]
        assert type(layers) is int and layers == 2, config
    except suture.SurgeryError as error:
        outcome = type(error).__name__
    assert time.perf_counter() - started < 5, config_file.read_bytes()[:200]
    OUTCOMES.setdefault(generator, Counter())[outcome] += 1
    return outcome


DROP = object()  # a mutation that removes the field
FIELDS = [
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "query_pre_attn_scalar",
    "model_type",
    "rms_norm_eps",
    "i",  # the layer variable of the recipes' index expressions
    "sqrt",  # the one function recipe expressions may call
]
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [0, -1, 1, 2, 3, 4, 16, 64, 128, 10**9, 2**62, 2**63, 10**30, -(10**400), 10**400]
        + [True, False, None, DROP]
    ),
    st.sampled_from([2.5, 2.0, -0.0, 1e308, float("nan"), float("inf"), float("-inf")]),
    st.integers(),
    st.floats(),
    st.sampled_from(["llama", "gemma2", "qwen3", "2", "two", ""]),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@FUZZ
@given(
    case=st.sampled_from(CASES),
    mutation=st.dictionaries(st.sampled_from(FIELDS), HOSTILE_VALUES, min_size=1, max_size=4),
)
def test_fuzz_family_config_values(models, case, mutation) -> None:
    config = json.loads(models[f"{case[0]} config"])
    for field, value in mutation.items():
        if value is DROP:
            config.pop(field, None)
        else:
            config[field] = value
    path = models["configs"] / "mutated-config.json"
    path.write_text(json.dumps(config))  # NaN and Infinity as JSON literals, as json writes them
    plan(models, path, case, "config values")


def _spliced(original: bytes) -> st.SearchStrategy[bytes]:
    """`original` with a slice overwritten, cut short or grown."""
    return st.tuples(st.integers(0, len(original)), st.integers(0, 16), st.binary(max_size=16)).map(
        lambda cut: original[: cut[0]] + cut[2] + original[cut[0] + cut[1] :]
    )


def _files(original: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _spliced(original),
        st.binary(max_size=256),
        st.integers(1, 200_000).map(lambda depth: b"[" * depth + b"]" * depth),
        st.integers(1, 200_000).map(lambda depth: b'{"a":' * depth + b"1" + b"}" * depth),
        st.integers(1, 10_000).map(
            lambda digits: original.replace(
                b'"num_hidden_layers": 2', b'"num_hidden_layers": ' + b"9" * digits
            )
        ),
        st.sampled_from([b"", b"null", b"[]", b'"config"', b"1e999", b"NaN", b"\xef\xbb\xbf{}"]),
    )


@FUZZ
@given(case=st.sampled_from(CASES), data=st.data())
def test_fuzz_family_config_files(models, case, data) -> None:
    path = models["configs"] / "config-file.json"
    path.write_bytes(data.draw(_files(models[f"{case[0]} config"])))
    plan(models, path, case, "config files")
