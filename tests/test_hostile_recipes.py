"""Hostile and mistaken recipe files: each is a RecipeError naming the field and its line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

import suture
from suture._surgery.recipes import MAX_RECIPE_BYTES, load_recipe

BILLION_LAUGHS = "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def _recipe(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_yaml_billion_laughs_is_refused_quickly(tmp_path: Path) -> None:
    """Item 10: 9**9 'lol's by aliases; PyYAML builds them shared, anything walking them hangs."""
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text(BILLION_LAUGHS + "rules: [{drop: *i}]\n")
    assert len(yaml.safe_load(recipe.read_text())["i"]) == 9  # stock loading shares the nodes
    started = time.perf_counter()
    with pytest.raises(suture.SurgeryError, match=r"expands to over 100,000 YAML nodes"):
        load_recipe(recipe)
    assert time.perf_counter() - started < 5


def test_a_fifo_is_not_read_as_a_recipe(tmp_path: Path) -> None:
    """Item 10: opening a FIFO for reading blocks until a writer comes; it is refused unopened."""
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    with pytest.raises(suture.SurgeryError, match="is not a regular file"):
        load_recipe(fifo)


def test_an_oversized_recipe_is_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "big.yaml"
    recipe.write_text("rules:\n  - drop: a\n" + "#" * MAX_RECIPE_BYTES)
    with pytest.raises(suture.SurgeryError, match="is over 1024 KiB"):
        load_recipe(recipe)


def test_a_recipe_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("rules:\n  - drop: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(suture.SurgeryError, match=r"line 2: not UTF-8 text \(byte 0xe9"):
        load_recipe(recipe)


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        ("yaml", "rules: " + "[" * 5000 + "]" * 5000),
        ("toml", "rules = " + "[" * 5000 + "]" * 5000),
        ("yaml", "rules:\n  " + "- " * 5000 + "x\n"),  # block style: no brackets
    ],
)
def test_deeply_nested_recipes_are_refused_quickly(tmp_path: Path, suffix: str, text: str) -> None:
    """RecursionError at ~1000 levels used to escape; PyYAML took seconds on 10 KB of '['."""
    recipe = tmp_path / f"deep.{suffix}"
    recipe.write_text(text)
    started = time.perf_counter()
    with pytest.raises(suture.SurgeryError, match="nests too deeply to be a recipe"):
        load_recipe(recipe)
    assert time.perf_counter() - started < 1


def test_toml_rule_name_must_be_a_string(tmp_path: Path) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[rules]]\npattern = "a"\nrule = ["drop"]\n')
    with pytest.raises(
        suture.SurgeryError, match=r"r.toml, line 3: field 'rule' must be a string naming the rule"
    ):
        load_recipe(recipe)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules:\n  - drop: 5\n", r"line 2: drop: field 'pattern' must be a string; got 5 \(int\)"),
        (
            "rules:\n  - split:\n      pattern: a\n      into: [x, y]\n      axis: one\n",
            r"line 5: split: field 'axis' must be a whole number; got 'one' \(str\)",
        ),
        (
            "rules:\n  - split: {pattern: a, into: x}\n",
            r"line 2: split: field 'into' must be a list of strings; got 'x'",
        ),
        (
            "rules:\n  - stack: {pattern: a, into: b, fill: zero}\n",
            r"line 2: stack: field 'fill' must be a whole number or a number or null",
        ),
        (
            "rules:\n  - drop: a\n  - rename:\n      pattern: a\n      to: [b]\n",
            r"line 5: rename: field 'to' must be a string; got \['b'\] \(list\)",
        ),
        ("rules:\n  - rename: {pattern: a}\n", r"line 2: rename: missing field 'to'"),
        ("rules:\n  - cast: [a, 5]\n", r"line 2: cast: field 'dtype' must be a string"),
        ("rules:\n  - drop: [a, b, c, d]\n", r"line 2: drop takes at most 1 values"),
        ("rules:\n  - drop: {pattern: a, optional: 'yes'}\n", r"field 'optional' must be true or"),
    ],
)
def test_yaml_fields_of_the_wrong_type_name_field_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(suture.SurgeryError, match=message):
        load_recipe(_recipe(tmp_path / "r.yaml", text))


def test_toml_fields_of_the_wrong_type_name_field_and_line(tmp_path: Path) -> None:
    text = (
        '[[rules]]\nrule = "drop"\npattern = "a"\n\n'
        '[[rules]]\nrule = "unstack"\npattern = "b"\ninto = "l{i}"\naxis = 1.5\n'
    )
    with pytest.raises(
        suture.SurgeryError, match=r"r.toml, line 9: unstack: field 'axis' must be a whole number"
    ):
        load_recipe(_recipe(tmp_path / "r.toml", text))


def test_a_valid_recipe_with_every_field_kind_loads(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "rules:\n"
        "  - split: {pattern: qkv, into: [q, k, v], axis: -1, sizes: [1, 1, 2]}\n"
        "  - stack: {pattern: 'l(?P<i>\\d+)', into: layers, fill: 0.0, optional: true}\n"
        "  - cast: [params, bfloat16]\n"
    )
    built = load_recipe(recipe).transform
    assert [type(rule).__name__ for rule in built] == ["Split", "Stack", "Cast"]
    assert built[0].sizes == (1, 1, 2) and built[0].axis == -1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: &r [{drop: a}, *r]\n", r"line 1: an alias refers to the value that contains it"),
        ("rules: [{drop: a}]\nn: 1" + ":1" * 20_000 + "\n", r"line 2: an integer of 40,001"),
    ],
)
def test_yaml_that_expands_without_end_or_slowly_is_refused(tmp_path: Path, text, message) -> None:
    """The loader every YAML file goes through (`suture._yaml`): an alias inside its own
    value, and a sexagesimal integer (1:1:1...) whose building is quadratic."""
    started = time.perf_counter()
    with pytest.raises(suture.RecipeError, match=message):
        load_recipe(_recipe(tmp_path / "r.yaml", text))
    assert time.perf_counter() - started < 2
