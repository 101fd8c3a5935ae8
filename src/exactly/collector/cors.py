"""Cross-origin requests from browser pages: which origins may send, and the headers they need.

A page on another origin can send to the collector only if every answer says the page may read it
(``Access-Control-Allow-Origin``: without it on the POST's answer the browser hides the 200 and
the SDK sends again) and if the preflight ``OPTIONS`` that precedes a POST with
``Authorization`` is answered 204 with the method and headers allowed. A preflight carries no
write key, so it is judged by whether *any* source takes the origin; the request that follows is
judged by its own source's origins (403 ``origin_not_allowed`` otherwise).

An allowed origin is echoed back, with ``Access-Control-Allow-Credentials: true`` and
``Vary: Origin``, so credentialed requests (``sendBeacon``, ``fetch`` with
``credentials: "include"``) can read their answer too; the collector sets and reads no cookies,
so credentials give a page nothing it did not have. A request without ``Origin`` (not from a
browser page) gets ``*``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

Headers = tuple[tuple[bytes, bytes], ...]

ANY = "*"
MAX_AGE = b"7200"  # seconds; Chromium caps a cached preflight at 2 hours
ORIGIN = re.compile(r"(https?://[a-z0-9.\-\[\]:]+|null)")  # scheme://host[:port], lower case
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_HEADER_LIST = re.compile(_TOKEN + rb"(?:[ \t]*,[ \t]*" + _TOKEN + rb")*")
_MAX_REQUESTED = 1024
# what the SDKs send, for a preflight whose Access-Control-Request-Headers cannot be echoed
_DEFAULT_HEADERS = b"authorization, content-type, content-encoding, anonymousid, x-retry-count"
_EXPOSED = (b"access-control-expose-headers", b"retry-after")
_VARY = (b"vary", b"origin")


def normalise_origin(text: str) -> str:
    """``text`` as an origin to compare (``*``, ``null`` or ``scheme://host[:port]``, lower
    case, no trailing slash); :class:`ValueError` naming the mistake."""
    origin = text.strip().lower().rstrip("/")
    if origin == ANY or ORIGIN.fullmatch(origin):
        return origin
    raise ValueError(
        f"{text!r} is not an origin: use * or scheme://host[:port], e.g. https://shop.example"
    )


class Origins:
    """The page origins each source accepts; a source without a list accepts any."""

    def __init__(self, sources: Iterable[str], allowed: Mapping[str, Iterable[str]]) -> None:
        self._by_source: dict[str, frozenset[str] | None] = {}
        for name in sources:
            given = allowed.get(name)
            origins = None if given is None else frozenset(map(normalise_origin, given))
            self._by_source[name] = None if origins is None or ANY in origins else origins
        lists = list(self._by_source.values())
        self._anywhere = not lists or any(origins is None for origins in lists)
        self._union = frozenset().union(*(origins for origins in lists if origins is not None))

    def allows(self, source: str, origin: bytes | None) -> bool:
        """Whether a request of ``source`` from a page on ``origin`` is taken (no Origin: yes)."""
        if origin is None:
            return True
        origins = self._by_source.get(source)
        return origins is None or _text(origin) in origins

    def any_allows(self, origin: bytes | None) -> bool:
        """Whether some source takes ``origin``: a preflight, which has no write key, is
        answered for such origins only."""
        return origin is None or self._anywhere or _text(origin) in self._union


def _text(origin: bytes) -> str:
    return origin.decode("latin-1").lower().rstrip("/")


def response_headers(origin: bytes | None, allowed: bool) -> Headers:
    """The CORS headers of any answer: ``*`` without Origin, the origin echoed when allowed,
    none otherwise (the browser then keeps the answer from the page)."""
    if origin is None:
        return ((b"access-control-allow-origin", b"*"), _EXPOSED, _VARY)
    if not allowed:
        return (_VARY,)
    return (
        (b"access-control-allow-origin", origin),
        (b"access-control-allow-credentials", b"true"),
        _EXPOSED,
        _VARY,
    )


def preflight_headers(methods: bytes, requested: bytes | None, private_network: bool) -> Headers:
    """The headers a 204 answer to a preflight adds to :func:`response_headers`.

    The requested headers are echoed (``*`` would not cover ``Authorization``) when they are a
    plain list of header names; anything else gets the list the SDKs use.
    """
    headers = _DEFAULT_HEADERS
    if requested is not None and len(requested) <= _MAX_REQUESTED:
        stripped = requested.strip()
        if _HEADER_LIST.fullmatch(stripped):
            headers = stripped.lower()
    found: Headers = (
        (b"access-control-allow-methods", methods),
        (b"access-control-allow-headers", headers),
        (b"access-control-max-age", MAX_AGE),
    )
    if private_network:  # Chromium's Private Network Access: a public page, a private collector
        found += ((b"access-control-allow-private-network", b"true"),)
    return found
