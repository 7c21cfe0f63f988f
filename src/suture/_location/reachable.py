"""Whether a remote endpoint can be reached at all, asked once before its driver is used.

TensorStore's drivers retry every failure of a connection as transient, so a host name that
does not resolve (offline, or a typo) took ten tries and about 97 s to fail. Those failures
are permanent: a name with no address, a refused connection, a network that is not there.
`check_reachable` asks them in a second or two (a DNS lookup, one TCP connection) and
raises `UnreachableError` at once; anything else (a slow answer, a timeout) is left to the
driver's retries, which transient failures deserve.

Example:
    >>> endpoint_of("https", "user:pw@example.com:8443")
    ('example.com', 8443)
    >>> endpoint_of("http", "127.0.0.1")
    ('127.0.0.1', 80)
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import urllib.parse
import urllib.request

from .._errors import SurgeryError

RETRIES_VARIABLE = "SUTURE_REMOTE_RETRIES"
DEFAULT_RETRIES = 10
CONNECT_SECONDS = 3.0  # a connection not made by then is left to the driver's retries
# errors of a connection that no retry would mend: no route, no network, refused
_PERMANENT = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}

_reached: set[tuple[str, int]] = set()
_lock = threading.Lock()


class UnreachableError(SurgeryError):
    """A remote endpoint that cannot be reached, for a reason no retry would mend."""


def remote_retries() -> int:
    """Times a transient remote failure is retried (``SUTURE_REMOTE_RETRIES``, 10 by default).

    Raises:
        SurgeryError: the variable is set to something other than a whole number >= 0.
    """
    text = os.environ.get(RETRIES_VARIABLE, "").strip()
    if not text:
        return DEFAULT_RETRIES
    if not text.isdigit():
        raise SurgeryError(
            f"{RETRIES_VARIABLE}={text!r} is not a number of retries. Set it to a whole "
            f"number (0 or more; the default is {DEFAULT_RETRIES}), or unset it."
        )
    return int(text)


def endpoint_of(scheme: str, host: str) -> tuple[str, int]:
    """The (host, port) that a request for ``scheme://host`` connects to first: a proxy
    that the environment names for it, the endpoint set for gs:// or s3://, or the host."""
    if scheme == "gs":
        url = os.environ.get("TENSORSTORE_GCS_HTTP_URL") or "https://storage.googleapis.com"
    elif scheme == "s3":
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        url = (
            os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or (f"https://s3.{region}.amazonaws.com" if region else "https://s3.amazonaws.com")
        )
    else:
        url = f"{scheme}://{host}"
    parts = urllib.parse.urlsplit(url)
    name = parts.hostname or ""
    proxy = urllib.request.getproxies_environment().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass_environment(name):
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        name = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: the driver says so
        port = None
    return name, port or (443 if parts.scheme == "https" else 80)


def check_reachable(scheme: str, host: str, shown: str) -> None:
    """Raises `UnreachableError` at once if ``scheme://host`` cannot be reached: its name
    does not resolve, or the connection is refused or has no route. Asked once per
    endpoint and process; a timeout passes (the driver retries it).

    `shown` is the location as the message names it (credentials hidden).
    """
    name, port = endpoint_of(scheme, host)
    if not name:
        return
    with _lock:
        if (name, port) in _reached:
            return
    try:
        addresses = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise UnreachableError(
            f"Cannot reach {shown}: the host name {name!r} does not resolve ({_reason(error)}): "
            f"offline, or a typo in the name. {_permanent_note()}"
        ) from None
    refused: OSError | None = None
    for family, kind, protocol, _, address in addresses:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.settimeout(CONNECT_SECONDS)
                probe.connect(address)
        except TimeoutError:
            refused = None
            break  # slow, not refused: the driver's retries decide
        except OSError as error:
            if error.errno not in _PERMANENT:
                refused = None
                break
            refused = error
            continue
        refused = None
        break
    if refused is not None:
        raise UnreachableError(
            f"Cannot reach {shown}: {name}:{port} refused the connection "
            f"({os.strerror(refused.errno or 0)}): no server listens there, or the network "
            f"is down. Check the address and that the server runs. {_permanent_note()}"
        ) from None
    with _lock:
        _reached.add((name, port))


def forget_reached() -> None:
    """Forgets which endpoints were reached: the next request asks again."""
    with _lock:
        _reached.clear()


def _reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _permanent_note() -> str:
    """What the message says of retries: not for this, but for what is transient."""
    from .remote import TIMEOUT_VARIABLE, remote_timeout  # remote imports this module

    return (
        f"suture gives up at once on this, without retrying; transient failures (a timeout, "
        f"a dropped connection, a 5xx answer) are retried {RETRIES_VARIABLE} times (now "
        f"{remote_retries()}) within {TIMEOUT_VARIABLE} seconds (now {remote_timeout():g})."
    )
