"""The built-in tables' heads: a recipe name is recognised without parsing the tables whole."""

from __future__ import annotations

from importlib.resources import files

import pytest
import yaml

from suture import families
from suture._errors import RecipeError
from suture.families._index import head_text, read_head, read_table, table_heads
from suture.families._tables import _families

TABLES = sorted(e.name for e in files("suture.families").iterdir() if e.name.endswith(".yaml"))


@pytest.mark.parametrize("name", TABLES)
def test_every_built_in_tables_head_is_what_its_whole_parse_says(name):
    whole = yaml.safe_load(files("suture.families").joinpath(name).read_text())
    head = table_heads()[name]
    assert head.names == tuple(whole["names"])
    assert head.target == whole.get("target", "maxtext")
    assert head.layouts == (tuple(whole["layouts"]) if "layouts" in whole else None)


def _uncached() -> None:
    for cached in (table_heads, read_table, _families):
        cached.cache_clear()


def test_recognising_a_recipe_name_parses_no_table_whole():
    _uncached()
    assert families.is_recipe_name("qwen3-moe:maxtext")
    assert families.is_recipe_name("Qwen3.5")
    assert not families.is_recipe_name("qwen9:maxtext")
    assert "gemma4-small:maxtext-unscanned" in families.recipe_names()
    assert "gemma4-small:maxtext" not in families.recipe_names()  # its `layouts:` say so
    assert read_table.cache_info().currsize == 0
    assert families.get_recipe("qwen3-moe:maxtext").name == "qwen3-moe:maxtext"
    assert read_table.cache_info().currsize == 1  # the table used, and no other


def test_a_head_is_its_keys_lines_and_their_continuations():
    text = (
        "# a comment\nnames:\n- a\n- b\ndescription: x\nleaves:\n- {hf: w}\n"
        "layouts: [\n  maxtext-unscanned]\ntarget: tunix\n"
    )
    assert head_text(text) == "names:\n- a\n- b\nlayouts: [\n  maxtext-unscanned]\ntarget: tunix"
    head = read_head("t.yaml", text)
    assert (head.names, head.target, head.layouts) == (("a", "b"), "tunix", ("maxtext-unscanned",))


def test_a_hostile_head_is_refused_by_the_guarded_loader():
    levels = ["&a [x, x, x, x, x, x, x, x, x]"]
    levels += [f"&{c} [{', '.join([f'*{chr(ord(c) - 1)}'] * 9)}]" for c in "bcdefg"]
    bomb = f"names: [{', '.join(levels)}]\n"  # 9**7 nodes once expanded
    deep = "names: " + "[" * 200 + "]" * 200 + "\n"
    for text in (bomb, deep):
        with pytest.raises(RecipeError, match="Built-in family table 'evil.yaml'"):
            read_head("evil.yaml", text)
