"""The command line: `suture inspect` and `suture demo`, through CliRunner and a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from suture.cli import app
from tests.orbax_writers import sample_arrays, save_manager, save_standard

runner = CliRunner()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    tree = {
        "params": {
            "encoder": {
                "layer0": {
                    "kernel": np.zeros((64, 32), np.float32),
                    "bias": np.zeros(32, np.float32),
                }
            },
            "head": {"kernel": np.zeros((32, 10), np.float32)},
        },
        "opt_state": {"mu": {"w": np.zeros((1024, 1024), np.float32)}},
        "step": np.asarray(3, np.int32),
    }
    save_standard(tmp_path / "ckpt", tree)
    return tmp_path / "ckpt"


def test_inspect_tree_shows_sizes_and_a_total(checkpoint: Path) -> None:
    result = runner.invoke(app, ["inspect", str(checkpoint)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"{checkpoint}  (orbax)"
    assert any(line.startswith("opt_state/") and line.endswith("4.0 MiB") for line in lines)
    assert any(
        "kernel" in line and "float32" in line and "(64, 32)" in line and "8.0 KiB" in line
        for line in lines
    )
    assert lines[-1] == "5 arrays, 1.1M parameters, 4.0 MiB"


def test_inspect_flat_lists_full_paths(checkpoint: Path) -> None:
    result = runner.invoke(app, ["inspect", str(checkpoint), "--flat"])
    assert result.exit_code == 0
    paths = [line.split()[0] for line in result.output.splitlines()[1:-1]]
    assert paths == [
        "opt_state/mu/w",
        "params/encoder/layer0/bias",
        "params/encoder/layer0/kernel",
        "params/head/kernel",
        "step",
    ]


def test_inspect_filter_and_depth(checkpoint: Path) -> None:
    filtered = runner.invoke(
        app, ["inspect", str(checkpoint), "--flat", "--filter", r"^params/.*kernel$"]
    )
    assert [line.split()[0] for line in filtered.output.splitlines()[1:-1]] == [
        "params/encoder/layer0/kernel",
        "params/head/kernel",
    ]
    assert filtered.output.splitlines()[-1] == "2 arrays, 2.4K parameters, 9.2 KiB"
    folded = runner.invoke(app, ["inspect", str(checkpoint), "--depth", "1"])
    lines = folded.output.splitlines()[1:-1]
    assert [line.split()[0] for line in lines] == ["opt_state/", "params/", "step"]
    assert "3 arrays" in lines[1]


def test_inspect_json(checkpoint: Path) -> None:
    result = runner.invoke(app, ["inspect", str(checkpoint), "--json", "--filter", "head"])
    report = json.loads(result.output)
    assert report["format"] == "orbax" and report["num_arrays"] == 1
    assert report["total_bytes"] == 32 * 10 * 4
    assert report["leaves"] == [
        {"path": "params/head/kernel", "shape": [32, 10], "dtype": "float32", "nbytes": 1280}
    ]


def test_inspect_step_of_a_manager(tmp_path: Path) -> None:
    save_manager(tmp_path / "run", sample_arrays(), steps=(1, 2))
    result = runner.invoke(app, ["inspect", str(tmp_path / "run"), "--step", "1", "--depth", "1"])
    assert result.exit_code == 0
    assert result.output.splitlines()[0].endswith("(orbax, step 1)")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "Error: No such file or folder"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "Error: .* is an empty folder"),
        (
            lambda p: (p / "x.orbax-checkpoint-tmp-1").mkdir() or p / "x.orbax-checkpoint-tmp-1",
            "Error: .*unfinished Orbax save",
        ),
    ],
)
def test_inspect_errors_exit_2_without_traceback(tmp_path: Path, make, message) -> None:
    result = runner.invoke(app, ["inspect", str(make(tmp_path))])
    assert result.exit_code == 2
    import re

    assert re.search(message, result.stderr)
    assert "Traceback" not in result.output


def test_bad_filter_regex_is_a_clear_error(checkpoint: Path) -> None:
    result = runner.invoke(app, ["inspect", str(checkpoint), "--filter", "("])
    assert result.exit_code == 2
    assert "is not a valid regular expression" in result.stderr


def test_inspect_in_a_real_process(checkpoint: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "suture", "inspect", str(checkpoint), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(result.stdout)["num_arrays"] == 5


def test_errors_in_a_real_process_exit_2_and_debug_shows_traceback(tmp_path: Path) -> None:
    plain = subprocess.run(
        [sys.executable, "-m", "suture", "inspect", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 2
    assert (
        plain.stderr.startswith("Error: No such file or folder") and "Traceback" not in plain.stderr
    )
    debug = subprocess.run(
        [sys.executable, "-m", "suture", "--debug", "inspect", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "no array data" in result.output
    assert "No problems." in result.output and "Dropped (never read): 17 leaves" in result.output
    assert "Stock Orbax restores the new checkpoint" in result.output
    assert "suture diff of before and after: 26 leaves only before" in result.output
    assert (tmp_path / "mlp_checkpoint" / "_METADATA").is_file()
    assert (tmp_path / "mlp_for_scan" / "_METADATA").is_file()


def test_demo_in_a_real_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "suture", "demo", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Done: the optimizer state was never read." in done.stdout
    # The first screen a newcomer sees carries no warnings (Orbax warns about tiny chunks).
    assert "WARNING" not in done.stderr, done.stderr[:2000]
