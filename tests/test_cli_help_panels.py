"""`suture convert --help` groups its options in panels: output, families, quantization,
adapters, memory and safety."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from suture.cli import app

PANELS = {
    "Output": ["--format", "--dtype", "--max-shard-size", "--overwrite", "--progress"],
    "Families": ["--recipe", "--reverse", "--config", "--like"],
    "Quantization": ["--dequantize", "--quantize", "--group-size", "--keep-unquantized"],
    "Adapters": ["--lora-alpha"],
    "Memory and safety": ["--max-memory", "--dry-run", "--verify", "--strict-casts"],
}


def panels_of(text: str) -> dict[str, str]:
    """Each panel's title and the text inside its box."""
    found: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        top = re.match(r"^╭─ (.+?) ─", line)
        if top:
            title, found[top.group(1)] = top.group(1), ""
        elif line.startswith("╰"):
            title = None
        elif title is not None:
            found[title] += line + "\n"
    return found


def test_convert_help_groups_its_options_in_panels() -> None:
    done = CliRunner().invoke(
        app, ["convert", "--help"], env={"COLUMNS": "120"}, terminal_width=120
    )
    assert done.exit_code == 0, done.output
    panels = panels_of(done.output)
    for panel, flags in PANELS.items():
        assert panel in panels, (panel, list(panels))
        for flag in flags:
            assert flag in panels[panel], (panel, flag)
    # shared options keep no panel in the other commands
    other = panels_of(CliRunner().invoke(app, ["apply", "--help"], env={"COLUMNS": "120"}).output)
    assert "Memory and safety" not in other and "--max-memory" in other["Options"]
