"""User patterns whose counted repeats would fill the memory when compiled: refused at once.

Issue 37, item 9 (review). The `regex` module writes a counted repeat out when it compiles
it, so 13 characters, ``(?:a{65535}){65535}``, ask for billions of items: the process was
killed for memory after a minute. Every user pattern (rules, family tables' ``ignore``,
merge ``per_leaf``, ``suture inspect --filter``) goes through `compile_pattern`, which now
bounds the expanded size first. Each call below runs with its address space capped, so
that a regression is a quick MemoryError rather than the machine's memory.
"""

from __future__ import annotations

import hashlib
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture import _patterns, rules
from suture._patterns import compile_pattern
from suture.cli import app

FAST = 2.0  # seconds: a refusal comes before anything is compiled or read
HOSTILE = [
    r"(?:a{65535}){65535}",
    r"(?:(?:(?:a{1000}){1000}){1000}){1000}",
    r"(?:a{1000}){1000,}",  # no largest count: its least is still written out
    r"\p{L}(?:a{1000}){1000}",  # syntax `re` lacks: the rough bound of the text's counts
]
VALID = [r"layers\.\d{1,3}\.w", r"layers\.0\.a{2,5}", r"\p{L}+\.\d{1,3}\.w", r"(?:layers\.\d+\.)+w"]


