"""What ended a command: a `SurgeryError` or an interruption, wherever it sits in a failure.

A library between suture and the command line can wrap what suture raised: an extension
module interrupted while it initializes reports ``ImportError: initialization failed`` with
the ``KeyboardInterrupt`` as its cause, a pool re-raises a worker's error inside another,
an ``ExceptionGroup`` gathers several. The command line looks through the chain, so that a
bad input is still one ``Error:`` line and an interruption still exits with 130 or 143.

Example:
    >>> from suture._errors import ArgumentError
    >>> try:
    ...     try:
    ...         raise ArgumentError("bad")
    ...     except ArgumentError as error:
    ...         raise RuntimeError("wrapped") from error
    ... except RuntimeError as wrapped:
    ...     str(surgery_error_in(wrapped))
    'bad'
"""

from __future__ import annotations

from collections.abc import Iterator

from .._errors import SurgeryError

_MOST_LINKS = 32  # a chain longer than this is not a wrapping: stop looking


def _chain(error: BaseException, through_context: bool) -> Iterator[BaseException]:
    """`error`, the errors it was raised from and, for groups, the errors they hold."""
    seen: set[int] = set()
    waiting = [error]
    while waiting and len(seen) < _MOST_LINKS:
        current = waiting.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            waiting.extend(current.exceptions)
        if current.__cause__ is not None:
            waiting.append(current.__cause__)
        elif through_context and not current.__suppress_context__ and current.__context__:
            waiting.append(current.__context__)


def surgery_error_in(error: BaseException) -> SurgeryError | None:
    """The `SurgeryError` that `error` is, or was explicitly raised from; None if none.

    Only explicit causes (``raise ... from``) and groups count: an error raised while
    handling a SurgeryError is a failure of its own, not that SurgeryError.
    """
    return next((e for e in _chain(error, False) if isinstance(e, SurgeryError)), None)


def interruption_in(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (`KeyboardInterrupt`) that `error` is, or that led to it.

    An interrupt that lands inside an import, a cleanup or a library's own handler comes back
    as another exception with the interrupt as its cause or context; it is still the interrupt.
    """
    return next((e for e in _chain(error, True) if isinstance(e, KeyboardInterrupt)), None)
