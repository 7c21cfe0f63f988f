"""Hostile and malformed family tables of a user's own: each a clear error, within seconds.

Issue 37, items 7, 8, 9 and 13. An expression that would compute 9**9**9, a YAML alias bomb,
an ``ignore:`` pattern that backtracks, and a table whose keys have the wrong shape are each
one `RecipeError` naming the table, the entry and the rule, through the Python API, `suture
convert --recipe my.yaml` and `suture recipes my.yaml --config config.json`, leaving nothing
behind. Real tiny models (transformers' ``save_pretrained``); the CLI through typer's runner,
or a subprocess with a timeout where a regression would hang.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import suture
from suture.cli import app
from suture.families._convert import convert_with_recipe
from suture.families._file import family_recipe, is_family_recipe, table_file
from suture.families._tables import _families

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
FAST = 5.0  # seconds: every refusal here comes before any tensor is read
BASE = files("suture.families").joinpath("llama3.1.yaml").read_text()
BILLION_LAUGHS = "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A tiny Llama (2 layers) in HF layout, and its scanned MaxText conversion."""
    root = tmp_path_factory.mktemp("tables")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(root / "hf")
    # converted with the user's table that the tests edit ("mine": llama3.1's, renamed), so
    # that a reverse with an edited copy reaches the table's own error: another recipe than
    # the recorded one is refused first
    (root / "tables").mkdir()
    mine = _table(root / "tables")
    convert_with_recipe(root / "hf", root / "maxtext", str(mine), progress=False)
    return root


def _table(folder: Path, change=None, text: str | None = None, name: str = "mine.yaml") -> Path:
    """The built-in llama3.1 table as a user's file, with `change(data)` applied (or `text`)."""
    if text is None:
        data = yaml.safe_load(BASE)
        data["names"] = ["mine"]
        if change is not None:
            change(data)
        text = yaml.safe_dump(data, sort_keys=False)
    path = folder / name
    path.write_text(text)
    return path


def _leaf(data: dict, hf: str) -> dict:
    return next(leaf for leaf in data["leaves"] if leaf["hf"] == hf)


def _digest(folder: Path) -> str:
    hashed = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            hashed.update(path.name.encode() + path.read_bytes())
    return hashed.hexdigest()


def _refused_everywhere(
    models: Path,
    tmp_path: Path,
    table: Path,
    *phrases: str,
    runs: str = "api convert reverse recipes",
) -> None:
    """The table is refused by each of `runs` (the Python API, `suture convert` both ways,
    `suture recipes --config`), with `phrases` in the message, quickly, leaving nothing behind."""
    before = _digest(models / "hf")
    started = time.perf_counter()
    if "api" in runs:
        with pytest.raises(suture.SurgeryError) as raised:
            suture.convert(models / "hf", tmp_path / "api", recipe=str(table), progress=False)
        for phrase in phrases:
            assert phrase in str(raised.value), str(raised.value)
    commands = {
        "convert": ["convert", str(models / "hf"), str(tmp_path / "cli"), "--no-progress"],
        "reverse": ["convert", str(models / "maxtext"), str(tmp_path / "back"), "--reverse"],
        "recipes": ["recipes", str(table), "--config", str(models / "hf" / "config.json")],
    }
    for run in runs.split():
        if run == "api":
            continue
        arguments = commands[run] + ([] if run == "recipes" else ["--recipe", str(table)])
        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 2, result.output
        assert result.output.startswith("Error:") and "Traceback" not in result.output
        flat = " ".join(result.output.split())
        for phrase in phrases:
            assert " ".join(phrase.split()) in flat, result.output
    assert time.perf_counter() - started < 4 * FAST
    assert sorted(p.name for p in tmp_path.iterdir()) == [table.name]  # no output, lock or temp
    assert _digest(models / "hf") == before


def _cli_within(seconds: float, *arguments: str) -> subprocess.CompletedProcess:
    """`suture ARGUMENTS` in a process of its own, which a hang would keep past `seconds`."""
    return subprocess.run(
        [sys.executable, "-m", "suture", *arguments],
        capture_output=True,
        text=True,
        timeout=seconds,
    )


# Item 7: expressions that would compute without end ------------------------------------------


def _power_in_when(data: dict) -> None:
    _leaf(data, "model.norm.weight")["when"] = "9**9**9 > 0"