@contextmanager
def _memory_capped(extra: int = 2**30):
    """This process's address space capped at what it holds plus `extra` bytes."""
    status = Path("/proc/self/status").read_text().splitlines()
    held = int(next(line for line in status if line.startswith("VmSize:")).split()[1]) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _refused(result, *phrases: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error:") and "Traceback" not in result.output, result.output
    flat = " ".join(result.output.split())
    for phrase in phrases:
        assert phrase in flat, result.output


def _digest(folder: Path) -> str:
    hashed = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            hashed.update(path.name.encode() + path.read_bytes())
    return hashed.hexdigest()


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A safetensors file of two layers' weights."""
    path = tmp_path / "tiny" / "model.safetensors"
    path.parent.mkdir()
    save_file(
        {f"layers.{i}.{name}": np.ones(2, np.float32) for i in (0, 1) for name in ("w", "aa")}, path
    )
    return path


@pytest.mark.parametrize("pattern", HOSTILE)
def test_a_pattern_that_expands_is_refused_before_it_is_compiled(tiny, pattern):
    tree = load_file(tiny)
    started = time.perf_counter()
    with _memory_capped():
        with pytest.raises(suture.PatternError, match="items when compiled") as raised:
            compile_pattern(pattern, "test")
        with pytest.raises(rules.RuleError, match=r"drop\(.*items when compiled"):
            rules.apply_rules([rules.drop(pattern)], tree)
        with pytest.raises(suture.MergeError, match="per_leaf: .*items when compiled"):
            suture.merge([tree, tree], "linear", per_leaf={pattern: {"take": 0}})
    assert time.perf_counter() - started < FAST
    message = str(raised.value)
    assert message.startswith(f"test: {pattern!r}") and "over 100,000 items" in message
    assert "Write a shorter repeat, or + and *" in message


@pytest.mark.parametrize("pattern", HOSTILE)
def test_inspect_refuses_a_filter_that_expands(tiny, pattern):
    before = _digest(tiny.parent)
    started = time.perf_counter()
    with _memory_capped():
        result = CliRunner().invoke(app, ["inspect", str(tiny), "--filter", pattern])
    assert time.perf_counter() - started < FAST
    _refused(result, f"--filter: {pattern!r}", "over 100,000 items when compiled")
    assert _digest(tiny.parent) == before


def test_inspect_in_a_process_of_its_own_exits_2(tiny):
    """The command as users run it: one line and exit 2, not a MemoryError traceback."""
    pattern = HOSTILE[1]
    # the cap is set by the child itself: a preexec_fn would make subprocess fork this
    # process, which JAX (loaded here by other tests) warns against
    capped = (
        "import resource, runpy, sys; "
        "resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, resource.RLIM_INFINITY)); "
        "sys.argv = ['suture', *sys.argv[1:]]; "
        "runpy.run_module('suture', run_name='__main__', alter_sys=True)"
    )
    result = subprocess.run(
        [sys.executable, "-c", capped, "inspect", str(tiny), "--filter", pattern],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result
    assert result.stderr.startswith("Error: --filter:") and "Traceback" not in result.stderr
    assert "over 100,000 items when compiled" in result.stderr


def test_a_merge_config_per_leaf_pattern_that_expands_is_refused(tiny, tmp_path):
    config = tmp_path / "merge.yaml"
    config.write_text(
        f"method: linear\nmodels: [{tiny}, {tiny}]\nper_leaf:\n  '{HOSTILE[0]}': {{take: 1}}\n"
    )
    started = time.perf_counter()
    with _memory_capped():
        result = CliRunner().invoke(
            app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"]
        )
    assert time.perf_counter() - started < FAST
    _refused(result, "line 4 (per_leaf[", f"{HOSTILE[0]!r} expands to over 100,000 items")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merge.yaml", "tiny"]


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    """A tiny Llama (2 layers) in HF layout."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tests.test_hostile_tables import LLAMA  # that module needs torch: imported here

    path = tmp_path_factory.mktemp("patterns") / "hf"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(path)
    return path


@pytest.mark.parametrize("pattern", HOSTILE[:2])
def test_a_table_ignore_pattern_that_expands_is_refused(hf, tmp_path, pattern):
    from tests.test_hostile_tables import _table

    def change(data: dict) -> None:
        data["ignore"] = [pattern]

    table = _table(tmp_path, change)
    before = _digest(hf)
    started = time.perf_counter()
    with _memory_capped():
        with pytest.raises(suture.SurgeryError, match="items when compiled") as raised:
            suture.convert(hf, tmp_path / "api", recipe=str(table), progress=False)
        result = CliRunner().invoke(
            app, ["convert", str(hf), str(tmp_path / "cli"), "--recipe", str(table)]
        )
    assert time.perf_counter() - started < 2 * FAST
    assert "ignore[0]" in str(raised.value) and pattern in str(raised.value)
    _refused(result, "ignore[0]", repr(pattern), "over 100,000 items when compiled")
    assert sorted(p.name for p in tmp_path.iterdir()) == [table.name]  # no output, lock or temp
    assert _digest(hf) == before


def test_a_memory_error_while_compiling_is_a_pattern_error(monkeypatch):
    """Past the bound (raised here), `regex` running out of memory is the same clear error."""
    monkeypatch.setattr(_patterns, "EXPANDED_LIMIT", 10**12)
    with (
        _memory_capped(extra=2**28),
        pytest.raises(suture.PatternError, match="is too large to compile"),
    ):
        compile_pattern(HOSTILE[0], "test")


@pytest.mark.parametrize("pattern", VALID)
def test_bounded_repeats_still_match(tiny, pattern):
    """The valid neighbours: short counted repeats, `regex`'s own syntax, unbounded repeats."""
    tree = load_file(tiny)
    kept = rules.apply_rules([rules.drop(pattern, optional=True)], tree)
    wanted = {path for path in tree if compile_pattern(pattern, "test").fullmatch(path) is None}
    assert set(kept) == wanted
    result = CliRunner().invoke(app, ["inspect", str(tiny), "--flat", "--filter", pattern])
    assert result.exit_code == 0, result.output


def test_neighbours_within_the_bound_compile():
    assert compile_pattern(r"layers\.\d{1,3}\.", "test").fullmatch("layers.12.")
    assert compile_pattern("a{2,5}", "test").fullmatch("aaa")
    assert compile_pattern("a{100000}", "test").fullmatch("a" * 100_000)  # at the limit
    assert compile_pattern(r"(?:a{300}){300}", "test")  # 90,000 items
    names = "|".join(f"params/layer_{i}/kernel" for i in range(5000))  # long, but plain
    assert compile_pattern(names, "test").fullmatch("params/layer_4999/kernel")
    assert compile_pattern(r"\p{Lu}{2}\d{1,3}", "test").fullmatch("AB12")
