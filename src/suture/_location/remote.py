"""Object stores and HTTP servers, through TensorStore's kvstore drivers (gcs, s3, http).

Three guards stand between a hostile or broken server and the caller:

- Every request waited on here has a deadline (`wait`): ``SUTURE_REMOTE_TIMEOUT`` seconds
  (120 by default), plus four seconds per MiB it moves; the HTTP client also drops a
  connection that sends nothing for 30 seconds, so that every driver's retries end too.
- A file's ETag (http, s3) or generation (gcs) is pinned by its first ranged read; a later
  ranged read that comes from another version of the file is an error, not a mix of both.
- URLs are shown without their user info and query values (`suture._redact`).

Opening a checkpoint asks the same small questions several times (is this a folder, what
does it hold, the config.json); each is a round trip on a bucket. Within
`metadata_read_once` each listing and each small read is asked once, its answer reused.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import http.client
import io
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._buffers import aligned_empty
from .._errors import (
    ArgumentError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DestinationError,
    SurgeryError,
    UnsupportedError,
)
from .._redact import redact_text, redact_url
from .base import Location, RangeReader, short_read, too_large
from .credentials import credentials_hint
from .http_body import (
    ACCEPTED,
    BodyTooLarge,
    Fetched,
    UnknownEncoding,
    fetch_capped,
    key_of,
    url_path,
)
from .http_redirect import REDIRECT_CODES, describe_status, redirect_target
from .reachable import check_reachable, forget_reached, remote_retries

WRITABLE_SCHEMES = ("gs", "s3")
TIMEOUT_VARIABLE = "SUTURE_REMOTE_TIMEOUT"
DEFAULT_TIMEOUT = 120.0  # seconds: about the two minutes the drivers' retries take at most
# bytes per second a transfer is given on top of the timeout: four reads share a link, and a
# request may wait behind others for one of its 64 slots
MIN_RATE = 256 << 10
STALL_SECONDS = 30  # the HTTP client drops a connection that sends nothing for this long
# A ranged read longer than PART_BYTES goes in parts, PARTS_AT_ONCE of them in flight.
PART_BYTES = 16 << 20
PARTS_AT_ONCE = 8


class RemoteLocation(Location):
    """An object, or a prefix of objects ("folder"), reached through a TensorStore kvstore.

    ``gs://bucket/key``, ``s3://bucket/key`` or ``http(s)://host/key``. Folders are prefixes
    ending in ``/``; HTTP servers cannot list them, so only names given by metadata are read.
    """

    is_remote = True

    def __init__(self, scheme: str, host: str, key: str) -> None:
        self.scheme, self.host, self.key = scheme, host, key
        self._size: int | None = None
        self._generation: bytes | None = None  # pinned by the first ranged read

    @classmethod
    def from_url(cls, scheme: str, host: str, path: str) -> RemoteLocation:
        """The location of ``scheme://host/path``. An http(s) URL's path is percent-decoded
        once into the key (the file's name as it is), which every request encodes once: a
        URL pasted from a browser (``with%20space``) and one typed raw (``with space``) name
        the same file; a '%' in a name is written ``%25``. Bucket keys are taken as they are.
        """
        key = key_of(path) if scheme in ("http", "https") else path
        return cls(scheme, host, key.strip("/"))

    @property
    def url(self) -> str:
        """The URL, credentials included (`str` hides them: for display); over HTTP its path
        percent-encoded once (a '?' left as it is, so that a query is still redacted)."""
        if not self.key:
            return f"{self.scheme}://{self.host}"
        http = self.scheme in ("http", "https")
        return f"{self.scheme}://{self.host}/{url_path(self.key, shown=True) if http else self.key}"

    def __str__(self) -> str:
        return redact_url(self.url)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteLocation) and self.url == other.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemoteLocation:
        return RemoteLocation(self.scheme, self.host, self.key.rpartition("/")[0])

    def __truediv__(self, name: str) -> RemoteLocation:
        name = name.strip("/")
        return RemoteLocation(self.scheme, self.host, f"{self.key}/{name}" if self.key else name)

    def resolve(self) -> RemoteLocation:
        return self

    # --- the kvstore --------------------------------------------------------------------
    def kvstore_spec(self) -> dict[str, Any]:
        spec = _base_spec(self.scheme, self.host)
        prefix = f"{self.key}/" if self.key else ""
        if self.scheme in ("http", "https"):  # a URL: encoded once (keys under it are by it)
            spec["base_url"] = f"{spec['base_url']}/{url_path(prefix)}"
        else:
            spec["path"] = prefix
        return spec

    def _store_and_key(self) -> tuple[Any, str]:
        return _open_store(self.scheme, self.host), self.key

    def _read(
        self, key: str, byte_range: slice | None = None, cap: int | None = None, what: str = ""
    ) -> Any:
        """A kvstore read within its deadline (asked once within `metadata_read_once`); a
        whole read with a `cap` stops once more than `cap` bytes come out (`_read_capped`)."""
        answers = _answers.get()
        if answers is None or not _small(byte_range):
            return self._read_one(key, byte_range, cap, what)
        asked = ("read", self.scheme, self.host, key, _bounds(byte_range))
        if asked not in answers:
            known = self._known_read(answers, key, byte_range)
            if known is not None:
                return known
            try:
                result = self._read_one(key, byte_range, cap, what)
            except SurgeryError as error:  # past the end, missing, no answer: so it stays
                answers[asked] = error
                raise
            if result.state != "value" or len(result.value) <= MEMO_BYTES:
                answers[asked] = result
            return result
        answer = answers[asked]
        if isinstance(answer, SurgeryError):
            raise answer.with_traceback(None)
        return answer

    def _known_read(self, answers: dict, key: str, byte_range: slice | None) -> Any:
        """A read answered by what is known already, or None: a range of a file read whole;
        whether a file is there (an empty range), from a listing of its folder."""
        import tensorstore as ts  # heavy: loaded on first use, not at import

        if byte_range is None:
            return None
        start, stop = _bounds(byte_range)
        whole = answers.get(("read", self.scheme, self.host, key, None))
        if isinstance(whole, SurgeryError):  # the file read whole failed: so does a range
            raise whole.with_traceback(None)
        if whole is not None and whole.state == "value":
            value = whole.value
            if stop > len(value):  # as the store answers a range past the end
                raise CorruptCheckpointError(
                    f"{str(self)!r}: OUT_OF_RANGE: the range {start}:{stop} ends past the "
                    f"file's {len(value)} bytes"
                )
            return ts.KvStore.ReadResult(state="value", value=value[start:stop], stamp=whole.stamp)
        if (start, stop) != (0, 0):
            return None
        if whole is not None:  # missing, read whole
            return whole
        for asked, answer in list(answers.items()):  # a read of it found no file
            if (
                asked[:4] == ("read", self.scheme, self.host, key)
                and getattr(answer, "state", None) == "missing"
            ):
                return answer
        if self.scheme in ("http", "https"):
            return None
        folder, _, name = key.rpartition("/")
        listed = answers.get(self._listing(*_folder_range(folder)))
        if listed is None:
            return None
        return ts.KvStore.ReadResult(state="value" if name in listed else "missing")

    def _read_one(self, key: str, byte_range: slice | None, cap: int | None, what: str) -> Any:
        if cap is not None and byte_range is None and self.scheme in ("http", "https"):
            return self._read_capped(key, cap, what)
        return self._read_now(key, byte_range)

    def _read_now(self, key: str, byte_range: slice | None = None) -> Any:
        store, _ = self._store_and_key()
        count = 0 if byte_range is None else (byte_range.stop or 0) - (byte_range.start or 0)
        try:
            return wait(store.read(key, byte_range=byte_range), self, count)
        except ValueError as error:
            code = _http_code(error)
            if self.scheme not in ("http", "https") or code not in REDIRECT_CODES:
                raise _remote_error(self, error) from None
        target = self._redirected(key, "GET" if count else "HEAD")
        if target.endswith("/"):  # a folder, as a file server names it: no file here
            import tensorstore as ts  # heavy: loaded on first use, not at import

            return ts.KvStore.ReadResult(state="missing")
        try:
            return wait(store.read(target, byte_range=byte_range), self, count)
        except ValueError as error:
            raise _remote_error(self, error) from None

    def _read_capped(self, key: str, cap: int, what: str) -> Any:
        """A whole file over HTTP as a kvstore read result, read by `fetch_capped` rather
        than TensorStore, whose client inflates a compressed body whole before it can be
        measured: the body stops at `cap` bytes, compressed or decoded."""
        import tensorstore as ts  # heavy: loaded on first use, not at import

        fetched = self._fetch_capped(key, cap, what)
        if fetched.status in REDIRECT_CODES:
            target = self._redirected(key, "HEAD")
            if target.endswith("/"):  # a folder, as a file server names it: no file here
                return ts.KvStore.ReadResult(state="missing")
            fetched = self._fetch_capped(target, cap, what)
        if fetched.status in (404, 410):
            return ts.KvStore.ReadResult(state="missing")
        if fetched.body is None:  # a status other than 2xx
            raise SurgeryError(f"Cannot read {str(self)!r}: {describe_status(fetched.status)}.")
        etag = (fetched.etag or "").strip()
        # as TensorStore records a strong ETag (unquoted, after a 0 byte); a weak one is
        # not pinned, as TensorStore's reads without one are not
        strong = len(etag) > 2 and etag[0] == etag[-1] == '"'
        stamp = ts.KvStore.TimestampedStorageGeneration(
            b"\x00" + etag[1:-1].encode() if strong else b"", time.time()
        )
        return ts.KvStore.ReadResult(state="value", value=fetched.body, stamp=stamp)

    def _fetch_capped(self, key: str, cap: int, what: str) -> Fetched:
        timeout = remote_timeout()
        try:
            return fetch_capped(self.scheme, self.host, key, cap, timeout, STALL_SECONDS, MIN_RATE)
        except BodyTooLarge:
            raise too_large(self, cap, what) from None
        except UnknownEncoding as error:
            raise CorruptCheckpointError(
                f"{str(self)!r} came with 'Content-Encoding: {error}', which suture does not "
                f"decode (it asks for {ACCEPTED}). Serve it uncompressed, or gzip-compressed."
            ) from None
        except zlib.error as error:
            raise CorruptCheckpointError(
                f"{str(self)!r} came compressed (Content-Encoding), and its body does not "
                f"decode: {error}. The server sends a damaged body; check the server."
            ) from None
        except TimeoutError:
            raise no_answer(self, timeout) from None
        except (OSError, http.client.HTTPException) as error:
            if isinstance(getattr(error, "reason", None), TimeoutError):  # urllib's wrapping
                raise no_answer(self, timeout) from None
            raise SurgeryError(
                f"Cannot reach {str(self)!r}: {redact_text(str(error))}. Check the server and "
                f"the network."
            ) from None

    def _redirected(self, key: str, method: str) -> str:
        """The key a server's redirect of `key` leads to, on the same host (asked once).

        Asked as the read asked: ``GET`` (of one byte) for a ranged read, ``HEAD`` for a
        probe or a whole file. A plain file server may answer a folder's ``HEAD`` (and
        unranged ``GET``) with ``301 -> folder/`` but a ranged ``GET`` with ``404``
        (RangeHTTPServer opens the folder as a file).
        """
        cache_key = (self.scheme, self.host, key, method)
        with _stores_lock:
            target = _redirects.get(cache_key)
        if target is None:
            target = redirect_target(self.scheme, self.host, key, remote_timeout(), method)
            if target.endswith("/") and target != f"{key}/":
                moved = redact_url(RemoteLocation(self.scheme, self.host, target).url)
                raise UnsupportedError(
                    f"{str(self)!r} redirects to the folder {moved!r} on the same server; "
                    f"suture reads a folder under the name it was given. Pass that URL "
                    f"instead."
                )
            with _stores_lock:
                _redirects[cache_key] = target
        return target

    def _pinned(self, result: Any) -> Any:
        """`result`, checked to come from the version of the file the first read pinned."""
        generation = result.stamp.generation
        # TensorStore's generations start with a flags byte: 0 for one the server gave (an
        # ETag, a GCS generation); a server that sends no ETag gives none, and is not checked
        if result.state != "value" or generation[:1] != b"\x00" or len(generation) < 2:
            return result
        if self._generation is None:
            self._generation = generation
        elif generation != self._generation:
            what = "generation" if self.scheme == "gs" else "ETag"
            raise CorruptCheckpointError(
                f"{str(self)!r} changed since it was opened (its {what} was "
                f"{_shown(self._generation)}, now {_shown(generation)}): the bytes read now "
                f"belong to another version of the file, and would mix with what was read "
                f"before. Open the checkpoint again once it stops changing."
            )
        return result

    # --- reading ------------------------------------------------------------------------
    def exists(self) -> bool:
        """One listing answers both questions, where a file probe and a folder listing took
        two round trips: the keys from this key up to ``key/``'s end hold both."""
        if not self.key or self.scheme in ("http", "https"):
            return super().exists()
        keys = self._list_from(self.key, self.key + "0")  # '0' sorts right after '/'
        return any(key == "" or key.startswith("/") for key in keys)

    def is_file(self) -> bool:
        """Whether the name answers as a file. Over HTTP a folder's own URL may answer too
        (a listing page) or fail (a redirect elsewhere, a refusal): a name whose folder
        files are known to answer is a folder whatever its own URL says."""
        if not self.key or (self.scheme in ("http", "https") and self._known_folder()):
            return False
        return self._read(self.key, slice(0, 0)).state == "value"

    def _known_folder(self) -> bool:
        """Whether one of the usual files of this name as a folder is known to be there:
        asked already within `metadata_read_once` (`probe_ahead` asks them along), so
        that this costs no request."""
        answers = _answers.get() or {}
        probes = [
            ("read", self.scheme, self.host, f"{self.key}/{name}", (0, 0))
            for name in _FOLDER_PROBES
        ]
        return any(getattr(answers.get(probe), "state", None) == "value" for probe in probes)

    def is_dir(self) -> bool:
        if self.scheme in ("http", "https"):
            # no listing over HTTP: a folder is there when one of its usual files is
            return any((self / name).is_file() for name in _FOLDER_PROBES)
        return bool(self._list())

    def children(self) -> list[str]:
        return sorted({key.split("/", 1)[0] for key in self._list()})

    def subfolders(self) -> list[str]:
        return sorted({key.split("/", 1)[0] for key in self._list() if "/" in key})

    def children_and_subfolders(self) -> tuple[list[str], list[str]]:
        keys = self._list()
        return (
            sorted({key.split("/", 1)[0] for key in keys}),
            sorted({key.split("/", 1)[0] for key in keys if "/" in key}),
        )

    def _list(self) -> list[str]:
        if self.scheme in ("http", "https"):
            raise UnsupportedError(
                f"{str(self)!r} is not a file on the HTTP server, and an HTTP server's folders "
                f"cannot be listed. Pass a file (a .safetensors file or *.safetensors.index.json), "
                f"or an Orbax checkpoint folder holding _METADATA rather than a CheckpointManager "
                f"root."
            )
        return self._list_from(*_folder_range(self.key))

    def listed_already(self) -> list[str] | None:
        """The folder's keys (relative to it) where `metadata_read_once` holds its listing
        already, else None: never a request."""
        answers = _answers.get()
        if answers is None or self.scheme in ("http", "https"):
            return None
        listed = answers.get(self._listing(*_folder_range(self.key)))
        return None if listed is None else list(listed)

    def _listing(self, start: str, end: str) -> tuple:
        """The question a listing of ``[start, end)`` is kept under in `metadata_read_once`."""
        return ("list", self.scheme, self.host, start, end)

    def _list_from(self, start: str, end: str) -> list[str]:
        """The keys in ``[start, end)`` ("": to the end), each less its first len(start) chars."""
        answers = _answers.get()
        asked = self._listing(start, end)
        if answers is not None and asked in answers:
            return list(answers[asked])
        found = self._list_now(start, end)
        if answers is not None:
            answers[asked] = tuple(found)
        return found

    def _list_now(self, start: str, end: str) -> list[str]:
        import tensorstore as ts  # heavy: loaded on first use, not at import

        store, _ = self._store_and_key()
        try:
            keys = wait(store.list(ts.KvStore.KeyRange(start, end)), self)
        except ValueError as error:
            raise _remote_error(self, error) from None
        return [k.decode()[len(start) :] for k in keys]

    def read_bytes(self, limit: int | None = None, what: str = "") -> bytes:
        if limit is not None:  # too big: refused before reading it
            try:
                probe = self._pinned(self._read(self.key, slice(limit, limit + 1)))
            except CorruptCheckpointError:  # the file ends before `limit`
                probe = None
            if probe is not None and probe.state != "value":  # no file: no second request
                raise CheckpointNotFoundError(f"No such file: {str(self)!r}. Check the path.")
            if probe is not None and len(probe.value) == 1:
                raise too_large(self, limit, what)
        result = self._read(self.key, cap=limit, what=what)
        if limit is not None:
            self._pinned(result)
        if result.state != "value":
            raise CheckpointNotFoundError(f"No such file: {str(self)!r}. Check the path.")
        value = result.value  # each access of `.value` makes a new copy
        if limit is not None and len(value) > limit:  # a compressed body, inflated
            raise too_large(self, limit, what)
        return value

    def _has_byte(self, offset: int) -> bool:
        try:
            result = self._read(self.key, slice(offset, offset + 1))
        except CorruptCheckpointError:  # the file ends before `offset`
            return False
        return self._pinned(result).state == "value" and len(result.value) == 1

    def read_range(self, offset: int, count: int, what: str = "") -> np.ndarray:
        buffer = aligned_empty((count,), np.dtype(np.uint8))
        self.read_into(offset, buffer, what)
        return buffer

    def read_into(self, offset: int, into: np.ndarray, what: str = "") -> None:
        """Fills `into` from `offset`; a range longer than `PART_BYTES` is read in parts,
        up to `PARTS_AT_ONCE` at a time: a connection's bandwidth is its own, and one
        request at a time would leave the others idle (a 64 MiB tensor took 0.9 s in one
        request through the benchmark's 200 MB/s-per-connection proxy)."""
        target = into.reshape(-1).view(np.uint8)
        count = target.nbytes
        if count <= PART_BYTES:
            self._read_part(offset, target, what, offset, count)
            return
        starts = range(0, count, PART_BYTES)
        with ThreadPoolExecutor(max_workers=min(PARTS_AT_ONCE, len(starts))) as pool:
            parts = [
                pool.submit(
                    self._read_part,
                    offset + start,
                    target[start : start + PART_BYTES],
                    what,
                    offset,
                    count,
                )
                for start in starts
            ]
            for part in parts:
                part.result()

    def _read_part(
        self, offset: int, target: np.ndarray, what: str, whole_offset: int, whole_count: int
    ) -> None:
        """Fills `target` with its size in bytes from `offset` (one ranged request), a part
        of the range ``whole_count`` bytes from `whole_offset` that errors name."""
        count = target.nbytes
        if not count:
            return
        try:
            result = self._read(self.key, slice(offset, offset + count))
        except CorruptCheckpointError:  # the file ends before the range does
            raise short_read(self, what, whole_count, whole_offset, None) from None
        value = self._pinned(result).value  # each access of `.value` makes a new copy
        if result.state != "value" or len(value) != count:
            got = offset - whole_offset + len(value) if result.state == "value" else 0
            raise short_read(self, what, whole_count, whole_offset, got)
        target[:] = np.frombuffer(value, np.uint8)

    def read_head(self, count: int) -> bytes:
        try:
            result = self._read(self.key, slice(0, count))
        except CorruptCheckpointError:  # shorter than `count`: the whole file, so no more
            result = self._read(self.key, cap=count)
        if result.state != "value":
            raise CheckpointNotFoundError(f"No such file: {str(self)!r}. Check the path.")
        return self._pinned(result).value[:count]

    def size(self) -> int:
        if self._size is None:
            self._size = self._probe_size()
        return self._size

    def _probe_size(self) -> int:
        """Doubles, then bisects, the offset of one-byte reads: 2 log2(size) small requests."""

        has_byte = self._has_byte
        if not has_byte(0):
            return 0
        low, high = 0, 1  # has_byte(low) holds; find the first offset without a byte
        for _ in range(64):
            if not has_byte(high):
                break
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if has_byte(middle) else (low, middle)
        return high

    def open_reader(self) -> Any:
        return io.BufferedReader(RangeReader(self), buffer_size=1 << 16)

    # --- writing ------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        self._write(data)

    def create_bytes(self, data: bytes) -> bool:
        """Writes `data` only if nothing is there yet (a conditional write: GCS's
        ``ifGenerationMatch=0``, S3's ``If-None-Match``); returns whether it was written. A
        server that ignores the condition (fake-gcs-server does) writes it as `write_bytes`
        would, and so does a TensorStore whose "no value" condition is not known here."""
        absent = _absent_generation()
        written = self._write(data, if_equal=absent)
        return absent is None or bool(written.generation)  # refused: no new generation

    def _write(self, data: bytes, if_equal: bytes | None = None) -> Any:
        """One kvstore write (conditional with `if_equal`); its new generation, if any."""
        self.require_writable()
        _forget_answers()
        store, key = self._store_and_key()
        self._generation, self._size = None, None  # the next version is this one
        try:
            return wait(store.write(key, data, if_equal=if_equal), self, len(data))
        except ValueError as error:
            raise _remote_error(self, error) from None

    def remove(self) -> None:
        import tensorstore as ts  # heavy: loaded on first use, not at import

        self.require_writable()
        _forget_answers()
        store, key = self._store_and_key()
        self._generation, self._size = None, None
        try:
            wait(store.delete_range(ts.KvStore.KeyRange(f"{key}/", f"{key}0")), self)
            wait(store.delete_range(ts.KvStore.KeyRange(key, key + "\x00")), self)
        except ValueError as error:
            raise _remote_error(self, error) from None

    def remove_file(self) -> None:
        self.require_writable()
        _forget_answers()
        store, key = self._store_and_key()
        self._generation, self._size = None, None
        try:
            wait(store.write(key, None), self)  # one DELETE; absent is fine
        except ValueError as error:
            raise _remote_error(self, error) from None

    def require_writable(self) -> None:
        if self.scheme not in WRITABLE_SCHEMES:
            raise DestinationError(
                f"Cannot write {str(self)!r}: {self.scheme}:// is read-only for suture. Write "
                f"to a local path, gs:// or s3://."
            )