def _power_in_size(data: dict) -> None:
    ops = _leaf(data, "model.layers.{layer}.self_attn.k_proj.weight")["ops"]
    ops[1]["split_axis"]["sizes"][0] = "hidden_size**hidden_size**hidden_size"


def _text_repeated(data: dict) -> None:
    data["config"]["defaults"]["repeated"] = "model_type * 10**9"
    _leaf(data, "model.norm.weight")["when"] = "repeated"


@pytest.mark.parametrize(
    ("change", "phrases"),
    [
        (
            _power_in_when,
            ["leaf 1 ('decoder/decoder_norm/scale').when: '9**9**9 > 0'", "past 2**256"],
        ),
        (
            _power_in_size,
            [
                "leaf 4 ('decoder/layers/self_attention/key/kernel'), ops[1] split_axis.sizes[0]",
                "'hidden_size**hidden_size**hidden_size' computes a whole number past 2**256",
            ],
        ),
        (
            _text_repeated,
            ["config.defaults.repeated: 'model_type * 10**9' does arithmetic on 'llama' (str)"],
        ),
    ],
)
def test_an_expression_that_would_not_end_is_refused_naming_table_and_entry(
    models, tmp_path, change, phrases
):
    table = _table(tmp_path, change)
    result = _cli_within(60, "recipes", str(table), "--config", str(models / "hf" / "config.json"))
    assert result.returncode == 2 and phrases[-1] in " ".join(result.stderr.split()), result
    # back to HF a split merges its axes without computing its sizes: no reverse for that one
    runs = "api convert recipes" + ("" if change is _power_in_size else " reverse")
    _refused_everywhere(
        models, tmp_path, table, f"Family table {str(table)!r}", *phrases, runs=runs
    )


def test_bounded_expressions_still_compute(models, tmp_path):
    """The valid neighbour: powers and products of sizes within bounds convert as before."""

    def change(data: dict) -> None:
        _leaf(data, "model.norm.weight")["when"] = "2**64 > hidden_size**4 and -(2**255) < 0"

    table = _table(tmp_path, change)
    suture.convert(models / "hf", tmp_path / "out", recipe=str(table), progress=False)
    builtin = suture.load(models / "maxtext")
    mine = suture.load(tmp_path / "out")
    assert suture.flatten(mine).keys() == suture.flatten(builtin).keys()


# Item 8: YAML that expands without end -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        (
            BILLION_LAUGHS + BASE.replace("names: [llama3.1]", "names: *i"),
            "expands to over 100,000",
        ),
        (BASE + "extra: &x [1, *x]\n", "an alias refers to the value that contains it"),
        (BASE + "layer_period: 1" + ":1" * 20_000 + "\n", "an integer of 40,001 characters"),
        (BASE + "extra: " + "[" * 5000 + "]" * 5000 + "\n", "nests too deeply"),
    ],
)
def test_a_yaml_bomb_as_a_table_is_refused_quickly(models, tmp_path, text, phrase):
    table = _table(tmp_path, text=text)
    started = time.perf_counter()
    assert table_file(str(table)) is None and not is_family_recipe(str(table))  # the look
    assert time.perf_counter() - started < FAST
    result = _cli_within(60, "recipes", str(table), "--config", str(models / "hf" / "config.json"))
    assert result.returncode == 2 and phrase in result.stderr, result
    with pytest.raises(suture.RecipeError, match=phrase):
        family_recipe(str(table))
    # convert takes a YAML file that is no table as a rule recipe: refused by the same bounds
    _refused_everywhere(models, tmp_path, table, phrase, runs="api convert recipes")


def test_a_merge_config_bomb_is_refused_by_the_same_loader(tmp_path):
    from suture._merge.config import read_config

    config = tmp_path / "merge.yaml"
    config.write_text(BILLION_LAUGHS + "method: linear\nmodels: *i\n")
    started = time.perf_counter()
    with pytest.raises(suture.MergeError, match="expands to over 100,000 YAML nodes"):
        read_config(config)
    assert time.perf_counter() - started < FAST


