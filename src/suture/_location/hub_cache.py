"""Models in the local Hugging Face cache, named by repository id (``org/name``).

``huggingface_hub`` keeps each downloaded repository under the cache folder as
``models--ORG--NAME/snapshots/COMMIT/...`` (files there are links into ``blobs/``) and each
branch or tag as ``refs/BRANCH`` (a file holding the commit). A bare ``org/name`` that is
not a local path opens the snapshot its ``main`` ref names, offline: nothing is downloaded
and no server is asked. The cache folder is found at each call as ``huggingface_hub`` finds
it: ``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else ``HF_HOME/hub``, else
``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.

Example:
    >>> looks_like_repo_id("meta-llama/Llama-3.1-8B"), looks_like_repo_id("./runs/ckpt")
    (True, False)
    >>> looks_like_repo_id("/abs/path"), looks_like_repo_id("a/b/c")
    (False, False)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .._errors import CheckpointNotFoundError, CorruptCheckpointError, DestinationError
from .base import LocalLocation

DEFAULT_REVISION = "main"
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
REF_BYTES = 256  # read of a ref file at most: a commit is 40 hex digits


def looks_like_repo_id(text: str) -> bool:
    """Whether `text` has the shape of a Hub model id: ``org/name``, no ``..`` nor ``--``."""
    return bool(_REPO_ID.match(text)) and ".." not in text and "--" not in text


def cache_folder() -> Path:
    """The Hugging Face hub cache folder, from the environment as it is now."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.path.expandvars(os.environ[variable])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.expandvars(cache)).expanduser() / "huggingface" / "hub"


def repo_folder(repo_id: str) -> Path:
    """Where the cache keeps `repo_id`: ``CACHE/models--ORG--NAME``."""
    return cache_folder() / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, revision: str = DEFAULT_REVISION) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision` (a branch, tag or commit), or None."""
    storage = repo_folder(repo_id)
    commit = revision if _COMMIT.match(revision) else None
    if commit is None:
        ref = storage / "refs" / revision
        if ".." in Path(revision).parts or not ref.is_file():
            return None
        commit = _read_ref(ref, repo_id, revision)
    snapshot = storage / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _read_ref(ref: Path, repo_id: str, revision: str) -> str:
    """The commit a cache's ref file names: 40 hex digits (and a line end), read no further.

    Raises:
        CorruptCheckpointError: the file holds anything else (it is damaged, or not the
            cache's).
    """
    with open(ref, "rb") as stream:
        head = stream.read(REF_BYTES + 1)
    text = head[:REF_BYTES].decode("utf-8", "replace").strip()
    if len(head) <= REF_BYTES and _COMMIT.match(text):
        return text
    found = f"more than {REF_BYTES} bytes" if len(head) > REF_BYTES else f"{text[:60]!r}"
    raise CorruptCheckpointError(
        f"The Hugging Face cache's ref {str(ref)!r} (revision {revision!r} of {repo_id!r}) "
        f"should hold a commit (40 hex digits) but holds {found}. The cache is damaged: "
        f"delete that file and download the model again (`hf download {repo_id}`)."
    )


class CachedLocation(LocalLocation):
    """A file or folder of a cached snapshot: read like any local path, never written.

    `name` is what the user typed (``org/name``), kept for messages.
    """

    def __init__(self, path: Path, name: str) -> None:
        super().__init__(path)
        self.repo_name = name

    def __truediv__(self, name: str) -> CachedLocation:
        return CachedLocation(self.path / name, f"{self.repo_name}/{name}")

    def require_writable(self) -> None:
        raise DestinationError(
            f"{self.repo_name!r} names the model {self.repo_name!r} in the Hugging Face cache "
            f"({str(self.path)!r}), which suture does not write. To write a local folder of "
            f"that name, write './{self.repo_name}'."
        )


def split_revision(text: str) -> tuple[str, str] | None:
    """``(org/name, revision)`` of a bare cached id, ``org/name`` or ``org/name@REV``
    (``main`` when no ``@``), else None.

    Example:
        >>> split_revision("org/model@v1.0"), split_revision("org/model")
        (('org/model', 'v1.0'), ('org/model', 'main'))
    """
    repo_id, at, revision = text.partition("@")
    if not looks_like_repo_id(repo_id) or (at and not _REVISION.match(revision)):
        return None
    return repo_id, revision or DEFAULT_REVISION


_REVISION = re.compile(r"^(?:refs/(?:pr|convert)/)?[A-Za-z0-9._-]{1,200}$")


def cached_location(text: str) -> LocalLocation | None:
    """The cached snapshot that `text` (``org/name[@REV]``, not a local path) names, else None."""
    named = split_revision(text)
    if named is None or Path(text).exists():
        return None
    snapshot = cached_snapshot(*named)
    return CachedLocation(snapshot, text) if snapshot is not None else None


def missing_repo_error(text: str) -> CheckpointNotFoundError | None:
    """For `text` shaped ``org/name[@REV]`` that is neither a local path nor cached: the
    error saying where suture looked, and how to fetch the model; None for other paths."""
    named = split_revision(text)
    if named is None or Path(text).exists():
        return None
    repo_id, revision = named
    at = "" if revision == DEFAULT_REVISION else f" at revision {revision!r}"
    return CheckpointNotFoundError(
        f"No such file or folder: {text!r}, and no Hugging Face model of that id{at} in the "
        f"cache {str(cache_folder())!r} (looked for {str(repo_folder(repo_id))!r}). Check the "
        f"path; for a model on the Hub, download it first (`{download_command(repo_id, revision)}`), "
        f"read it as 'hf://{text}', or set HF_HUB_CACHE to the cache that holds it."
    )


def download_command(repo_id: str, revision: str = DEFAULT_REVISION) -> str:
    """The ``hf download`` command that puts `repo_id` at `revision` in the cache."""
    at = "" if revision == DEFAULT_REVISION else f" --revision {revision}"
    return f"hf download {repo_id}{at}"


def not_in_cache(repo_id: str, revision: str, why: str) -> CheckpointNotFoundError:
    """The error for `repo_id` at `revision` missing from the cache; `why` it was looked up."""
    at = "" if revision == DEFAULT_REVISION else f" at revision {revision!r}"
    return CheckpointNotFoundError(
        f"{why}, and the Hugging Face cache ({str(cache_folder())!r}) holds no snapshot of "
        f"{repo_id!r}{at} (looked for {str(repo_folder(repo_id))!r}). Download it first "
        f"(`{download_command(repo_id, revision)}`), or set HF_HUB_CACHE to the cache that "
        f"holds it."
    )


def trusted_cache_link(folder: Path, name: str) -> Path | None:
    """The blob that `folder / name` links to when `folder` is a cached snapshot (or a
    folder in one) and the link stays in that repository's ``blobs/``; else None.

    Snapshot files are links by design; a link anywhere else is not followed.
    """
    parts = folder.parts
    if "snapshots" not in parts:
        return None
    at = len(parts) - 1 - parts[::-1].index("snapshots")
    storage = Path(*parts[:at])
    if not storage.name.startswith(("models--", "datasets--")) or at + 1 >= len(parts):
        return None
    blobs = storage / "blobs"
    if blobs.is_symlink() or not blobs.is_dir():
        return None
    target = Path(os.path.realpath(folder / name))
    if target.parent != Path(os.path.realpath(blobs)) or not target.is_file():
        return None
    return target