# Within `metadata_read_once`: the answers so far, by question (a listing, a small read).
_answers: contextvars.ContextVar[dict[tuple, Any] | None] = contextvars.ContextVar(
    "suture_remote_answers", default=None
)
MEMO_BYTES = 1 << 20  # reads of at most this many bytes are kept (metadata, not tensors)


@contextlib.contextmanager
def metadata_read_once() -> Iterator[None]:
    """Within it, each listing and each small read (at most `MEMO_BYTES`) of a remote
    location is asked once, in this thread; later asks reuse the answer. For opening a
    checkpoint, which asks the same questions in several places; a write through a
    location forgets every answer. Nested, the outer scope's answers are kept.

    Example:
        >>> with metadata_read_once():
        ...     pass  # e.g. suture.open("gs://bucket/ckpt"): each question asked once
    """
    if _answers.get() is not None:
        yield
        return
    token = _answers.set({})
    try:
        yield
    finally:
        _answers.reset(token)


def read_ahead(files: list[Location], limit: int, what: dict[Location, str] | None = None) -> None:
    """Within `metadata_read_once`, reads the small remote `files` at once, each as
    ``read_bytes(limit, what[file])`` reads it, so that the reads that follow are answered
    without a round trip each (opening an Orbax folder reads three files one after another).
    Errors are kept for those reads to raise (`what` names the file in them, as the read
    that follows would); outside the scope this does nothing."""
    labels = what or {}
    _ask_at_once(files, lambda place: place.read_bytes(limit, labels.get(place, "")))


