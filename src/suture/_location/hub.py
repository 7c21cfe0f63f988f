"""Model repositories on the Hugging Face Hub: ``hf://ORG/NAME[@REVISION][/PATH]``.

Read through ``huggingface_hub`` 1.0 or newer (installed with transformers; else ``pip
install huggingface_hub``): the revision (``main`` by default; a branch, tag or commit) is resolved
to its commit when a source is first read, and every file of it is read at that commit, so
a push while reading cannot mix two versions. URLs named again within `PIN_SECONDS` share
that commit (a conversion names its source several times); later ones see new pushes. Folders are listed with the Hub's tree API (one request
per folder), and each read is a ranged ``GET`` of only the bytes asked for. The token is
the one ``huggingface_hub`` finds (``HF_TOKEN``, ``hf auth login``'s file) and is never
printed; ``HF_ENDPOINT`` names another Hub (a mirror, an enterprise Hub).

With ``HF_HUB_OFFLINE=1`` nothing is asked of the Hub: the URL is read from the local cache
(`hub_cache`), as ``huggingface_hub`` itself does offline. When the Hub cannot be reached (no
network) and the cache holds the revision, the cache is read too, with one warning naming
its commit, as ``huggingface_hub`` and transformers fall back.

Example:
    >>> str(hub_location("hf://org/model@v1/sub") / "model.safetensors")
    'hf://org/model@v1/sub/model.safetensors'
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from .._buffers import aligned_empty
from .._errors import (
    ArgumentError,
    CheckpointNotFoundError,
    DestinationError,
    SurgeryError,
    SutureWarning,
    UnsupportedError,
)
from .._iostats import record_read
from .base import LocalLocation, Location, RangeReader, short_read, too_large
from .hub_cache import (
    DEFAULT_REVISION,
    CachedLocation,
    cached_snapshot,
    looks_like_repo_id,
    not_in_cache,
)

_URL = re.compile(
    r"^(?P<repo>[^/@]+/[^/@]+)(?:@(?P<revision>refs/(?:pr|convert)/[^/]+|[^/]+))?(?:/(?P<path>.*))?$"
)
_REPO_TYPES = ("datasets", "spaces", "buckets")


def hub_location(text: str) -> Location:
    """The location that ``hf://...`` names: on the Hub, or in the cache when offline.

    Raises:
        ArgumentError: the URL names no ``org/name`` repository.
        UnsupportedError: a dataset, Space or bucket (suture reads model repositories).
        CheckpointNotFoundError: offline, and the cache has no snapshot of it.
    """
    rest = text.split("://", 1)[1]
    first = rest.split("/", 1)[0]
    if first in _REPO_TYPES:
        raise UnsupportedError(
            f"{text!r} names a Hub {first[:-1]}; suture reads model repositories "
            f"(hf://ORG/NAME[@REVISION][/PATH]). Download it and pass the local folder."
        )
    match = _URL.match(rest)
    if match is None or not looks_like_repo_id(match.group("repo")):
        raise ArgumentError(
            f"{text!r} names no Hub model. Write it as hf://ORG/NAME, hf://ORG/NAME@REVISION "
            f"or hf://ORG/NAME/PATH/IN/REPO."
        )
    repo_id, revision = match.group("repo"), match.group("revision")
    path = (match.group("path") or "").strip("/")
    if path and any(part in ("", ".", "..") for part in path.split("/")):
        raise ArgumentError(f"{text!r}: a path in a repository has no '', '.' or '..' parts.")
    if is_offline():
        return _from_cache(text, repo_id, revision or DEFAULT_REVISION, path)
    repo = _repo(repo_id, revision)
    snapshot = repo.fallback or _unreachable_but_cached(repo)
    if snapshot is not None:
        return _in_snapshot(CachedLocation(snapshot, repo_id), path)
    return HubLocation(repo, path)


def _unreachable_but_cached(repo: _Repo) -> Path | None:
    """The cached snapshot of `repo` when the Hub cannot be reached (no network, a refused
    connection) and the cache holds one, with one warning; else None (the Hub is asked
    once here only when the cache could answer, as huggingface_hub falls back offline)."""
    revision = repo.revision or DEFAULT_REVISION
    snapshot = cached_snapshot(repo.repo_id, revision)
    if snapshot is None or repo.commit_id is not None:
        return None
    try:
        repo.commit()
        return None
    except SurgeryError as error:
        cause = error.__context__
        if not _is_network_error(cause):
            raise
    repo.fallback = snapshot
    warnings.warn(
        f"{repo.endpoint} cannot be reached ({type(cause).__name__}: {_clean(str(cause))}): "
        f"reading 'hf://{repo.repo_id}@{revision}' from the local Hugging Face cache, at "
        f"commit {snapshot.name}, as huggingface_hub does offline. Set HF_HUB_OFFLINE=1 to "
        f"read the cache without asking the Hub.",
        SutureWarning,
        stacklevel=3,
    )
    return snapshot


def _is_network_error(error: BaseException | None) -> bool:
    """Whether `error` (or what caused it) is a failure to reach the server: a name that
    does not resolve, a refused or timed-out connection (httpx's ConnectError, ...)."""
    seen = 0
    while error is not None and seen < 8:
        names = {kind.__name__ for kind in type(error).__mro__}
        if isinstance(error, (OSError, TimeoutError)) or names & _NETWORK_ERRORS:
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


_NETWORK_ERRORS = {"TransportError", "ConnectionError", "Timeout", "OfflineModeIsEnabled"}


def _in_snapshot(location: CachedLocation, path: str) -> CachedLocation:
    for part in path.split("/") if path else ():
        location = location / part
    return location


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as set now, or as huggingface_hub read it."""
    setting = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    if setting.strip().upper() in ("1", "ON", "YES", "TRUE"):
        return True
    constants = sys.modules.get("huggingface_hub.constants")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _from_cache(text: str, repo_id: str, revision: str, path: str) -> LocalLocation:
    snapshot = cached_snapshot(repo_id, revision)
    if snapshot is None:
        why = f"HF_HUB_OFFLINE is set, so {text!r} was looked up in the cache only"
        raise not_in_cache(repo_id, revision, why)
    return _in_snapshot(CachedLocation(snapshot, repo_id), path)


@dataclass
class _Repo:
    """One repository at one revision, on one endpoint: its commit and folder listings."""

    repo_id: str
    revision: str | None
    endpoint: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    commit_id: str | None = None
    listings: dict[str, dict[str, int | None]] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)  # path: its CDN address
    fallback: Path | None = None  # the cached snapshot read since the Hub was unreachable

    def api(self) -> Any:
        hf = _huggingface_hub()
        return hf.HfApi(endpoint=self.endpoint)

    def commit(self) -> str:
        """The commit the revision names, asked once."""
        with self.lock:
            if self.commit_id is None:
                try:
                    info = self.api().repo_info(self.repo_id, revision=self.revision)
                except Exception as error:  # noqa: BLE001 (huggingface_hub's and httpx's errors)
                    where = f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")
                    raise _hub_error(self, where, error) from None
                self.commit_id = info.sha
            return self.commit_id

    def listing(self, folder: str) -> dict[str, int | None]:
        """``{name: size}`` of a folder's files, ``{name: None}`` for its subfolders; {} if absent."""
        commit = self.commit()
        with self.lock:
            known = self.listings.get(folder)
        if known is not None:
            return known
        hf = _huggingface_hub()
        entries: dict[str, int | None] = {}
        try:
            for entry in self.api().list_repo_tree(
                self.repo_id, path_in_repo=folder or None, revision=commit
            ):
                name = entry.path.rsplit("/", 1)[-1]
                entries[name] = entry.size if isinstance(entry, hf.hf_api.RepoFile) else None
        except Exception as error:  # noqa: BLE001 (huggingface_hub's and httpx's errors)
            if not _is_missing_entry(error):
                where = f"hf://{self.repo_id}/{folder}".rstrip("/")
                raise _hub_error(self, where, error) from None
        with self.lock:
            self.listings[folder] = entries
        return entries


PIN_SECONDS = 300.0
_repos: dict[tuple[str, str, str | None], tuple[float, _Repo]] = {}
_repos_lock = threading.Lock()


def _repo(repo_id: str, revision: str | None) -> _Repo:
    """The `_Repo` shared by the URLs of one endpoint, id and revision named within
    `PIN_SECONDS` of the first (Locations made from it keep its commit for good)."""
    endpoint = _endpoint()
    key = (endpoint, repo_id, revision)
    now = time.monotonic()
    with _repos_lock:
        made, repo = _repos.get(key, (0.0, None))
        if repo is None or now - made > PIN_SECONDS:
            made, repo = now, _Repo(repo_id, revision, endpoint)
            _repos[key] = (made, repo)
        return repo


def _endpoint() -> str:
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        constants = sys.modules.get("huggingface_hub.constants")
        endpoint = getattr(constants, "ENDPOINT", None) or "https://huggingface.co"
    return endpoint.rstrip("/")


class HubLocation(Location):
    """A file or folder of a Hub model repository, read at one commit (see the module)."""

    is_remote = True

    def __init__(self, repo: _Repo, path: str) -> None:
        self.repo, self.path = repo, path

    def __str__(self) -> str:
        at = f"@{self.repo.revision}" if self.repo.revision else ""
        return f"hf://{self.repo.repo_id}{at}" + (f"/{self.path}" if self.path else "")

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1] if self.path else self.repo.repo_id.split("/")[1]

    @property
    def parent(self) -> HubLocation:
        return HubLocation(self.repo, self.path.rpartition("/")[0])

    def __truediv__(self, name: str) -> HubLocation:
        name = name.strip("/")
        return HubLocation(self.repo, f"{self.path}/{name}" if self.path else name)

    def resolve(self) -> HubLocation:
        return self

    # --- reading ------------------------------------------------------------------------
    def _entry(self) -> tuple[bool, int | None]:
        """(exists, size): size None for a folder."""
        if not self.path:
            self.repo.commit()  # raises for a repository or revision that is not there
            return True, None
        folder, _, name = self.path.rpartition("/")
        listing = self.repo.listing(folder)
        return name in listing, listing.get(name)

    def is_file(self) -> bool:
        exists, size = self._entry()
        return exists and size is not None

    def is_dir(self) -> bool:
        exists, size = self._entry()
        return exists and size is None

    def children(self) -> list[str]:
        return sorted(self.repo.listing(self.path))

    def subfolders(self) -> list[str]:
        return sorted(name for name, size in self.repo.listing(self.path).items() if size is None)

    def size(self) -> int:
        exists, size = self._entry()
        if not exists or size is None:
            raise CheckpointNotFoundError(f"No such file: {str(self)!r}. Check the path.")
        return size

    def read_bytes(self, limit: int | None = None, what: str = "") -> bytes:
        size = self.size()
        if limit is not None and size > limit:
            raise too_large(self, limit, what)
        return bytes(self.read_range(0, size, what))

    def read_head(self, count: int) -> bytes:
        return bytes(self.read_range(0, min(count, self.size())))

    def read_range(self, offset: int, count: int, what: str = "") -> np.ndarray:
        buffer = aligned_empty((count,), np.dtype(np.uint8))
        self.read_into(offset, buffer, what)
        return buffer

    def read_into(self, offset: int, into: np.ndarray, what: str = "") -> None:
        count = into.nbytes
        if not count:
            return
        view = memoryview(into.reshape(-1).view(np.uint8))
        redirect = self.repo.redirects.get(self.path)
        try:
            try:
                done = self._fetch(redirect or self.url(), offset, view, what, redirect is not None)
            except _StaleRedirect:  # a signed CDN address that expired: ask the Hub again
                self.repo.redirects.pop(self.path, None)
                done = self._fetch(self.url(), offset, view, what, False)
        except SurgeryError:
            raise
        except Exception as error:  # noqa: BLE001 (huggingface_hub's and httpx's errors)
            if _is_missing_entry(error):
                raise CheckpointNotFoundError(
                    f"No such file: {str(self)!r}. Check the path."
                ) from None
            raise _hub_error(self.repo, str(self), error) from None
        if done != count:
            raise short_read(self, what, count, offset, done)
        record_read(count)

    def _fetch(self, url: str, offset: int, view: memoryview, what: str, redirected: bool) -> int:
        """One ranged GET of ``len(view)`` bytes into `view`; returns the bytes received.

        The Hub answers large files with a redirect to its CDN (another host, which gets no
        token); that address is kept, so later reads of the file skip the Hub.
        """
        hf = _huggingface_hub()
        count = len(view)
        headers = {} if redirected else hf.utils.build_hf_headers()
        headers["Range"] = f"bytes={offset}-{offset + count - 1}"
        headers["Accept-Encoding"] = "identity"
        done = 0
        with hf.utils.http_stream_backoff(
            "GET", url, headers=headers, timeout=hf.constants.HF_HUB_DOWNLOAD_TIMEOUT
        ) as response:
            if redirected and response.status_code in (401, 403, 404, 410):
                raise _StaleRedirect
            if response.status_code == 416:
                raise short_read(self, what, count, offset, None)
            hf.utils.hf_raise_for_status(response)
            if response.status_code != 206 and not (offset == 0 and _length(response) == count):
                raise UnsupportedError(
                    f"{self.repo.endpoint} answered a ranged read of {str(self)!r} with "
                    f"HTTP {response.status_code} instead of 206: it does not serve byte "
                    f"ranges, so suture would download the whole file for every slice. Use "
                    f"a Hub that does (HF_ENDPOINT), or download the model first."
                )
            final = str(response.url)
            if not redirected and _origin(final) != _origin(url):
                self.repo.redirects[self.path] = final
            for chunk in response.iter_bytes(1 << 20):
                take = min(len(chunk), count - done)
                view[done : done + take] = chunk[:take]
                done += take
                if done == count:
                    break
        return done

    def url(self) -> str:
        """The file's ``resolve`` URL at the pinned commit."""
        return (
            f"{self.repo.endpoint}/{self.repo.repo_id}/resolve/{self.repo.commit()}/"
            f"{quote(self.path)}"
        )

    def open_reader(self) -> Any:
        return io.BufferedReader(RangeReader(self), buffer_size=1 << 16)

    def kvstore_spec(self) -> dict[str, Any]:
        raise UnsupportedError(
            f"{str(self)!r} is an Orbax checkpoint on the Hub, which suture reads only from a "
            f"local folder or a bucket. Download it first (`hf download {self.repo.repo_id}`) "
            f"and pass the local folder."
        )

    # --- writing ------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        self.require_writable()

    def remove(self) -> None:
        self.require_writable()

    def require_writable(self) -> None:
        raise DestinationError(
            f"Cannot write {str(self)!r}: suture reads the Hugging Face Hub but does not push "
            f"to it. Write a local folder, then upload it (`hf upload`)."
        )


