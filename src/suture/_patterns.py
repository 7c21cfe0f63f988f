"""User regular expressions, matched with a time bound.

Rule patterns, ``--grep`` filters and transformation keys come from users and recipe files.
Python's `re` cannot be interrupted, so a pathological pattern (``(a+)+$``) against long or
many paths could run for hours. Patterns are compiled with the `regex` module, whose syntax
(version 0) is `re`'s, and every match gets a deadline: past it, a `SurgeryError` names the
pattern instead of a hang. Compiling is bounded too: `regex` writes out counted repeats, so
``(?:a{65535}){65535}`` would fill the memory; a pattern whose repeats multiply past
`EXPANDED_LIMIT` items is refused before it is compiled.

Example:
    >>> pattern = compile_pattern(r"layer(\\d+)", "rename")
    >>> fullmatch(pattern, "layer3").group(1)
    '3'
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache
from typing import Any

import regex

from ._errors import PatternError as PatternError

MATCH_SECONDS = 2.0  # per match; a sane pattern takes microseconds on a path
EXPANDED_LIMIT = 100_000  # items a compiled pattern may hold; a path pattern needs a few dozen

try:  # the standard library's parser (Python 3.11+); without it, the rough bound alone
    from re import _parser

    _UNBOUNDED = _parser.MAXREPEAT
except (ImportError, AttributeError):  # pragma: no cover - a Python that moved it
    _parser = None
_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}
_COUNT = re.compile(r"\{(\d*),?(\d*)\}")


def compile_pattern(pattern: str, owner: str) -> Any:
    """`pattern` compiled for `fullmatch`/`search`; `owner` names it in errors."""
    if not isinstance(pattern, str):
        raise PatternError(f"{owner}: a pattern must be a string; got {pattern!r:.80}.")
    _refuse_expansion(pattern, owner)
    try:
        return regex.compile(pattern, flags=regex.VERSION0)
    except (regex.error, ValueError, OverflowError, RecursionError) as error:
        raise PatternError(
            f"{owner}: {pattern!r} is not a valid regular expression: {error}."
        ) from error
    except MemoryError as error:
        raise PatternError(
            f"{owner}: {pattern!r:.200} is too large to compile. Write shorter counted "
            f"repeats, or + and * for 'one or more' and 'any number'."
        ) from error


def _refuse_expansion(pattern: str, owner: str) -> None:
    """A PatternError if compiling `pattern` would write out over `EXPANDED_LIMIT` items."""
    limit = max(EXPANDED_LIMIT, len(pattern))  # a long plain pattern is the user's own size
    parsed = _expanded_size(pattern, limit + 1)
    if parsed is None:  # syntax only `regex` knows: each character times every count instead
        if len(pattern) * _count_product(pattern, limit + 1) <= limit:
            return
        how = "may expand to over"
    elif parsed <= limit:
        return
    else:
        how = "expands to over"
    raise PatternError(
        f"{owner}: {pattern!r:.200} {how} {limit:,} items when compiled, the most a pattern "
        f"may hold (a counted repeat is written out, and nested ones multiply). Write a "
        f"shorter repeat, or + and * for 'one or more' and 'any number' (e.g. 'a+' rather "
        f"than 'a{{65535}}')."
    )


@lru_cache(maxsize=1024)
def _expanded_size(pattern: str, cap: int) -> int | None:
    """The items `pattern` compiles to (at most `cap`), from the standard library's parse
    tree; None where that parser does not take the pattern."""
    if _parser is None:  # pragma: no cover
        return None
    try:
        with warnings.catch_warnings():  # "possible nested set" and the like: not ours
            warnings.simplefilter("ignore")
            return _tree_size(_parser.parse(pattern), cap)
    except (re.error, ValueError, OverflowError, RecursionError):
        return None


def _tree_size(items: Any, cap: int) -> int:
    """The items the parsed pattern `items` is written out to, at most `cap`: a counted
    repeat is its largest count (its least when it has no largest) times what it repeats."""
    size = 0
    for op, argument in items:
        times = 1
        if str(op) in _REPEATS:
            least, most, _ = argument
            times = max(least, 1) if most == _UNBOUNDED else max(most, 1)
        size = min(size + times * max(_nested_size(argument, cap), 1), cap)
    return size


def _nested_size(argument: Any, cap: int) -> int:
    """The summed size of the subpatterns within one node's `argument` (groups, branches,
    lookarounds, repeats); 0 for a leaf such as a literal or a set."""
    if isinstance(argument, _parser.SubPattern):
        return _tree_size(argument, cap)
    if isinstance(argument, (tuple, list)):
        return min(sum(_nested_size(part, cap) for part in argument), cap)
    return 0


def _count_product(pattern: str, cap: int) -> int:
    """The product of every ``{m}``, ``{m,n}`` count in `pattern`'s text (at most `cap`):
    however they nest, no character is written out more times than that."""
    product = 1
    for match in _COUNT.finditer(pattern):
        digits = [part.lstrip("0") for part in match.groups()]
        count = max((int(part) if len(part) <= 9 else cap for part in digits if part), default=1)
        product = min(product * count, cap)
    return product


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
