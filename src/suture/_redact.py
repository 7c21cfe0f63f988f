"""URLs without their secrets, for every message, log line and metadata suture writes.

A URL can carry credentials in two places: its user info (``http://alice:PW@host/``) and
its query (a pre-signed ``?X-Amz-Signature=...``, ``?token=...``). Both are replaced by
``***`` wherever suture shows a URL; the scheme, host, path and query names stay, so the
message still says which file.

Example:
    >>> redact_url("https://alice:PW@host/a.safetensors?sig=abc&v=1")
    'https://***@host/a.safetensors?sig=***&v=***'
    >>> redact_text("Cannot access 'http://u:p@h/x': 404")
    "Cannot access 'http://***@h/x': 404"
"""

from __future__ import annotations

import re

HIDDEN = "***"

# A URL in free text: a scheme, then anything up to whitespace or a quote/bracket that
# closes it (messages quote URLs with repr, so ' and " end one).
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()\[\]{}`]+")
_USER_INFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/?#]*)@")
_QUERY_VALUE = re.compile(r"(?P<name>[?&;][^=&;#]*)=(?P<value>[^&;#]*)")


def redact_url(url: str) -> str:
    """`url` with its user info and every query value replaced by ``***``."""
    url = _USER_INFO.sub(lambda m: f"{m['scheme']}{HIDDEN}@", url, count=1)
    head, mark, query = url.partition("?")
    if not mark:
        return url
    return head + _QUERY_VALUE.sub(
        lambda m: f"{m['name']}={HIDDEN}" if m["value"] else m[0], mark + query
    )


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted (`redact_url`); text without ``://`` as it is."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda m: redact_url(m[0]), text)
