"""Where an HTTP server redirects a path, followed within its own host only.

TensorStore's http driver does not follow redirects: a plain file server answers a folder
named without its slash (``http://host/ckpt``) with ``301 -> /ckpt/``, and a moved file
with ``301``/``302``. `redirect_target` asks the server itself, one small request per
hop, and accepts a new path on the same scheme, host and port only: a redirect elsewhere
could hand the URL's credentials, or the reads, to a server the user never named.

Example:
    >>> redirect_target("http", "127.0.0.1:8000", "ckpt")  # doctest: +SKIP
    'ckpt/'
"""

from __future__ import annotations

import base64
import http.client
import urllib.parse
from http import HTTPStatus

from .._errors import SurgeryError
from .._redact import redact_url
from .http_body import key_of, url_path

REDIRECT_CODES = (301, 302, 303, 307, 308)
MAX_HOPS = 5


def redirect_target(scheme: str, host: str, key: str, timeout: float, method: str = "GET") -> str:
    """The key (path without its leading ``/``, decoded) that ``scheme://host/key``
    redirects to, asked with `method` (``HEAD``, or a ``GET`` of its first byte). Keys are
    names as they are, percent-encoded once in the request, as TensorStore's are.

    Raises:
        SurgeryError: a redirect to another scheme, host or port, a loop, or no answer.
    """
    user, _, netloc = host.rpartition("@")
    headers = (
        {"User-Agent": "suture"}
        if method == "HEAD"
        else {"Range": "bytes=0-0", "User-Agent": "suture"}
    )
    if user:  # credentials in the URL, sent as TensorStore's client would send them
        plain = urllib.parse.unquote(user).encode()
        headers["Authorization"] = "Basic " + base64.b64encode(plain).decode()
    path, shown = "/" + url_path(key), f"{scheme}://{host}/{url_path(key, shown=True)}"
    for _ in range(MAX_HOPS):
        status, location = _ask(scheme, netloc, path, headers, timeout, shown, method)
        if status not in REDIRECT_CODES:
            return key_of(path[1:])
        if not location:
            raise SurgeryError(
                f"{redact_url(shown)!r}: the server answered {_status(status)} without saying "
                f"where to (no Location header). Check the URL."
            )
        target = urllib.parse.urlsplit(urllib.parse.urljoin(f"{scheme}://{netloc}{path}", location))
        if target.scheme != scheme or target.netloc.rpartition("@")[2] != netloc:
            raise SurgeryError(
                f"{redact_url(shown)!r} redirects ({_status(status)}) to "
                f"{redact_url(urllib.parse.urlunsplit(target))!r}, on another "
                f"{'scheme' if target.scheme != scheme else 'host'}: suture follows redirects "
                f"within the same host only. Pass that URL itself if you trust it."
            )
        path = target.path + (f"?{target.query}" if target.query else "")
    raise SurgeryError(
        f"{redact_url(shown)!r} redirects more than {MAX_HOPS} times (a loop?). Check the URL "
        f"on the server."
    )


def _ask(
    scheme: str, netloc: str, path: str, headers: dict, timeout: float, shown: str, method: str
) -> tuple[int, str | None]:
    connection_type = (
        http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(netloc, timeout=timeout)
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Location")
    except (OSError, http.client.HTTPException) as error:
        raise SurgeryError(
            f"Cannot reach {redact_url(shown)!r} to follow its redirect: {error}. Check the "
            f"server and the network."
        ) from None
    finally:
        connection.close()


def describe_status(code: int) -> str:
    """What an HTTP status means for a read, in words (``404 Not Found: ...``)."""
    meaning = {
        301: "the server moved it elsewhere",
        302: "the server redirects it elsewhere",
        303: "the server redirects it elsewhere",
        307: "the server redirects it elsewhere",
        308: "the server moved it elsewhere",
        400: "the server did not understand the request; check the URL",
        401: (
            "the server wants credentials for it; put them in the URL "
            "(https://USER:TOKEN@host/...) if the server takes them so"
        ),
        403: (
            "the server refuses to serve it to this client (permissions, or an expired or "
            "wrong signature or token in the URL)"
        ),
        404: "there is no such file on the server; check the path",
        410: "the server says it was removed",
        416: "the server has fewer bytes than the read asked for",
        429: "the server refuses more requests for now; retry later",
    }.get(code)
    if meaning is None:
        meaning = (
            "the server failed to answer; retry later, or check the server"
            if code >= 500
            else "the server refused the request"
        )
    return f"{_status(code)}: {meaning}"


def _status(code: int) -> str:
    try:
        return f"HTTP {code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"HTTP {code}"