def head_ahead(files: list[Location], count: int, at_once: int) -> None:
    """Within `metadata_read_once`, reads the first `count` bytes of each remote file, up to
    `at_once` at a time, as ``read_head(count)`` reads them (safetensors headers), so that
    those reads are answered without a round trip each; outside it, nothing. Even a single
    file is read here: the point is to read it beside other questions, not after them."""
    _ask_at_once(files, lambda place: place.read_head(count), at_once, fewest=1)


def probe_ahead(files: list[Location]) -> None:
    """Within `metadata_read_once`, asks at once whether each remote file is there (as
    ``is_file`` asks), so that the probes that follow are answered without a round trip
    each (telling a folder's format probes a name, then another); outside it, nothing.

    Over HTTP a name probed along with files inside it may be a folder, which cannot be
    listed: its usual files are asked too, in the same round trip, for `is_file` to tell."""
    remote = [place for place in files if isinstance(place, RemoteLocation)]
    folders = [
        place
        for place in remote
        if place.scheme in ("http", "https") and any(other.parent == place for other in remote)
    ]
    usual = [folder / name for folder in folders for name in _FOLDER_PROBES]
    _ask_at_once(
        [*files, *(place for place in usual if place not in files)], RemoteLocation.is_file
    )


def _ask_at_once(
    files: list[Location],
    ask: Callable[[RemoteLocation], Any],
    at_once: int | None = None,
    fewest: int = 2,
) -> None:
    """Asks `ask` of the remote `files` on up to `at_once` threads (None: one each), where
    there are at least `fewest` of them and `metadata_read_once` keeps the answers."""
    answers = _answers.get()
    remote = [place for place in files if isinstance(place, RemoteLocation)]
    if answers is None or len(remote) < max(1, fewest):
        return

    def asked(place: RemoteLocation) -> None:
        with contextlib.suppress(SurgeryError, OSError):
            ask(place)

    with ThreadPoolExecutor(max_workers=min(len(remote), max(1, at_once or len(remote)))) as pool:
        # each in a copy of this context: the same answers, filled from every thread
        calls = [pool.submit(contextvars.copy_context().run, asked, place) for place in remote]
        for done in calls:
            done.result()