def test_every_yaml_reader_goes_through_the_guarded_loader():
    """No module of suture parses YAML but `suture._yaml`."""
    source = Path(suture.__file__).parent
    readers = sorted(
        str(path.relative_to(source))
        for path in source.rglob("*.py")
        if any(
            call in path.read_text()
            for call in ("yaml.safe_load", "yaml.load(", "yaml.compose", "SafeLoader")
        )
    )
    assert readers == ["_yaml.py"]


# Item 9: ignore patterns -----------------------------------------------------------------


def _backtracking_ignore(data: dict) -> None:
    data["leaves"] = [leaf for leaf in data["leaves"] if "post_attention" not in leaf["hf"]]
    data["ignore"] = [r"(.|[a-z]|\w)+\d\d"]  # exponential on the names left unused


def test_an_ignore_pattern_that_backtracks_is_stopped(models, tmp_path):
    table = _table(tmp_path, _backtracking_ignore)
    started = time.perf_counter()
    out = tmp_path / "cli"
    result = _cli_within(60, "convert", str(models / "hf"), str(out), "--recipe", str(table))
    assert result.returncode == 2, result
    assert "backtracks catastrophically" in result.stderr and "'(.|[a-z]|" in result.stderr
    with pytest.raises(suture.PatternError, match="backtracks catastrophically"):
        suture.convert(models / "hf", tmp_path / "api", recipe=str(table), progress=False)
    assert time.perf_counter() - started < 60
    assert sorted(p.name for p in tmp_path.iterdir()) == [table.name]


@pytest.mark.parametrize("where", ["ignore", "leave_out"])
def test_an_invalid_pattern_is_a_table_error(models, tmp_path, where):
    def change(data: dict) -> None:
        if where == "ignore":
            data["ignore"] = ["model\\.("]
        else:
            data["language_model"] = {
                "config": "text_config",
                "prefixes": ["language_model.model."],
                "leave_out": ["vision\\.("],
            }

    entry = "ignore[0]" if where == "ignore" else "language_model.leave_out[0]"
    table = _table(tmp_path, change)
    _refused_everywhere(models, tmp_path, table, f"{entry}: ", "is not a valid regular expression")


def test_a_valid_ignore_pattern_still_leaves_tensors_out(models, tmp_path):
    def change(data: dict) -> None:
        data["leaves"] = [leaf for leaf in data["leaves"] if leaf["hf"] != "model.norm.weight"]
        data["ignore"] = [r"model\.norm\.weight"]

    suture.convert(
        models / "hf", tmp_path / "out", recipe=str(_table(tmp_path, change)), progress=False
    )
    assert "params/params/decoder/decoder_norm/scale" not in suture.flatten(
        suture.open(tmp_path / "out").tree
    )


# Item 13: a table outside the schema -----------------------------------------------------------


