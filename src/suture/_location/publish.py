"""Publishing a written checkpoint: a lock per destination, a temporary place, a commit.

The commit half of `suture._location`. A reader never sees a half-written result as
finished:

- **Local**: the result is written into a temporary sibling named with Orbax's
  ``.orbax-checkpoint-tmp`` marker and renamed into place when complete; an old result
  is removed only after the new one is in place.
- **Object stores** (``gs://``, ``s3://``) have no atomic rename, so suture publishes the
  way Orbax does there (its ``CommitFileTemporaryPath``): an Orbax folder is written under
  its final prefix, starting with a ``_CHECKPOINT_METADATA`` that records no commit, and
  is finished by writing ``commit_success.txt`` last. suture, stock Orbax's
  CheckpointManager and ``is_path_finalized`` treat a prefix without it as unfinished.
  Files that are single objects (safetensors files, an index's shards) are staged in a
  local temporary folder and uploaded at the commit; an object appears only when its
  upload completes, and an index is uploaded after every shard it names.

A lock (``.NAME.suture-lock`` beside the destination) keeps two writers apart; one left
by a process that died on this machine is taken over. A destination that is an
unfinished save (no commit) left by a writer that died is cleaned up and rewritten.

Replacing an old local result (`replace`): a file replaces a file with one ``rename``. A
folder cannot be renamed over a non-empty folder, so on Linux the new and the old swap
places in one ``renameat2(RENAME_EXCHANGE)`` call and the old one, now under the temporary
name, is deleted. Where that call is missing, the old result is renamed aside first: between
those two renames, microseconds apart, the path does not exist. What may be replaced at all
is the save's overwrite policy (`suture._save.overwrite`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from .._errors import DestinationError, DestinationExistsError, SurgeryError
from .base import LocalLocation, Location

TMP_MARKER = ".orbax-checkpoint-tmp-suture-"
COMMIT_SUCCESS_FILE = "commit_success.txt"  # Orbax's commit marker on object stores
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"


class Publication:
    """Where one save writes (`temporary`) and how it becomes `destination` (`commit`)."""

    def __init__(self, destination: Location, temporary: Location, staged: bool) -> None:
        self.destination, self.temporary, self.staged = destination, temporary, staged

    def commit(self, overwrite: bool) -> None:
        """Makes the written result the destination's finished content."""
        if isinstance(self.destination, LocalLocation):
            assert isinstance(self.temporary, LocalLocation)
            rename_into_place(self.temporary.path, self.destination.path, overwrite)
        elif self.staged:
            assert isinstance(self.temporary, LocalLocation)
            _upload(self.temporary.path, self.destination)
            self.temporary.remove()
        else:
            marker = f"Checkpoint commit was successful to {self.destination}"
            (self.destination / COMMIT_SUCCESS_FILE).write_bytes(marker.encode())

    def abort(self) -> None:
        """Removes everything this save wrote (never a finished destination)."""
        self.temporary.remove()


def begin(destination: Location, overwrite: bool, staged: bool) -> Publication:
    """Prepares a save to `destination`; call it holding `exclusive(destination)`.

    `staged`: the output is written as local files and uploaded at the commit (needed for
    formats written with positional writes, such as safetensors).

    Raises:
        DestinationExistsError: `destination` is a finished checkpoint and `overwrite` is False.
    """
    if isinstance(destination, LocalLocation):
        name = f"{destination.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}"
        return Publication(destination, destination.with_name(name), staged)
    if destination.exists():
        if not overwrite and not is_unfinished(destination):
            raise destination_exists(destination)
        destination.remove()  # an overwrite, or a dead writer's leftovers
    if staged:
        folder = Path(tempfile.mkdtemp(prefix="suture-upload-"))
        return Publication(destination, LocalLocation(folder / destination.name), staged)
    return Publication(destination, destination, staged)


def destination_exists(destination: Location) -> DestinationExistsError:
    replace = (
        "the old one is removed only once the new one is complete"
        if not destination.is_remote
        else "on an object store the old one is deleted before the new one is written"
    )
    return DestinationExistsError(
        f"{str(destination)!r} already exists. Pass overwrite=True (--overwrite) to replace it "
        f"({replace}), or choose another path."
    )


