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
import datetime
import errno
import glob
import os
import re
import socket
import stat
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from .._errors import (
    DestinationError,
    DestinationExistsError,
    StaleLockWarning,
    SurgeryError,
    SutureWarning,
)
from .._interrupts import native_call, record_finished
from .._json import loads as loads_json
from .base import MAX_METADATA_BYTES, LocalLocation, Location

TMP_MARKER = ".orbax-checkpoint-tmp-suture-"
COMMIT_SUCCESS_FILE = "commit_success.txt"  # Orbax's commit marker on object stores
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"


class Publication:
    """Where one save writes (`temporary`) and how it becomes `destination` (`commit`)."""

    def __init__(self, destination: Location, temporary: Location, staged: bool) -> None:
        self.destination, self.temporary, self.staged = destination, temporary, staged
        self.committed = False

    def commit(self, overwrite: bool) -> None:
        """Makes the written result the destination's finished content.

        The step that finishes it (the rename; the commit marker or the last upload on an
        object store) and the note that it is finished (`committed`, and
        `suture._interrupts.record_finished` for the command line's last line) happen
        together: Ctrl-C or SIGTERM landing at that instant waits until both are done, so
        nothing after it takes a finished result for an unfinished one.
        """
        if isinstance(self.destination, LocalLocation):
            assert isinstance(self.temporary, LocalLocation)
            old = None
            try:
                with native_call():
                    old = rename_into_place(self.temporary.path, self.destination.path, overwrite)
                    self._finished()
            finally:  # the result it replaced goes, also when an interrupt was held
                if old is not None:
                    _remove_replaced(old, self.destination.path)
        elif self.staged:
            assert isinstance(self.temporary, LocalLocation)
            try:
                _upload(self.temporary.path, self.destination, self._finished)
            finally:  # also when an interrupt was held over the last upload
                remove_staged(self.temporary)
        else:
            marker = f"Checkpoint commit was successful to {self.destination}"
            with native_call():  # one small object
                (self.destination / COMMIT_SUCCESS_FILE).write_bytes(marker.encode())
                self._finished()

    def _finished(self) -> None:
        self.committed = True
        record_finished(str(self.destination))

    def abort(self) -> None:
        """Removes everything this save wrote, unless it is committed: a finished result
        (the temporary place is the destination itself on an object store) is kept. A
        staged upload's local files go either way: they are never the destination."""
        if self.staged and not isinstance(self.destination, LocalLocation):
            remove_staged(self.temporary)  # local files of an upload, never the destination
        elif not self.committed:
            self.temporary.remove()


def begin(
    destination: Location, overwrite: bool, staged: bool, reclaimed: str | None = None
) -> Publication:
    """Prepares a save to `destination`; call it holding `exclusive(destination)`.

    `staged`: the output is written as local files and uploaded at the commit (needed for
    formats written with positional writes, such as safetensors). `reclaimed`: the dead
    writer whose lock `exclusive` took over; an unfinished save it left is removed.

    Raises:
        DestinationExistsError: `destination` is a finished checkpoint and `overwrite` is False.
        DestinationError: `destination` is an unfinished save that is not a dead suture
            writer's (another host's save in progress, say) and `overwrite` is False.
    """
    if isinstance(destination, LocalLocation):
        if reclaimed is not None:
            _remove_temporaries(destination)
        name = f"{destination.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}"
        return Publication(destination, destination.with_name(name), staged)
    if destination.exists():
        if not overwrite:
            if not is_unfinished(destination):
                raise destination_exists(destination)
            if reclaimed is None:
                raise unfinished_elsewhere(destination)
        destination.remove()  # an overwrite (checked by the caller), or a dead writer's leftovers
    if staged:
        return Publication(destination, staging(destination), staged)
    return Publication(destination, destination, staged)


_STAGING_PREFIX = "suture-upload-"


def staging(destination: Location) -> LocalLocation:
    """A new local place to write `destination`'s files before they are uploaded, in a
    folder of its own (`remove_staged` removes both)."""
    return LocalLocation(Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX)) / destination.name)


def remove_staged(staged: Location) -> None:
    """Removes what `staging` made: the staged files, and the folder made for them. Only a
    folder `staging` made goes: for any other place, only `staged` itself."""
    assert isinstance(staged, LocalLocation)
    folder = staged.path.parent
    if folder.name.startswith(_STAGING_PREFIX) and folder.parent == Path(tempfile.gettempdir()):
        LocalLocation(folder).remove()
    else:
        staged.remove()