class _StaleRedirect(Exception):
    """A kept CDN address no longer serves the file."""


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _huggingface_hub() -> Any:
    try:
        import huggingface_hub  # heavy: loaded on first use, not at import
        import huggingface_hub.hf_api  # noqa: F401 (RepoFile)
        import huggingface_hub.utils  # noqa: F401
    except ImportError:
        raise UnsupportedError(
            "Reading hf:// URLs needs the huggingface_hub package: pip install huggingface_hub."
        ) from None
    if not hasattr(huggingface_hub.utils, "http_stream_backoff"):  # before 1.0 (requests)
        raise UnsupportedError(
            f"Reading hf:// URLs needs huggingface_hub 1.0 or newer; this is "
            f"{huggingface_hub.__version__}. Upgrade it (pip install -U huggingface_hub), or "
            f"download the model (hf download ORG/NAME) and pass its id or folder."
        )
    return huggingface_hub


def _length(response: Any) -> int | None:
    try:
        return int(response.headers.get("Content-Length", ""))
    except ValueError:
        return None


def _is_missing_entry(error: BaseException) -> bool:
    errors = sys.modules.get("huggingface_hub.errors")
    return errors is not None and isinstance(error, errors.EntryNotFoundError)


def _hub_error(repo: _Repo, where: str, error: BaseException) -> SurgeryError:
    """A SurgeryError saying what the Hub answered and what to do (no token in it)."""
    errors = _huggingface_hub().errors
    at = f" at revision {repo.revision!r}" if repo.revision else ""
    if isinstance(error, errors.GatedRepoError):
        return SurgeryError(
            f"{where!r}: {repo.repo_id!r} is a gated model on {repo.endpoint}, and the token "
            f"sent does not have access to it. Accept its terms on the Hub, then set HF_TOKEN "
            f"(or run `hf auth login`)."
        )
    if isinstance(error, errors.RepositoryNotFoundError):
        return CheckpointNotFoundError(
            f"{where!r}: {repo.endpoint} has no model {repo.repo_id!r} that this token can see. "
            f"Check the name; for a private model set HF_TOKEN (or run `hf auth login`)."
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return CheckpointNotFoundError(
            f"{where!r}: the model {repo.repo_id!r} on {repo.endpoint} has no revision "
            f"{repo.revision!r}. Check the branch, tag or commit after '@'."
        )
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return SurgeryError(
            f"{where!r}: {repo.endpoint} refused the request (HTTP {status}). Set HF_TOKEN to a "
            f"token that can read {repo.repo_id!r} (or run `hf auth login`)."
        )
    what = f"HTTP {status}" if status else type(error).__name__
    return SurgeryError(
        f"Cannot read {where!r}{at} from {repo.endpoint}: {what}: {_clean(str(error))}. Check "
        f"the network, HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to read the local cache."
    )


def _clean(text: str) -> str:
    """The first line of a message, without anything that looks like a token."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = re.sub(r"hf_[A-Za-z0-9]{8,}", "hf_<hidden>", line)
    return re.sub(r"(?i)(bearer|token|authorization)([=: ]+)\S+", r"\1\2<hidden>", line)[:300]
