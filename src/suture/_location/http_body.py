"""A whole small file over HTTP, its body decoded as it streams in and stopped at a cap.

TensorStore's HTTP client asks for compressed bodies (``Accept-Encoding: deflate, gzip, br,
zstd``) and inflates a whole answer in memory before handing it over: a few megabytes of
gzip that inflate to gigabytes took the process past 3 GiB before the size cap could see
them. Metadata (an index.json, Orbax's _METADATA) is read here instead, one GET, inflated a
piece at a time (at most `PIECE` bytes out of each step) and abandoned once more than the
cap has come out, compressed or not. Proxies (``http_proxy`` ...) are honoured as urllib
honours them; the URL's credentials are sent as TensorStore sends them (Basic).

Example:
    >>> fetch_capped("http", "127.0.0.1:8000", "ckpt/_METADATA", 1 << 20, 5.0)  # doctest: +SKIP
    Fetched(status=200, etag='"a1-2b"', body=b'{...}')
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterator

PIECE = 1 << 20  # bytes read off the socket, and inflated out of each step, at a time
ACCEPTED = "gzip, deflate"  # the encodings decoded here (the standard library's zlib)
RETRIED = (429, 500, 502, 503, 504)
RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0)


# what a URL path keeps as it is: TensorStore's http driver percent-encodes the rest of a key
PATH_SAFE = "/:@!$&'()*+,;="


def url_path(key: str, shown: bool = False) -> str:
    """`key` (a file's name on the server, as it is: a space, '%', '?' are part of it) as a
    URL path, percent-encoded once, as TensorStore sends a key; `shown`: a '?' left as it is,
    for messages, so that a query's values are still hidden (`suture._redact`).

    Example:
        >>> url_path("with space/100%?.json"), url_path("a?b=c", shown=True)
        ('with%20space/100%25%3F.json', 'a?b=c')
    """
    return urllib.parse.quote(key, safe=PATH_SAFE + ("?" if shown else ""))


def key_of(path: str) -> str:
    """The key a URL path names: percent-decoded once (``%25`` is a '%' in the name)."""
    return urllib.parse.unquote(path)


class BodyTooLarge(Exception):
    """The body (as sent, or decoded) holds more than the cap."""


class UnknownEncoding(Exception):
    """The server sent a ``Content-Encoding`` this module does not decode."""


@dataclasses.dataclass
class Fetched:
    """A server's answer: the status, and for a 200 the ETag and the decoded body; for a
    redirect the ``Location``."""

    status: int
    etag: str | None = None
    body: bytes | None = None
    location: str | None = None


def fetch_capped(
    scheme: str,
    host: str,
    key: str,
    cap: int,
    timeout: float,
    stall: float = 30.0,
    rate: float = 256 << 10,
) -> Fetched:
    """``GET scheme://host/key`` (``host`` may hold ``user:password@``), the body decoded.

    Transient failures (a dropped connection, 429, 5xx) are asked again after a pause, as
    long as `timeout` seconds (plus a second per `rate` bytes received) have not passed; a
    socket silent for `stall` seconds is a failure.

    Raises:
        BodyTooLarge: more than `cap` bytes sent, or decoded.
        UnknownEncoding: a ``Content-Encoding`` other than gzip or deflate.
        TimeoutError, OSError: no answer in time, or the server could not be reached.
    """
    user, _, netloc = host.rpartition("@")
    request = urllib.request.Request(f"{scheme}://{netloc}/{url_path(key)}", method="GET")
    request.add_header("Accept-Encoding", ACCEPTED)
    request.add_header("User-Agent", "suture")
    if user:
        plain = urllib.parse.unquote(user).encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(plain).decode())
    started = time.monotonic()
    for delay in (*RETRY_DELAYS, None):
        try:
            return _fetch_once(request, cap, started, timeout, min(stall, timeout), rate)
        except (TimeoutError, BodyTooLarge, UnknownEncoding):
            raise
        except urllib.error.HTTPError as error:  # a status other than 2xx (3xx included)
            error.close()
            if error.code not in RETRIED or delay is None:
                return Fetched(error.code, location=error.headers.get("Location"))
        except (OSError, http.client.HTTPException):
            if delay is None:
                raise
        if time.monotonic() + delay > started + timeout:
            raise TimeoutError(f"no answer within {timeout:g} s, retries included")
        time.sleep(delay)
    raise AssertionError("unreachable")  # the last delay is None: returned or raised above


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 3xx comes back as an HTTPError: the caller follows it (same host only)


def _opener(scheme: str) -> urllib.request.OpenerDirector:
    handlers: list = [_NoRedirects()]
    if scheme == "https":
        # the certificates TensorStore is told to trust, where set, else the system's
        bundle, folder = (
            os.environ.get("TENSORSTORE_CA_BUNDLE"),
            os.environ.get("TENSORSTORE_CA_PATH"),
        )
        context = ssl.create_default_context(cafile=bundle or None, capath=folder or None)
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def _fetch_once(
    request: urllib.request.Request,
    cap: int,
    started: float,
    timeout: float,
    stall: float,
    rate: float,
) -> Fetched:
    with _opener(request.type).open(request, timeout=stall) as response:
        length = response.headers.get("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > cap:
            raise BodyTooLarge  # refused before a byte of the body is read
        decode = _decoder(response.headers.get("Content-Encoding", ""))
        received = [0]

        def raw() -> Iterator[bytes]:
            while True:
                if time.monotonic() > started + timeout + received[0] / rate:
                    raise TimeoutError(f"the body did not arrive within {timeout:g} s")
                chunk = response.read1(PIECE)
                if not chunk:
                    return
                received[0] += len(chunk)
                if received[0] > cap:
                    raise BodyTooLarge
                yield chunk

        parts, total = [], 0
        for part in decode(raw()):
            total += len(part)
            if total > cap:
                raise BodyTooLarge  # stops inflating here: the rest is never decoded
            parts.append(part)
        return Fetched(response.status, response.headers.get("ETag"), b"".join(parts))


def _decoder(header: str) -> Callable[[Iterator[bytes]], Iterator[bytes]]:
    """The decoding of a ``Content-Encoding`` (a list: applied in order, undone in reverse)."""
    names = [name.strip().lower() for name in header.split(",") if name.strip()]
    names = [name for name in names if name != "identity"]
    for name in names:
        if name not in ("gzip", "x-gzip", "deflate"):
            raise UnknownEncoding(name)

    def decode(chunks: Iterator[bytes]) -> Iterator[bytes]:
        for name in reversed(names):
            chunks = _inflated(chunks, name)
        return chunks

    return decode


def _inflated(chunks: Iterator[bytes], name: str) -> Iterator[bytes]:
    """`chunks` inflated, at most `PIECE` bytes out of each step (gzip members one after
    another; deflate with or without its zlib header, as curl takes it)."""
    wbits = 16 + zlib.MAX_WBITS if name != "deflate" else zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    first = True
    for chunk in chunks:
        data = chunk
        while True:
            try:
                out = decoder.decompress(data, PIECE)
            except zlib.error:
                if not (first and name == "deflate"):
                    raise
                decoder, wbits = zlib.decompressobj(-zlib.MAX_WBITS), -zlib.MAX_WBITS  # raw
                first = False
                continue
            first = False
            data = decoder.unconsumed_tail
            if decoder.eof and decoder.unused_data:  # another gzip member follows
                data, decoder = decoder.unused_data, zlib.decompressobj(wbits)
            if out:
                yield out
            if not data and len(out) < PIECE:  # this chunk all inflated
                break
    if not first and not decoder.eof:
        raise zlib.error("the compressed body ends before its stream does")
