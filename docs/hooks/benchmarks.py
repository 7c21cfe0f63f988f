"""mkdocs hook: bench/RESULTS.md is the site's benchmarks page, and links to it follow.

The figures live in one file beside the benchmarks that write them; the docs link to it
(``../bench/RESULTS.md`` from docs/, which also works when browsing the repository), and
the site shows it as ``benchmarks.md`` without a copy in docs/.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "RESULTS.md"
PAGE = "benchmarks.md"
_LINK = re.compile(r"\]\((?:\.\./)+bench/RESULTS\.md\)")


def on_files(files: Files, config: object) -> Files:
    files.append(File.generated(config, PAGE, abs_src_path=str(RESULTS)))
    return files


def on_page_markdown(markdown: str, page: object, config: object, files: Files) -> str:
    folder = posixpath.dirname(page.file.src_uri)  # type: ignore[attr-defined]
    relative = posixpath.relpath(PAGE, folder or ".")
    return _LINK.sub(f"]({relative})", markdown)