@functools.cache
def _absent_generation() -> bytes | None:
    """TensorStore's encoding of the condition "no value is stored" for ``if_equal``, as
    this TensorStore writes it (its encoding of generations changed between versions):
    the candidate under which a write to an in-memory store succeeds once and is refused
    the second time; None where none does."""
    import tensorstore as ts  # heavy: loaded on first use, not at import

    for candidate in (b"\x02", b"\x05", b"\x04"):
        store = ts.KvStore.open({"driver": "memory"}).result()
        try:
            first = store.write("k", b"1", if_equal=candidate).result()
            second = store.write("k", b"2", if_equal=candidate).result()
        except ValueError:  # not a generation this version reads
            continue
        if first.generation and not second.generation and store.read("k").result().value == b"1":
            return candidate
    return None


def _folder_range(key: str) -> tuple[str, str]:
    """The keys under `key` as a folder, ``[key/, key0)`` ('0' sorts right after '/');
    the whole store for the empty key.

    Example:
        >>> _folder_range("ckpt"), _folder_range("")
        (('ckpt/', 'ckpt0'), ('', ''))
    """
    prefix = f"{key}/" if key else ""
    return prefix, prefix[:-1] + "0" if prefix else ""


def _forget_answers() -> None:
    answers = _answers.get()
    if answers is not None:
        answers.clear()


