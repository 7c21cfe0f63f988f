"""JSON from files suture did not write: nesting too deep to parse is malformed input.

Python's parser recurses once per nested array or object and raises `RecursionError` past
the interpreter's limit (about a thousand levels), which no caller expects from a parse;
`loads` raises the `ValueError` every caller already turns into its own error instead.

Example:
    >>> loads('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> loads("[" * 100_000)
    Traceback (most recent call last):
    ValueError: JSON nested more deeply than its parser can follow
"""

from __future__ import annotations

import json
from typing import Any


def loads(raw: str | bytes | bytearray) -> Any:
    """`json.loads`, raising `ValueError` for nesting too deep to parse."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested more deeply than its parser can follow") from None
