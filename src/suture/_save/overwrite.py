"""The overwrite policy: what ``overwrite=True`` may replace.

Only a checkpoint suture recognizes is replaced, so a typo cannot delete an unrelated
folder. The replacement itself (atomic, never a moment without a result) is
`suture._location.publish.replace`.
"""

from __future__ import annotations

from typing import Any

from .._errors import DestinationError, SurgeryError
from ..sources.detect import detect


def check_replaceable(destination: Any) -> None:
    """Refuses to overwrite anything that is not a checkpoint suture can open."""
    try:
        detect(destination)
    except (SurgeryError, OSError) as error:
        raise DestinationError(
            f"--overwrite replaces only a checkpoint, and {str(destination)!r} is not one that "
            f"suture recognizes ({error}). Remove it yourself if it should go, or write elsewhere."
        ) from None