def _small(byte_range: slice | None) -> bool:
    """Whether a read of `byte_range` may be kept: a whole file (kept only if small) or a
    range of at most `MEMO_BYTES` + 1 (a probe of a limit)."""
    if byte_range is None:
        return True
    return (byte_range.stop or 0) - (byte_range.start or 0) <= MEMO_BYTES + 1


def _bounds(byte_range: slice | None) -> tuple[int, int] | None:
    return None if byte_range is None else (byte_range.start or 0, byte_range.stop or 0)


# Files that mark a remote folder as a checkpoint, probed instead of listing over HTTP.
_FOLDER_PROBES = (
    "_METADATA",
    "_CHECKPOINT_METADATA",
    "model.safetensors.index.json",
    "model.safetensors",
)

_stores: dict[tuple[str, str, str, tuple], Any] = {}
_stores_lock = threading.Lock()
_redirects: dict[tuple[str, str, str, str], str] = {}  # (scheme, host, key, method) -> key
_CONTEXT_SPEC = {
    "cache_pool": {"total_bytes_limit": 0},
    "gcs_request_concurrency": {"limit": 64},
    "s3_request_concurrency": {"limit": 64},
    "http_request_concurrency": {"limit": 64},
}


def _context_spec() -> dict[str, Any]:
    """`_CONTEXT_SPEC`, with the retries of transient errors (``SUTURE_REMOTE_RETRIES``,
    10 by default: about two minutes at most, with backoff)."""
    retries = {"max_retries": remote_retries(), "initial_delay": "0.5s", "max_delay": "16s"}
    return {
        **_CONTEXT_SPEC,
        **{f"{driver}_request_retries": retries for driver in ("gcs", "s3", "http")},
    }


