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

import copy
import json
import os
import time
import warnings
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
TABLE_FUZZ = settings(FUZZ, deadline=None)  # plan_table times each case itself
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
    # experts, stacked and in transformers' fused layout: for the table fuzzer
    "qwen3-moe": lambda: transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(
            **SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
        )
    ),
}
CASES = [
    (family, layout, reverse)
    for family in ("llama3.1", "gemma2")
    for layout in ("maxtext", "maxtext-unscanned")
    for reverse in (False, True)
]
TABLE_CASES = CASES + [
    ("qwen3-moe", layout, reverse)
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


# Family tables of a user's own: mutated built-in tables against the tiny models --------------

TABLE_VALUES = st.one_of(
    st.sampled_from(
        [0, -1, 1, 2, 3, 5, 64, 2**63, 10**30, 0.5, 1e308, float("nan"), float("inf"), -0.0]
        + [True, False, None, "", "x", "transpose", "interleave_rope", "hf_index", "halves"]
        + ["9**9**9 > 0", "hidden_size**hidden_size**hidden_size", "model_type * 10**9"]
        + ["hidden_size // 0", "1/0", "sqrt(-1)", "head_dim * 2", "i", "num_hidden_layers"]
        + ["hidden_size.real", "__import__('os')", "'text'", "[1, 2]", "not", "1e999"]
        + [r"(.|[a-z]|\w)+\d\d", "(a+)+$", "model\\.(", "[", "{layer}", "{expert}", "{nope}"]
        + ["model.layers.{layer}.x", "decoder/layers/x", "float64", "int8", "bfloat16"]
        + [[], [0], [1, 0], [0, 2, 1], ["a", "b"], {}, {"a": 1}]
    ),
    st.sampled_from(
        [
            {"split_axis": {"axis": 5, "sizes": [2, 2]}},
            {"split_axis": {"axis": 0, "sizes": ["num_attention_heads", "head_dim"]}},
            {"split_axis": {"axis": 1}},
            {"scale": {"multiply": "1/sqrt(head_dim)"}},
            {"scale": {"divide": 0}},
            {"add": 1.0},
            {"pad_rows": {"to": "vocab_size + 3", "back_to": "vocab_size"}},
            {"fit_rows": {"to": "vocab_size - 3", "back_to": "vocab_size"}},
            {"fit_rows": {"to": 10**30, "back_to": "vocab_size"}},
            {"permute": [1, 0]},
            {"permute": [0, 2, 1]},
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
)
TABLE_KEYS = [
    *("names", "config", "ignore", "leaves", "layer_groups", "experts", "layer_period"),
    *("layer_patterns", "layer_sets", "language_model", "require", "defaults", "checks"),
    *("field", "test", "message", "maxtext", "tunix", "hf", "ops", "when", "fused", "axes"),
    *("split", "axis", "mode", "part", "parts", "count", "hf_index", "unscanned", "typo"),
]


_KIN = {
    int: st.integers(-2, 6) | st.sampled_from([64, 2**40, 10**30]),
    float: st.sampled_from([0.0, -1.0, 0.5, 1e-30, 1e30]),
    str: st.sampled_from(
        ["hidden_size", "head_dim", "num_attention_heads * 2", "vocab_size + 1", "i + 1"]
        + ["num_hidden_layers // 2", "2 * i + 1", "i", "0", "num_key_value_heads", "1/head_dim"]
        + ["model.layers.{layer}.mlp.gate_proj.weight", "decoder/layers/mlp/wo/kernel"]
    ),
    list: st.lists(st.integers(-1, 3), max_size=4) | st.lists(st.sampled_from(["a", "i"])),
}


def _places(node, at=()) -> list[tuple]:
    """The path of every value below `node` (keys of mappings, indices of lists)."""
    found = [at]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _places(value, (*at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _places(value, (*at, index))
    return found


def _mutated(data, draw) -> object:
    """`data` (a table) after one to three random edits: a value replaced, removed or added."""
    for _ in range(draw(st.integers(1, 3))):
        place = draw(st.sampled_from(_places(data)))
        action = draw(st.sampled_from(["set", "remove", "add"]))
        if not place:
            if action == "set":
                data = copy.deepcopy(draw(TABLE_VALUES))
            continue
        parent = data
        for part in place[:-1]:
            parent = parent[part]
        last = place[-1]
        if action == "set":
            kin = _KIN.get(type(parent[last]))  # often a value of the same kind: past the schema
            use_kin = kin is not None and draw(st.booleans())
            parent[last] = copy.deepcopy(draw(kin if use_kin else TABLE_VALUES))
        elif action == "remove":
            del parent[last]
        elif isinstance(parent[last], dict):
            parent[last][draw(st.sampled_from(TABLE_KEYS))] = copy.deepcopy(draw(TABLE_VALUES))
        elif isinstance(parent[last], list):
            value = copy.deepcopy(draw(TABLE_VALUES))  # the strategies' own stay as they are
            parent[last].insert(draw(st.integers(0, len(parent[last]))), value)
    return data


TABLES = {"llama3.1": "llama3.1.yaml", "gemma2": "gemma2.yaml", "qwen3-moe": "qwen3-moe.yaml"}


def plan_table(models: dict[str, object], table: Path, case: tuple, generator: str) -> str:
    """Loads the table file, plans the conversion with it and reads every planned tensor;
    the outcome is "planned" or the error's kind, within the deadline, or the test fails
    (numpy's warnings included: they are errors in the test suite)."""
    from suture.families._file import family_recipe

    family, layout, reverse = case
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", families.LeftOutWarning)  # rows cut, as MaxText's
            recipe = family_recipe(f"{table}:{layout}")
            config = json.loads(models[f"{family} config"])
            if reverse:
                tree = recipe.to_hf(models[f"{family}-{layout}"], config)
            else:
                tree = recipe.to_maxtext(models[family], config)
            for leaf in flatten(tree).values():
                if isinstance(leaf, LazyArray):
                    leaf.read()
        outcome = "planned"
    except suture.SurgeryError as error:
        outcome = type(error).__name__
    # a pattern is stopped after 2 s a match: a few names each just under it are the worst
    assert time.perf_counter() - started < 10, table.read_text()[:400]
    OUTCOMES.setdefault(generator, Counter())[outcome] += 1
    return outcome


@TABLE_FUZZ
@given(case=st.sampled_from(TABLE_CASES), data=st.data())
def test_fuzz_family_tables(models, case, data) -> None:
    """Random edits of a built-in table (keys, values and their types) are a SurgeryError or
    a plan whose every tensor reads, within the deadline."""
    from importlib.resources import files

    import yaml

    table = yaml.safe_load(files("suture.families").joinpath(TABLES[case[0]]).read_text())
    mutated = _mutated(table, data.draw)
    path = models["configs"] / "table.yaml"
    path.write_text(yaml.safe_dump(mutated, sort_keys=False))
    plan_table(models, path, case, "family tables")


@TABLE_FUZZ
@given(case=st.sampled_from(TABLE_CASES), data=st.data())
def test_fuzz_family_table_files(models, case, data) -> None:
    """A built-in table's text with a slice overwritten, cut or grown: any YAML, or none."""
    from importlib.resources import files

    original = files("suture.families").joinpath(TABLES[case[0]]).read_bytes()
    path = models["configs"] / "table-file.yaml"
    path.write_bytes(data.draw(_spliced(original)))
    plan_table(models, path, case, "family table files")