def _remove_temporaries(destination: LocalLocation) -> None:
    """Removes the temporary outputs a dead writer of `destination` left beside it.

    Only names this module makes (``NAME`` + marker + 12 hex digits) are touched, and only
    while holding the destination's lock, which no live writer holds.
    """
    pattern = re.compile(re.escape(f"{destination.name}{TMP_MARKER}") + "[0-9a-f]{12}")
    for sibling in destination.path.parent.iterdir():
        if pattern.fullmatch(sibling.name) and not sibling.is_symlink():
            with contextlib.suppress(OSError, SurgeryError):
                LocalLocation(sibling).remove()


def unfinished_elsewhere(destination: Location) -> DestinationError:
    """The error for an unfinished save at `destination` that no dead suture writer left."""
    return DestinationError(
        f"{str(destination)!r} holds an unfinished checkpoint that is not suture's own: "
        f"{_describe_unfinished(destination)}, and no suture lock of a writer that is gone "
        f"sits beside it. It looks like another program's or another host's save in progress, "
        f"so nothing was changed. Wait for it to finish, or write elsewhere; if you know that "
        f"save is dead, pass overwrite=True (--overwrite) to take it over deliberately."
    )


def _describe_unfinished(destination: Location) -> str:
    """Whose an unfinished save looks like: Orbax's metadata says when it started."""
    try:
        recorded = loads_json((destination / CHECKPOINT_METADATA).read_bytes(MAX_METADATA_BYTES))
        started_ns = int(recorded["init_timestamp_nsecs"])
        started = datetime.datetime.fromtimestamp(started_ns / 1e9, datetime.UTC)
        return f"an Orbax save started at {started:%Y-%m-%d %H:%M:%S} UTC with no commit yet"
    except (OSError, SurgeryError, ValueError, KeyError, TypeError, OverflowError):
        return "an Orbax save with no commit yet"


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
        recorded = loads_json(metadata.read_bytes(MAX_METADATA_BYTES))
    except (ValueError, SurgeryError):
        return False
    if not isinstance(recorded, dict):
        return False
    return recorded.get("commit_timestamp_nsecs") is None and "init_timestamp_nsecs" in recorded


def rename_into_place(temporary: Path, destination: Path, overwrite: bool) -> Path | None:
    """Moves a finished local result into place, atomically replacing an old one (`replace`);
    returns where the old result now is, for the caller to delete, if there was one."""
    if destination.exists() or destination.is_symlink():
        if not overwrite:
            raise DestinationExistsError(
                f"{str(destination)!r} appeared while writing; the new result was discarded."
            )
        return replace(temporary, destination)
    os.rename(temporary, destination)
    return None


def _remove_replaced(old: Path, destination: Path) -> None:
    """Deletes the result an overwrite replaced; folders without write permission (a result
    made read-only, say) are made writable for it. What still cannot go is named."""
    LocalLocation(old).remove()
    if not old.exists():
        return
    for folder, _, _ in os.walk(old):
        with contextlib.suppress(OSError):
            os.chmod(folder, os.stat(folder).st_mode | stat.S_IWUSR | stat.S_IXUSR)
    LocalLocation(old).remove()
    if old.exists():
        warnings.warn(
            f"{str(destination)!r} was replaced, but the old result it held could not be "
            f"deleted: it is left at {str(old)!r}. Delete that folder by hand.",
            SutureWarning,
            stacklevel=2,
        )


def _upload(staged: Path, destination: Location, finished: Callable[[], None]) -> None:
    """Uploads a staged file, or a staged folder's files with any index last; `finished` is
    called with the last upload, which makes the destination whole (held over Ctrl-C)."""
    if staged.is_file():
        uploads = [(staged, destination)]
    else:
        files = sorted(p for p in staged.rglob("*") if p.is_file())
        files.sort(key=lambda p: p.name.endswith(".index.json"))  # an index after its shards
        uploads = [(file, _under(destination, file.relative_to(staged))) for file in files]
    for file, target in uploads[:-1]:
        target.write_bytes(file.read_bytes())
    last = [(target, file.read_bytes()) for file, target in uploads[-1:]]  # read before holding
    with native_call():
        for target, data in last:
            target.write_bytes(data)
        finished()


def _under(destination: Location, relative: Path) -> Location:
    """`destination` / each part of `relative` (a `Location` joins one name at a time)."""
    for part in relative.parts:
        destination = destination / part
    return destination


class Held:
    """A lock held by `exclusive`; `reclaimed` names the dead writer it was taken from, if any."""

    def __init__(self, reclaimed: str | None) -> None:
        self.reclaimed = reclaimed


def lock_of(destination: Location) -> Location:
    """Where the lock of `destination` lives: ``.NAME.suture-lock`` beside it."""
    return destination.with_name(f".{destination.name}.suture-lock")