def remote_context() -> Any:
    """The TensorStore context shared by every remote read and write (request limits)."""
    import tensorstore as ts  # heavy: loaded on first use, not at import

    with _stores_lock:
        if "context" not in _shared:
            _limit_stalls()
            _shared["context"] = ts.Context(_context_spec())
        return _shared["context"]


_shared: dict[str, Any] = {}


def forget_stores() -> None:
    """Drops the shared context and open stores; the next request opens fresh ones.

    Requests given up on (a deadline passed) keep their slot among the 64 until their
    retries end; a fresh context starts with all of them free (the hostile-server tests
    start each case so).
    """
    with _stores_lock:
        _shared.clear()
        _stores.clear()
        _redirects.clear()
    forget_reached()


def _limit_stalls() -> None:
    """Makes TensorStore's HTTP client drop a connection that sends nothing for a while.

    Without it a server that accepts a connection and never answers holds the request (and
    its retries) forever. TensorStore reads these settings when its first HTTP request is
    made; values the user set are kept.
    """
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", str(STALL_SECONDS))
    os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")


def remote_timeout() -> float:
    """Seconds a remote request may take (``SUTURE_REMOTE_TIMEOUT``, 120 by default).

    Raises:
        ArgumentError: the variable is set to something other than a positive number.
    """
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ArgumentError(
            f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds. Set it to a positive "
            f"number (the default is {DEFAULT_TIMEOUT:g}), or unset it."
        )
    return seconds


