"""Replacing an existing result (``overwrite=True``) without a moment where none exists.

A file replaces a file with one ``rename`` (atomic on POSIX). A folder cannot be renamed
over a non-empty folder, so on Linux the new and the old swap places in one
``renameat2(RENAME_EXCHANGE)`` call, then the old one (now under the temporary name, which
every Orbax-aware reader treats as unfinished) is deleted. Where that call is missing (not
Linux, an old kernel, a file system without it), the old result is renamed aside first and
the new one renamed into place: between those two renames, microseconds apart, the path
does not exist. Only a checkpoint suture recognizes is replaced, so a typo cannot delete an
unrelated folder.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from ._errors import SurgeryError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def check_replaceable(destination: Any) -> None:
    """Refuses to overwrite anything that is not a checkpoint suture can open."""
    from .sources import detect

    try:
        detect(destination)
    except (SurgeryError, OSError) as error:
        raise SurgeryError(
            f"--overwrite replaces only a checkpoint, and {str(destination)!r} is not one that "
            f"suture recognizes ({error}). Remove it yourself if it should go, or write elsewhere."
        ) from None


def replace(new: Path, destination: Path) -> Path | None:
    """Puts `new` at `destination`; returns where the old result now is (to delete), if any.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> (folder / "new").write_text("new"); (folder / "old").write_text("old")
        3
        3
        >>> replace(folder / "new", folder / "old"), (folder / "old").read_text()
        (None, 'new')
    """
    if (not destination.is_dir() or destination.is_symlink()) and not new.is_dir():
        os.replace(new, destination)  # one atomic rename
        return None
    if _exchange(new, destination):
        return new  # the old result, under the temporary name
    aside = destination.with_name(f"{destination.name}.suture-old-{uuid.uuid4().hex[:12]}")
    os.rename(destination, aside)  # the documented window: until the next rename
    os.rename(new, destination)
    return aside


def _exchange(first: Path, second: Path) -> bool:
    """Swaps two paths atomically (Linux renameat2); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # no libc, or glibc older than 2.28
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(second))
