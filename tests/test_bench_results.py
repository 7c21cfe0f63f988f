"""bench/RESULTS.md: each benchmark's section between its own markers, written without
touching another's."""

from __future__ import annotations

import re

import pytest
from bench._common import RESULTS, with_section

MARKER = re.compile(r"<!-- (/?)bench:(.*?) -->")


def test_results_md_sections_are_single_unnested_pairs() -> None:
    opened: list[str] = []
    seen: set[str] = set()
    for found in MARKER.finditer(RESULTS.read_text()):
        closing, name = found.groups()
        where = f"at {found.start()}: {found.group(0)}"
        if not closing:
            assert not opened, f"{where} opens inside {opened[-1]!r}"
            assert name not in seen, f"{where}: a second section {name!r}"
            opened.append(name)
            seen.add(name)
        else:
            assert opened == [name], f"{where} closes, {opened} open"
            opened.pop()
    assert not opened, f"{opened} never closed"


def test_a_section_is_replaced_and_the_others_kept() -> None:
    text = "# R\n\n<!-- bench:a -->\nold a\n<!-- /bench:a -->\n\n<!-- bench:b -->\nb\n<!-- /bench:b -->\n"
    replaced = with_section(text, "a", "new a\n")
    assert replaced == text.replace("old a", "new a")
    appended = with_section(replaced, "c", "c")
    assert appended == replaced.rstrip() + "\n\n<!-- bench:c -->\nc\n<!-- /bench:c -->\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "<!-- bench:a -->\n<!-- bench:b -->\nb\n<!-- /bench:a -->\n<!-- /bench:b -->\n",
            "encloses",
        ),
        (
            "<!-- bench:a -->\n1\n<!-- /bench:a -->\n<!-- bench:a -->\n2\n<!-- /bench:a -->\n",
            "more than once",
        ),
        ("<!-- bench:a -->\nno end\n", "without the other"),
        ("<!-- /bench:a -->\n<!-- bench:a -->\n", "closes before it opens"),
    ],
)
def test_a_misplaced_section_is_refused(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        with_section(text, "a", "new")


def test_a_body_holding_a_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="holds a section marker"):
        with_section("", "a", "x <!-- bench:b --> y")