def wait(future: Any, location: Any, count: int = 0) -> Any:
    """The result of a TensorStore future for `location`, within the request's deadline.

    The deadline is `remote_timeout` plus four seconds per MiB of the `count` bytes moved.

    Raises:
        SurgeryError: no result in time (the request is cancelled).
        ValueError: the driver's own error, for the caller to word.
    """
    deadline = remote_timeout() + count / MIN_RATE
    try:
        return future.result(timeout=deadline)
    except TimeoutError:
        future.cancel()
        raise no_answer(location, deadline) from None


def no_answer(location: Any, deadline: float) -> SurgeryError:
    """The error for a request to `location` that found no answer within `deadline` s."""
    return SurgeryError(
        f"No answer from {redact_text(str(location))!r} within {deadline:.3g} s: the server "
        f"accepted the request but did not finish it (stalled, or too slow), retries "
        f"included. Check the server and the network; {TIMEOUT_VARIABLE} sets the seconds "
        f"to wait (now {remote_timeout():g})."
    )


def _shown(generation: bytes) -> str:
    """A pinned generation as a person reads it: an ETag's text, a GCS generation number."""
    raw = generation[1:]
    text = raw.decode("utf-8", "replace")
    if text.isprintable() and text:
        return repr(text[:80])
    return str(int.from_bytes(raw[:8], "little")) if len(raw) >= 8 else raw.hex()


