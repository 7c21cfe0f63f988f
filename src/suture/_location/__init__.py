"""Where checkpoint bytes live: a local path, a ``gs://``, ``s3://``, ``http(s)://`` or ``hf://`` URL.

Every source, sink and lock reaches checkpoint data through a `Location`; nothing else
touches `pathlib`/`os` for it. A `LocalLocation` keeps the fast local routes (``pread``,
``pwrite``, atomic rename); a `RemoteLocation` goes through TensorStore's kvstore drivers
(``gcs``, ``s3``, ``http``), the ones Orbax itself uses: ranged reads fetch only the bytes
asked for, many requests can be in flight, and the drivers retry transient errors.
Credentials come from wherever those drivers look (environment variables, the metadata
server, gcloud and AWS config files); suture never reads or prints them.

Endpoints for non-Google, non-AWS servers come from the standard variables:
``TENSORSTORE_GCS_HTTP_URL`` (read by TensorStore itself) for GCS, ``AWS_ENDPOINT_URL_S3``
or ``AWS_ENDPOINT_URL`` for S3 (with ``AWS_REGION``/``AWS_DEFAULT_REGION``).

Example:
    >>> location_of("gs://bucket/runs/ckpt").kvstore_spec()
    {'driver': 'gcs', 'bucket': 'bucket', 'path': 'runs/ckpt/'}
    >>> str(location_of("gs://bucket/runs/ckpt") / "_METADATA")
    'gs://bucket/runs/ckpt/_METADATA'
    >>> location_of("ftp://host/x")
    Traceback (most recent call last):
    ...
    suture._errors.UnsupportedError: 'ftp://host/x' uses the scheme 'ftp', which suture does not read or write. Supported: local paths, gs://, s3://, http://, https://, hf:// (http(s) and hf read-only).

The package: `base` (the `Location` interface, local paths), `remote` (object stores and
HTTP through TensorStore), `publish` (a writer's lock, temporary place and commit), `hub`
(``hf://`` model repositories through huggingface_hub) and `hub_cache` (a bare ``org/name``
that is not a local path, read from the local Hugging Face cache).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .._errors import ArgumentError, UnsupportedError
from .base import MAX_METADATA_BYTES, LocalLocation, Location, too_large
from .hub import hub_location
from .hub_cache import cached_location
from .remote import (
    WRITABLE_SCHEMES,
    RemoteLocation,
    head_ahead,
    metadata_read_once,
    probe_ahead,
    read_ahead,
    remote_context,
    wait,
)

__all__ = [
    "MAX_METADATA_BYTES",
    "REMOTE_SCHEMES",
    "WRITABLE_SCHEMES",
    "LocalLocation",
    "Location",
    "RemoteLocation",
    "head_ahead",
    "is_remote",
    "location_of",
    "metadata_read_once",
    "names_one_safetensors_file",
    "probe_ahead",
    "read_ahead",
    "remote_context",
    "too_large",
    "wait",
]

REMOTE_SCHEMES = ("gs", "s3", "http", "https")
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
_SUPPORTED_TEXT = "local paths, gs://, s3://, http://, https://, hf:// (http(s) and hf read-only)"


def location_of(path: Any) -> Location:
    """The `Location` for a path string, `os.PathLike` (``epath.Path`` included) or Location.

    Raises:
        UnsupportedError: the URL's scheme is not one suture reads.
    """
    if isinstance(path, Location):
        return path
    if isinstance(path, Path):
        return LocalLocation(path)
    text = path if isinstance(path, str) else str(path)  # epath.Path('gs://b/x') -> 'gs://b/x'
    match = _URL.match(text)
    if match is None:
        return cached_location(text) or LocalLocation(Path(text))
    scheme = match.group("scheme").lower()
    if scheme == "file":
        return LocalLocation(Path(match.group("rest")))
    if scheme == "hf":
        return hub_location(text)
    if scheme not in REMOTE_SCHEMES:
        raise UnsupportedError(
            f"{text!r} uses the scheme {scheme!r}, which suture does not read or write. "
            f"Supported: {_SUPPORTED_TEXT}."
        )
    host, _, key = match.group("rest").partition("/")
    if not host:
        raise ArgumentError(
            f"{text!r} names no bucket or host. Write it as {scheme}://BUCKET/PATH."
        )
    return RemoteLocation.from_url(scheme, host, key)


def names_one_safetensors_file(path: Any) -> bool:
    """Whether the output `path` (a path, URL or `Location`) names one safetensors file (its
    name ends in ``.safetensors``); any other name is a folder (Orbax, or a Hugging Face
    folder of shards).

    Example:
        >>> names_one_safetensors_file("out/model.safetensors"), names_one_safetensors_file("gs://b/ckpt")
        (True, False)
    """
    return str(path).rstrip("/").endswith(".safetensors")


def is_remote(path: Any) -> bool:
    """True for a URL of a remote store (``gs://``, ``s3://``, ``http(s)://``, ``hf://``)."""
    match = _URL.match(str(path)) if isinstance(path, (str, os.PathLike)) else None
    if match is not None and match.group("scheme").lower() == "hf":
        return True  # offline, read from the cache: still not a path relative to anything
    return location_of(path).is_remote