@contextlib.contextmanager
def exclusive(destination: Location) -> Iterator[Held]:
    """Holds the lock ``.NAME.suture-lock`` beside `destination` for one writer.

    The lock names its writer (``pid@host``, a token, and the process's start time where
    the system tells it). A lock whose writer is gone is taken over with a
    `StaleLockWarning`, but only when that writer ran on this host: on storage shared by
    several hosts (an object store, a network file system), another host's process cannot
    be checked from here. A pid that is alive but belongs to a process started after the
    lock's writer (the writer was killed and its pid reused) counts as gone. A lock file is
    read without following links and only when it looks like suture's own lock, so nothing
    of a foreign file reaches a message.

    Raises:
        DestinationError: another live process, or a process on another host, holds the
            lock; or something that is not suture's lock sits where the lock goes.
    """
    lock = lock_of(destination)
    token = uuid.uuid4().hex
    start = _process_start(os.getpid())
    owner = f"{os.getpid()}@{socket.gethostname()} {token}" + (f" start={start}" if start else "")
    reclaimed = None
    try:  # from before the lock exists: an interrupt at any moment leaves no lock of ours
        for _ in range(3):
            if _try_create(lock, owner):
                break
            text = _read_written_lock(lock)
            if text is None:
                continue  # removed meanwhile: try again
            pid, host, started = _parse_lock(text, lock)
            if host != socket.gethostname():
                raise DestinationError(
                    f"Another process (pid {pid} on host {host!r}) is writing "
                    f"{str(destination)!r}. Wait for it to finish, or write elsewhere; if that "
                    f"writer is gone, remove {str(lock)!r}."
                )
            if _writer_alive(pid, started):
                raise DestinationError(
                    f"Another process (pid {pid}) is writing {str(destination)!r}. Wait for it to "
                    f"finish, or write elsewhere."
                )
            if _read_lock(lock) == text:  # still the dead writer's: take it over
                lock.remove()
                reclaimed = f"pid {pid} on this host"
                warnings.warn(
                    f"Took over the lock {str(lock)!r} of a writer that is gone (pid {pid}, "
                    f"{'now a different process' if _alive(pid) else 'no longer running'}); "
                    f"the unfinished output it left for {str(destination)!r} is removed.",
                    StaleLockWarning,
                    stacklevel=3,
                )
        else:
            raise DestinationError(
                f"Could not lock {str(destination)!r} for writing; remove {str(lock)!r}."
            )
        yield Held(reclaimed)
    finally:
        try:
            _release(lock, owner)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while releasing: release, then stop
            _release(lock, owner)
            raise


def _release(lock: Location, owner: str) -> None:
    """Removes `lock` if it is `owner`'s (never a lock that is not this writer's)."""
    with contextlib.suppress(SurgeryError, OSError):
        if _read_lock(lock) == owner:
            lock.remove_file()


# pid@host token start=boot:ticks; locks of older versions lack the start, token or host
_LOCK_TEXT = re.compile(
    r"(?P<pid>[1-9][0-9]{0,9})(?:@(?P<host>[^\s@]{1,255}))?(?: (?P<token>[0-9a-f]{32}))?"
    r"(?: start=(?P<start>[0-9a-f-]{1,64}:[0-9]{1,20}))?\s*"
)
_LOCK_READ_LIMIT = 1024


def _try_create(lock: Location, owner: str) -> bool:
    if isinstance(lock, LocalLocation):
        with native_call():  # Ctrl-C lands after: no draft, and a lock only if it is whole
            created = _link_lock(lock.path, owner)
            if created is None:  # a filesystem without hard links
                created = _create_lock_in_place(lock.path, owner)
        if created:
            _remove_dead_drafts(lock.path)
        return created
    if lock.is_file():
        return False
    # padded to the bytes a read asks for (the lock's pattern allows trailing blanks), so
    # that each read of it is one ranged request, not a short one refused and a second;
    # created only where no lock is (a writer that probed just before another created its
    # lock does not overwrite it), then read back where a server ignores that condition
    if not lock.create_bytes(owner.encode().ljust(_LOCK_READ_LIMIT)):
        return False
    return _read_lock(lock) == owner


def _link_lock(lock: Path, owner: str) -> bool | None:
    """Creates `lock` whole: `owner` is written to a draft of its own, which is then linked
    to the lock's name. A link, like ``O_EXCL``, fails on any existing name (a link included,
    and nothing is followed), and the lock appears with its text, so a writer killed at any
    moment leaves no lock or a whole one, never an empty lock no one can claim. A draft a
    kill leaves behind is removed by the next writer (`_remove_dead_drafts`).

    Returns:
        Whether the lock was created; None where the filesystem has no hard links.
    """
    draft = lock.with_name(f"{lock.name}-{uuid.uuid4().hex}.draft")
    try:
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as error:  # the first thing a save writes: say why it cannot
        raise unwritable(LocalLocation(lock), error) from None
    try:
        try:
            os.write(descriptor, owner.encode())
        finally:
            os.close(descriptor)
        os.link(draft, lock, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno in _NO_HARD_LINKS:
            return None
        raise unwritable(LocalLocation(lock), error) from None
    finally:
        with contextlib.suppress(OSError):
            draft.unlink()


# what link() says on filesystems that have no hard links (FAT, some network and FUSE mounts)
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}