def is_unfinished(folder: Location) -> bool:
    """True for an Orbax save that started but never committed (local or remote)."""
    if TMP_MARKER.split("-suture-")[0] in folder.name:
        return True
    metadata = folder / CHECKPOINT_METADATA
    if not metadata.is_file():
        return False
    try:
        recorded = json.loads(metadata.read_bytes())
    except ValueError:
        return False
    if not isinstance(recorded, dict):
        return False
    return recorded.get("commit_timestamp_nsecs") is None and "init_timestamp_nsecs" in recorded


def rename_into_place(temporary: Path, destination: Path, overwrite: bool) -> None:
    """Moves a finished local result into place, atomically replacing an old one (`replace`)."""
    if destination.exists() or destination.is_symlink():
        if not overwrite:
            raise DestinationExistsError(
                f"{str(destination)!r} appeared while writing; the new result was discarded."
            )
        old = replace(temporary, destination)
        if old is not None:
            LocalLocation(old).remove()
        return
    os.rename(temporary, destination)


def _upload(staged: Path, destination: Location) -> None:
    """Uploads a staged file, or a staged folder's files with any index last."""
    if staged.is_file():
        destination.write_bytes(staged.read_bytes())
        return
    files = sorted(p for p in staged.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name.endswith(".index.json"))  # an index after its shards
    for file in files:
        destination_file = destination
        for part in file.relative_to(staged).parts:
            destination_file = destination_file / part
        destination_file.write_bytes(file.read_bytes())


@contextlib.contextmanager
def exclusive(destination: Location) -> Iterator[None]:
    """Holds the lock ``.NAME.suture-lock`` beside `destination`, naming its writer ``pid@host``.

    A lock whose writer is gone is taken over, but only when that writer ran on this host:
    on storage shared by several hosts (an object store, a network file system), another
    host's process cannot be checked from here.

    Raises:
        DestinationError: another live process, or a process on another host, holds the lock.
    """
    lock = destination.with_name(f".{destination.name}.suture-lock")
    owner = f"{os.getpid()}@{socket.gethostname()} {uuid.uuid4().hex}"
    for _ in range(2):
        if _try_create(lock, owner):
            break
        pid, host = _lock_owner(lock)
        if pid is not None and host not in (None, socket.gethostname()):
            raise DestinationError(
                f"Another process (pid {pid} on host {host!r}) is writing {str(destination)!r}. "
                f"Wait for it to finish, or write elsewhere; if that writer is gone, remove "
                f"{str(lock)!r}."
            )
        if pid is not None and _alive(pid):
            raise DestinationError(
                f"Another process (pid {pid}) is writing {str(destination)!r}. Wait for it to "
                f"finish, or write elsewhere."
            )
        lock.remove()  # stale: its writer died
    else:
        raise DestinationError(
            f"Could not lock {str(destination)!r} for writing; remove {str(lock)!r}."
        )
    try:
        yield
    finally:
        with contextlib.suppress(SurgeryError, OSError):
            lock.remove()


def _try_create(lock: Location, owner: str) -> bool:
    if isinstance(lock, LocalLocation):
        try:
            descriptor = os.open(lock.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        os.write(descriptor, owner.encode())
        os.close(descriptor)
        return True
    if lock.is_file():
        return False
    lock.write_bytes(owner.encode())
    # Object stores have no exclusive create everywhere: read back, the last writer wins.
    return lock.read_bytes().decode(errors="replace") == owner


def _lock_owner(lock: Location) -> tuple[int | None, str | None]:
    """The lock's writer: ``(pid, host)``; a lock from before hosts were recorded has no host."""
    try:
        words = lock.read_bytes().decode(errors="replace").split()
    except (OSError, SurgeryError):
        return None, None
    pid_text, _, host = (words[0] if words else "").partition("@")
    try:
        return (int(pid_text or "0") or None), (host or None)
    except ValueError:
        return None, None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


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
