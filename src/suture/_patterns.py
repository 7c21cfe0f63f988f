"""User regular expressions, matched with a time bound.

Rule patterns, ``--grep`` filters and transformation keys come from users and recipe files.
Python's `re` cannot be interrupted, so a pathological pattern (``(a+)+$``) against long or
many paths could run for hours. Patterns are compiled with the `regex` module, whose syntax
(version 0) is `re`'s, and every match gets a deadline: past it, a `SurgeryError` names the
pattern instead of a hang.

Example:
    >>> pattern = compile_pattern(r"layer(\\d+)", "rename")
    >>> fullmatch(pattern, "layer3").group(1)
    '3'
"""

from __future__ import annotations

from typing import Any

import regex

from ._errors import PatternError as PatternError

MATCH_SECONDS = 2.0  # per match; a sane pattern takes microseconds on a path


def compile_pattern(pattern: str, owner: str) -> Any:
    """`pattern` compiled for `fullmatch`/`search`; `owner` names it in errors."""
    if not isinstance(pattern, str):
        raise PatternError(f"{owner}: a pattern must be a string; got {pattern!r:.80}.")
    try:
        return regex.compile(pattern, flags=regex.VERSION0)
    except (regex.error, ValueError, OverflowError, RecursionError) as error:
        raise PatternError(
            f"{owner}: {pattern!r} is not a valid regular expression: {error}."
        ) from error


def fullmatch(pattern: Any, text: str) -> Any:
    """`pattern.fullmatch(text)`, or a PatternError after `MATCH_SECONDS`."""
    return _bounded(pattern.fullmatch, pattern, text)


def search(pattern: Any, text: str) -> Any:
    """`pattern.search(text)`, or a PatternError after `MATCH_SECONDS`."""
    return _bounded(pattern.search, pattern, text)


def _bounded(method: Any, pattern: Any, text: str) -> Any:
    if not isinstance(pattern, regex.Pattern):  # a caller's own `re` pattern: no bound to set
        return method(text)
    try:
        return method(text, timeout=MATCH_SECONDS)
    except TimeoutError as error:
        raise PatternError(
            f"The pattern {pattern.pattern!r} took over {MATCH_SECONDS:g} s to match "
            f"{text[:80]!r}: it backtracks catastrophically (nested repeats such as (a+)+). "
            f"Simplify it, e.g. drop the nested repeat."
        ) from error