def _base_spec(scheme: str, host: str) -> dict[str, Any]:
    if scheme == "gs":
        return {"driver": "gcs", "bucket": host}
    if scheme == "s3":
        spec: dict[str, Any] = {"driver": "s3", "bucket": host}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if endpoint:
            spec["endpoint"] = endpoint
        if region:
            spec["aws_region"] = region
        if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
            # the default chain takes these first anyway; naming the provider skips its
            # probes of ~/.aws/config and the web-identity settings, which log an error
            # line each when absent
            spec["aws_credentials"] = {"type": "environment"}
        return spec
    return {"driver": "http", "base_url": f"{scheme}://{host}"}


def _open_store(scheme: str, host: str) -> Any:
    """One open kvstore per bucket or host (and endpoint settings), shared by all reads."""
    import tensorstore as ts  # heavy: loaded on first use, not at import

    spec = _base_spec(scheme, host)
    # TensorStore reads the GCS endpoint from the environment when a store is opened
    endpoint = os.environ.get("TENSORSTORE_GCS_HTTP_URL", "") if scheme == "gs" else ""
    cache_key = (scheme, host, endpoint, tuple(sorted((k, str(v)) for k, v in spec.items())))
    with _stores_lock:
        store = _stores.get(cache_key)
    if store is None:
        shown = redact_url(f"{scheme}://{host}")
        try:
            store = wait(ts.KvStore.open(spec, context=remote_context()), shown)
        except SurgeryError:
            raise
        except ValueError as error:
            raise SurgeryError(f"Cannot reach {shown}: {_clean(error)}") from None
        check_reachable(scheme, host, shown)  # a name that does not resolve fails at once
        with _stores_lock:
            _stores[cache_key] = store
    return store


def _remote_error(location: Location, error: ValueError) -> SurgeryError:
    if isinstance(error, SurgeryError):  # already worded (a deadline passed)
        return error
    text = _clean(error)
    if "OUT_OF_RANGE" in text:
        return CorruptCheckpointError(f"{str(location)!r}: {text}")
    code = _http_code(error)
    if getattr(location, "scheme", "") in ("http", "https") and code is not None:
        meaning = describe_status(code)
        if code in (404, 410):
            return CheckpointNotFoundError(f"Cannot read {str(location)!r}: {meaning}.")
        return SurgeryError(f"Cannot read {str(location)!r}: {meaning}.")
    hint = credentials_hint(getattr(location, "scheme", ""))
    return SurgeryError(f"Cannot access {str(location)!r}: {text}. {hint}")


def _clean(error: BaseException) -> str:
    """The driver's message without anything that looks like a credential."""
    text = redact_text(str(error))
    return re.sub(
        r"(?i)(authorization|token|signature|credential)[^\s,;]*[=:]\s*\S+", r"\1=<hidden>", text
    )


def _http_code(error: BaseException) -> int | None:
    """The HTTP status in a driver's message (``... [HTTP code 301]``), if any."""
    found = re.search(r"\[HTTP code (\d{3})\]", str(error))
    return int(found.group(1)) if found else None
