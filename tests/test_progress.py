"""Progress bars of `suture.load` and `suture diff --values`, and diff's speed-ups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import suture
from suture.cli.diff import diff
from tests.orbax_writers import save_standard


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    tree = {f"layer{i}": {"w": rng.standard_normal((64, 32), dtype=np.float32)} for i in range(6)}
    save_standard(tmp_path / "a", tree)
    tree["layer2"]["w"][3, 4] += 0.5
    tree["layer5"]["w"][0, 0] = np.nan
    save_standard(tmp_path / "b", tree)
    return tmp_path / "a", tmp_path / "b"


def test_load_shows_a_progress_bar_when_asked(two_checkpoints: tuple, capsys) -> None:
    first, _ = two_checkpoints
    loaded = suture.load(first, progress=True)
    assert "Reading" in capsys.readouterr().err
    assert loaded["layer0"]["w"].shape == (64, 32)
    suture.load(first)  # not a terminal: no bar
    assert capsys.readouterr().err == ""


def test_diff_values_shows_a_bar_and_finds_every_difference(two_checkpoints: tuple, capsys) -> None:
    first, second = two_checkpoints
    seen: list[str] = []
    result = diff(first, second, values=True, progress=True, on_leaf=seen.append)
    err = capsys.readouterr().err
    assert "Comparing" in err and "6/6 leaves" in err
    assert sorted(seen) == sorted(f"layer{i}/w" for i in range(6))
    changed = {path: d for path, d in result.values.items() if not d.equal}
    assert sorted(changed) == ["layer2/w", "layer5/w"]
    assert changed["layer2/w"].differing == 1
    assert changed["layer2/w"].max_abs == pytest.approx(0.5, abs=1e-6)
    assert changed["layer5/w"].max_abs == np.inf  # NaN on one side only
    same = diff(first, first, values=True, progress=False)
    assert same.equal and all(d.max_abs == 0 for d in same.values.values())


def test_equal_infinities_do_not_differ() -> None:
    a = {"w": np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)}
    b = {"w": np.array([np.inf, -np.inf, 2.0, np.nan], np.float32)}
    result = diff(a, b, values=True, progress=False)
    assert result.values["w"].differing == 1 and result.values["w"].max_abs == 1.0
