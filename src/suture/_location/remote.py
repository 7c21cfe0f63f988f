"""Object stores and HTTP servers, through TensorStore's kvstore drivers (gcs, s3, http)."""

from __future__ import annotations

import io
import os
import re
import threading
from typing import Any

import numpy as np

from .._buffers import aligned_empty
from .._errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DestinationError,
    SurgeryError,
    UnsupportedError,
)
from .base import Location, short_read

WRITABLE_SCHEMES = ("gs", "s3")


class RemoteLocation(Location):
    """An object, or a prefix of objects ("folder"), reached through a TensorStore kvstore.

    ``gs://bucket/key``, ``s3://bucket/key`` or ``http(s)://host/key``. Folders are prefixes
    ending in ``/``; HTTP servers cannot list them, so only names given by metadata are read.
    """

    is_remote = True

    def __init__(self, scheme: str, host: str, key: str) -> None:
        self.scheme, self.host, self.key = scheme, host, key
        self._size: int | None = None

    def __str__(self) -> str:
        return (
            f"{self.scheme}://{self.host}/{self.key}"
            if self.key
            else f"{self.scheme}://{self.host}"
        )

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
        if self.scheme in ("http", "https"):
            spec["base_url"] = f"{spec['base_url']}/{prefix}"
        else:
            spec["path"] = prefix
        return spec

    def _store_and_key(self) -> tuple[Any, str]:
        return _open_store(self.scheme, self.host), self.key

    def _read(self, key: str, byte_range: slice | None = None) -> Any:
        store, _ = self._store_and_key()
        try:
            return store.read(key, byte_range=byte_range).result()
        except ValueError as error:
            raise _remote_error(self, error) from error

    # --- reading ------------------------------------------------------------------------
    def is_file(self) -> bool:
        if not self.key:
            return False
        return self._read(self.key, slice(0, 0)).state == "value"

    def is_dir(self) -> bool:
        if self.scheme in ("http", "https"):
            # no listing over HTTP: a folder is there when one of its usual files is
            return any((self / name).is_file() for name in _FOLDER_PROBES)
        return bool(self._list())

    def children(self) -> list[str]:
        return sorted({key.split("/", 1)[0] for key in self._list()})

    def subfolders(self) -> list[str]:
        return sorted({key.split("/", 1)[0] for key in self._list() if "/" in key})

    def _list(self) -> list[str]:
        import tensorstore as ts  # heavy: loaded on first use, not at import

        if self.scheme in ("http", "https"):
            raise UnsupportedError(
                f"{str(self)!r} is not a file on the HTTP server, and an HTTP server's folders "
                f"cannot be listed. Pass a file (a .safetensors file or *.safetensors.index.json), "
                f"or an Orbax checkpoint folder holding _METADATA rather than a CheckpointManager "
                f"root."
            )
        store, key = self._store_and_key()
        prefix = f"{key}/" if key else ""
        end = prefix[:-1] + "0" if prefix else ""  # '0' sorts right after '/'
        try:
            keys = store.list(ts.KvStore.KeyRange(prefix, end)).result()
        except ValueError as error:
            raise _remote_error(self, error) from error
        return [k.decode()[len(prefix) :] for k in keys]

    def read_bytes(self) -> bytes:
        result = self._read(self.key)
        if result.state != "value":
            raise CheckpointNotFoundError(f"No such file: {str(self)!r}. Check the path.")
        return bytes(result.value)

    def read_range(self, offset: int, count: int, what: str = "") -> np.ndarray:
        buffer = aligned_empty((count,), np.dtype(np.uint8))
        if not count:
            return buffer
        try:
            result = self._read(self.key, slice(offset, offset + count))
        except CorruptCheckpointError:
            raise short_read(self, what, count, offset, None) from None
        if result.state != "value" or len(result.value) != count:
            raise short_read(self, what, count, offset, len(result.value))
        buffer[:] = np.frombuffer(result.value, np.uint8)
        return buffer

    def read_head(self, count: int) -> bytes:
        try:
            return bytes(self.read_range(0, count))
        except CorruptCheckpointError:
            return self.read_bytes()[:count]

    def size(self) -> int:
        if self._size is None:
            self._size = self._probe_size()
        return self._size

    def _probe_size(self) -> int:
        """Doubles, then bisects, the offset of one-byte reads: 2 log2(size) small requests."""

        def has_byte(offset: int) -> bool:
            try:
                return len(self._read(self.key, slice(offset, offset + 1)).value) == 1
            except CorruptCheckpointError:
                return False

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
        return io.BufferedReader(_RangeReader(self), buffer_size=1 << 16)

    # --- writing ------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        self.require_writable()
        store, key = self._store_and_key()
        try:
            store.write(key, data).result()
        except ValueError as error:
            raise _remote_error(self, error) from error

    def remove(self) -> None:
        import tensorstore as ts  # heavy: loaded on first use, not at import

        self.require_writable()
        store, key = self._store_and_key()
        try:
            store.delete_range(ts.KvStore.KeyRange(f"{key}/", f"{key}0")).result()
            store.delete_range(ts.KvStore.KeyRange(key, key + "\x00")).result()
        except ValueError as error:
            raise _remote_error(self, error) from error

    def require_writable(self) -> None:
        if self.scheme not in WRITABLE_SCHEMES:
            raise DestinationError(
                f"Cannot write {str(self)!r}: {self.scheme}:// is read-only for suture. Write "
                f"to a local path, gs:// or s3://."
            )


