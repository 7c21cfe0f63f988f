"""The user guide and the public docs: code runs, links resolve, public names only, site builds.

Every page of docs/ is checked: its relative links lead to files that exist, and the site
builds with ``mkdocs build --strict``. The guide's pages (docs/index.md, docs/guide/) run
like the README: Python blocks in order in one namespace, ``suture ...`` lines of bash
blocks through the command line, in a folder holding the checkpoints the pages name. A
block whose first line is ``# file: NAME`` is written to NAME instead (a recipe, a merge
config), for the blocks after it to use.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.test_readme import make_files

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = sorted((DOCS / "guide").glob("*.md")) + [DOCS / "index.md"]
PAGES = sorted(p for p in DOCS.rglob("*.md"))
# design.md describes the private modules it is made of; every other page is for users.
PUBLIC_TEXTS = [ROOT / "README.md", *(p for p in PAGES if p.name != "design.md")]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
PRIVATE_NAME = re.compile(r"\bsuture\._\w+|\bsuture/_\w+|from \._\w+ import")
LINK = re.compile(r"\]\(([^)\s]+)\)")
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
# torch is a 3.11-only extra (see the Makefile): without it, a guide block that imports it is
# left out, the page's other blocks still run, and the test reports a skip.
USES_TORCH = re.compile(r"^\s*(import|from) torch\b", re.M)
HAVE_TORCH = importlib.util.find_spec("torch") is not None
runner = CliRunner()


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [
        link.split("#")[0]
        for link in LINK.findall(text)
        if not re.match(r"[a-z]+:", link) and not link.startswith("#")
    ]


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_links_resolve(page: Path) -> None:
    broken = [link for link in relative_links(page) if not (page.parent / link).exists()]
    assert not broken, f"{page.name} links to missing files: {broken}"


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [str(p.relative_to(DOCS)) for p in PAGES if str(p.relative_to(DOCS)) not in nav]
    assert not missing, f"add these pages to the nav of mkdocs.yml: {missing}"
    index = (DOCS / "index.md").read_text()
    assert all(f"guide/{p.name}" in index for p in GUIDE if p.parent.name == "guide")


def test_public_docs_and_examples_use_public_names_only() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {match}"
        for path in [*PUBLIC_TEXTS, *EXAMPLES]
        for match in PRIVATE_NAME.findall(path.read_text())
    ]
    assert not found, found


def test_public_docstrings_use_public_names_only() -> None:
    documented = []
    for name in suture.__all__:
        value = getattr(suture, name)
        documented.append((name, value))
        members = (
            inspect.getmembers(value) if inspect.ismodule(value) or inspect.isclass(value) else []
        )
        documented += [(f"{name}.{m}", v) for m, v in members if not m.startswith("_")]
    found = [
        f"{name}: {match}"
        for name, value in documented
        for match in PRIVATE_NAME.findall(inspect.getdoc(value) or "")
    ]
    assert not found, found


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("checkpoints")
    make_files(folder)
    return folder


def run_shell_line(line: str) -> None:
    arguments = shlex.split(line.split("  #")[0])[1:]
    if arguments[:1] == ["demo"]:
        return  # the demo: 20 s, tests/test_cli.py runs it; --examples made this folder
    done = runner.invoke(app, arguments)
    expected = (0, 1) if arguments[0] == "diff" else (0,)  # diff: 1 means "they differ"
    assert done.exit_code in expected, f"{line}\n{done.output}"


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: p.stem)
def test_guide_page_code_runs(
    page: Path, checkpoints: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "work"
    shutil.copytree(checkpoints, workdir)
    monkeypatch.chdir(workdir)
    namespace: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    blocks = BLOCK.findall(page.read_text())
    needing_torch = 0
    for language, code in blocks:
        first = code.splitlines()[0] if code.strip() else ""
        if first.startswith("# file: "):
            (workdir / first.removeprefix("# file: ").strip()).write_text(code)
        elif language == "python" and USES_TORCH.search(code) and not HAVE_TORCH:
            needing_torch += 1  # torch is not installed (the newest Python): the rest still runs
        elif language == "python":
            exec(compile(code, str(page), "exec"), namespace)  # noqa: S102 (the page's own code)
        elif language == "bash":
            for line in code.splitlines():
                if line.startswith("suture "):
                    run_shell_line(line)
    if needing_torch:
        pytest.skip(f"torch is not installed: {needing_torch} block(s) of {page.name} not run")


def test_site_builds_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs-material is in the dev extra")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    assert (tmp_path / "guide" / "partial-loading" / "index.html").is_file()
    assert (tmp_path / "benchmarks" / "index.html").is_file()  # bench/RESULTS.md, linked


def test_version_comes_from_the_package_metadata() -> None:
    assert suture.__version__ == importlib.metadata.version("suture")
    done = runner.invoke(app, ["--version"])
    assert done.exit_code == 0 and done.output.strip() == f"suture {suture.__version__}"


def test_apply_help_documents_python_recipes() -> None:
    done = runner.invoke(app, ["apply", "--help"], env={"COLUMNS": "200"})
    text = " ".join(done.output.split())
    for phrase in (
        "RULES = [...]",
        "transform(*trees)",
        "TARGET",
        "init",
        "run only recipes you trust",
    ):
        assert phrase in text, phrase