def _create_lock_in_place(lock: Path, owner: str) -> bool:
    """``O_EXCL`` and then the text: a kill in between leaves an empty lock (no hard links)."""
    try:  # O_EXCL fails on any existing name, a link included: nothing is followed
        descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError as error:
        raise unwritable(LocalLocation(lock), error) from None
    os.write(descriptor, owner.encode())
    os.close(descriptor)
    return True


def _remove_dead_drafts(lock: Path) -> None:
    """Removes the drafts of `lock` that writers killed on this host left behind: those
    naming a writer that is gone, and empty ones older than a minute."""
    with contextlib.suppress(OSError):
        for draft in lock.parent.glob(f"{glob.escape(lock.name)}-*.draft"):
            with contextlib.suppress(OSError, SurgeryError):
                text = _read_lock(LocalLocation(draft))
                if text is None:
                    continue
                if not text.strip():
                    if time.time() - draft.lstat().st_mtime > _EMPTY_DRAFT_AGE_S:
                        draft.unlink()
                    continue  # another writer's, just created
                pid, host, started = _parse_lock(text, LocalLocation(draft))
                if host == socket.gethostname() and not _writer_alive(pid, started):
                    draft.unlink()


_EMPTY_DRAFT_AGE_S = 60


def unwritable(place: Location, error: OSError) -> DestinationError:
    """`error` from writing `place` as a `DestinationError` that names its folder and why."""
    reason = error.strerror or str(error)
    return DestinationError(
        f"Cannot write in {str(place.parent)!r}: {reason} (creating {place.name!r}). Write the "
        f"output to a folder you can write to, or make this one writable."
    )


def _read_lock(lock: Location) -> str | None:
    """The lock's text (at most a few hundred bytes); None when there is no lock.

    A local lock is opened without following a link and must be a regular file.

    Raises:
        DestinationError: a link, a folder or another special file sits where the lock goes.
    """
    if not isinstance(lock, LocalLocation):
        try:  # a missing lock reads as not found: no separate probe for it
            return lock.read_head(_LOCK_READ_LIMIT).decode(errors="replace").rstrip()
        except (OSError, SurgeryError):
            return None
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(lock.path, flags)
    except FileNotFoundError:
        return None
    except OSError as error:  # ELOOP: a symbolic link; anything else: not ours either
        raise _foreign_lock(lock) from error
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise _foreign_lock(lock)
        return os.read(descriptor, _LOCK_READ_LIMIT).decode(errors="replace")
    finally:
        os.close(descriptor)


def _read_written_lock(lock: Location, waits: int = 50) -> str | None:
    """`_read_lock`, waiting (up to half a second) while the lock is empty: a writer creates
    it and then writes its name, and another writer starting that instant reads it between."""
    text = _read_lock(lock)
    for _ in range(waits):
        if text is None or text.strip():
            break
        time.sleep(0.01)
        text = _read_lock(lock)
    return text


def _parse_lock(text: str, lock: Location) -> tuple[int, str, str | None]:
    """``(pid, host, start)`` of a lock suture wrote; a file of any other content is foreign."""
    found = _LOCK_TEXT.fullmatch(text)
    if found is None:
        raise _foreign_lock(lock)
    return int(found["pid"]), found["host"] or socket.gethostname(), found["start"]


def _foreign_lock(lock: Location) -> DestinationError:
    return DestinationError(
        f"{str(lock)!r} is where suture keeps its lock, but what sits there is not a lock "
        f"suture wrote (a link, a folder, or a file of other content), so suture neither "
        f"reads nor removes it. Remove it if nothing of yours needs it, or write elsewhere."
    )


def _writer_alive(pid: int, started: str | None) -> bool:
    """Whether the lock's writer still runs: its pid is alive and started when it did."""
    if not _alive(pid):
        return False
    if started is None:
        return True  # a lock from before start times were recorded, or no /proc
    now = _process_start(pid)
    return now is None or now == started


def _process_start(pid: int) -> str | None:
    """``boot_id:ticks``: when `pid` started, unique across pid reuse and reboots (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{int(fields[19])}"  # field 22 of proc(5): starttime
    except (OSError, IndexError, ValueError):
        return None


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