class _RangeReader(io.RawIOBase):
    """A read-only, seekable file over a remote object's ranged reads."""

    def __init__(self, location: RemoteLocation) -> None:
        self._location, self._position = location, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: None}[whence]
        self._position = (self._location.size() if base is None else base) + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        count = max(0, min(len(buffer), self._location.size() - self._position))
        if count:
            data = self._location.read_range(self._position, count)
            memoryview(buffer).cast("B")[:count] = data
            self._position += count
        return count


# Files that mark a remote folder as a checkpoint, probed instead of listing over HTTP.
_FOLDER_PROBES = (
    "_METADATA",
    "_CHECKPOINT_METADATA",
    "model.safetensors.index.json",
    "model.safetensors",
)

_stores: dict[tuple[str, str, str, tuple], Any] = {}
_stores_lock = threading.Lock()
_CONTEXT_SPEC = {
    "cache_pool": {"total_bytes_limit": 0},
    "gcs_request_concurrency": {"limit": 64},
    "s3_request_concurrency": {"limit": 64},
    "http_request_concurrency": {"limit": 64},
    # Transient errors are retried with backoff, for about two minutes at most.
    **{
        f"{driver}_request_retries": {
            "max_retries": 10,
            "initial_delay": "0.5s",
            "max_delay": "16s",
        }
        for driver in ("gcs", "s3", "http")
    },
}


def remote_context() -> Any:
    """The TensorStore context shared by every remote read and write (request limits)."""
    import tensorstore as ts  # heavy: loaded on first use, not at import

    with _stores_lock:
        if "context" not in _shared:
            _shared["context"] = ts.Context(_CONTEXT_SPEC)
        return _shared["context"]


_shared: dict[str, Any] = {}


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
        try:
            store = ts.KvStore.open(spec, context=remote_context()).result()
        except ValueError as error:
            raise SurgeryError(f"Cannot reach {scheme}://{host}: {_clean(error)}") from error
        with _stores_lock:
            _stores[cache_key] = store
    return store


def _remote_error(location: Location, error: ValueError) -> SurgeryError:
    text = _clean(error)
    if "OUT_OF_RANGE" in text:
        return CorruptCheckpointError(f"{str(location)!r}: {text}")
    return SurgeryError(
        f"Cannot access {str(location)!r}: {text}. Check the path, and the credentials the "
        f"driver reads (environment variables, metadata server, config files)."
    )


def _clean(error: BaseException) -> str:
    """The driver's message without anything that looks like a credential."""
    text = str(error)
    return re.sub(
        r"(?i)(authorization|token|signature|credential)[^\s,;]*[=:]\s*\S+", r"\1=<hidden>", text
    )