def _set(path: str, value):
    def change(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value

    return change


def _periodic_path(data: dict) -> None:
    data["layer_period"] = 2
    data["leaves"][5]["maxtext"] = "decoder/moe_layers/value/kernel"


def _drop_field(data: dict) -> None:
    del data["config"]["checks"][0]["field"]


@pytest.mark.parametrize(
    ("change", "phrases"),
    [
        (_set("config", ["require", "defaults"]), ["config: must be a mapping"]),
        (_set("layer_groups", 5), ["layer_groups: must be a mapping"]),
        (_set("layer_period", 0), ["layer_period: must be a whole number of at least 1"]),
        (_set("layer_period", 0.5), ["layer_period: must be a whole number", "got 0.5"]),
        (_drop_field, ["config.checks[0]: needs 'field'"]),
        (
            _set("layer_peroid", 2),
            ["the table: unknown key 'layer_peroid'. Did you mean 'layer_period'"],
        ),
        (
            _set("leaves.2.ops.0", "transpos"),
            ["leaf 2 (", "ops[0]: 'transpos' is not an operation"],
        ),
        (
            _set("leaves.2.hf", "model.layers.{layr}.q"),
            ["{layr} in 'model.layers.{layr}.q' is no layer group"],
        ),
        (
            _set("leaves.3.ops.1", {"split_axis": {"axis": -1, "sizes": [2]}}),
            ["split_axis.axis: must be an axis"],
        ),
        (_set("leaves.3.ops.1", {"split_axis": {"axis": 1}}), ["split_axis: needs sizes"]),
        (
            _set("leaves.3.ops.3", {"scale": {"multiply": 2, "compute": "int8"}}),
            ["scale.compute: must be one of float32, float64"],
        ),
        (
            _set("leaves.2.when", "hidden_size.real"),
            ["when: 'hidden_size.real': only numbers", "found Attribute"],
        ),
        (_set("leaves.2.when", "hidden_size >"), ["when: 'hidden_size >' is not an expression"]),
        (_set("leaves", {"a": 1}), ["leaves: must be a non-empty list"]),
        (_set("target", "jax"), ["target: must be one of maxtext, tunix"]),
        (_set("leaves.0.ops", [{"pad_rows": {}}]), ["ops[0] pad_rows: needs 'to'"]),
        (
            _set("leaves.3.maxtext", "query/kernel"),
            ["leaf 3 ('query/kernel').maxtext: a MaxText path has no placeholder"],
        ),
        (
            _set("leaves.4.maxtext", "decoder/layers/self_attention/query/kernel"),
            ["leaf 4 (", ".maxtext: is also leaf 3's path: one would overwrite the other"],
        ),
        (
            _periodic_path,
            ["with a layer_period, a per-layer leaf's path starts with decoder/layers/"],
        ),
        (_set("config.checks.0.test", ["x"]), ["config.checks[0].test: must be an expression"]),
    ],
)
def test_a_table_outside_the_schema_is_one_error_naming_entry_and_rule(
    models, tmp_path, change, phrases
):
    table = _table(tmp_path, change)
    _refused_everywhere(models, tmp_path, table, f"Family table {str(table)!r}", *phrases)


def test_every_broken_rule_is_listed_in_the_one_error(models, tmp_path):
    def change(data: dict) -> None:
        data["layer_period"] = 0
        del data["config"]["checks"][0]["field"]
        data["leaves"][0]["ops"] = ["transpos"]

    table = _table(tmp_path, change)
    _refused_everywhere(
        models,
        tmp_path,
        table,
        "breaks 3 rules of the table format",
        "layer_period: must be",
        "config.checks[0]: needs 'field'",
        "'transpos' is not an operation. Did you mean 'transpose'?",
    )


def test_a_split_axis_beyond_the_arrays_rank_is_named_where_shapes_are_known(models, tmp_path):
    table = _table(
        tmp_path,
        _set(
            "leaves.3.ops.1",
            {"split_axis": {"axis": 5, "sizes": ["num_attention_heads", "head_dim"]}},
        ),
    )
    _refused_everywhere(
        models,
        tmp_path,
        table,
        "split_axis splits axis 5, and the array has 2 axes",
        runs="api convert",
    )


@pytest.mark.parametrize(
    ("change", "phrases"),
    [
        (
            _set("leaves.3.ops.1", {"split_axis": {"axis": 1, "sizes": [4.5, 16]}}),
            ["ops[1] split_axis.sizes[0]: '4.5' is 4.5 with this config", "a whole number"],
        ),
        (
            _set(
                "leaves.0.ops", [{"fit_rows": {"to": "vocab_size - 64", "back_to": "vocab_size"}}]
            ),
            ["ops[0] fit_rows.to: 'vocab_size - 64' is 0 with this config"],
        ),
        (
            _set("leaves.3.ops.3", {"scale": {"divide": "head_dim - 16"}}),
            ["ops[3] scale.divide: scale by 'head_dim - 16' is 0 with this config"],
        ),
    ],
)
def test_a_size_or_factor_that_would_be_cut_or_lost_is_refused(models, tmp_path, change, phrases):
    """4.5 heads were 4, -1 rows kept none, a factor of 0 wrote inf: each names its entry."""
    table = _table(tmp_path, change)
    _refused_everywhere(
        models, tmp_path, table, f"Family table {str(table)!r}", *phrases, runs="api convert"
    )


@pytest.mark.parametrize(
    "name",
    sorted(
        entry.name for entry in files("suture.families").iterdir() if entry.name.endswith(".yaml")
    ),
)
def test_every_built_in_table_follows_the_schema(name):
    from suture.families._schema import checked_table

    data = yaml.safe_load(files("suture.families").joinpath(name).read_text())
    checked_table(data, name)


def test_every_built_in_recipe_loads():
    for target in ("maxtext", "tunix"):
        _families.cache_clear()
        assert _families(target)
    for name in suture.families.recipe_names():
        assert suture.families.get_recipe(name).name == name
