"""What went wrong with one request, in words a person reads: a pure function of the exception.

An attempt that got no answer is recorded with an error type and one line of text (the JobDB's
``error``, shown by ``exactly deliveries`` and ``exactly trace``). The director's client
(:mod:`exactly.delivery.client`) raises its kinds of :class:`~exactly.delivery.client.RequestFailed`
and passes the resolver's, TLS's and the socket's own errors inside them, whose texts are
written for developers (``[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)``);
:func:`failure` says instead what happened and where:

=================  =========================================================================
error type         text
=================  =========================================================================
``timeout``        no answer within N s
``disconnected``   connection closed before the status line (by HOST:PORT)
``refused``        connection refused by HOST:PORT
``reset``          connection reset by HOST:PORT
``tls``            TLS handshake failed with HOST:PORT: why (a plain HTTP port, say)
``certificate``    TLS certificate of HOST:PORT not accepted: why
``dns``            cannot resolve HOST: why
``connect``        cannot connect to HOST:PORT: why (unreachable network, ...)
``malformed``      malformed answer from HOST:PORT: what the parser found
``cut-short``      the answer's body was cut short: why
``request``        request could not be built: why (a header with a line break, ...)
=================  =========================================================================

The text is one line of at most :data:`LIMIT` characters and never holds the URL's user info or a
secret query option (:func:`exactly.urls.scrub`).
"""

from __future__ import annotations

import re
import ssl

from yarl import URL

from exactly.delivery.client import ConnectFailed, CutShort, Disconnected, Malformed
from exactly.urls import is_reference, is_secret_option, scrub

LIMIT = 300
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://(?P<info>[^/?#]*)@")


def failure(error: BaseException, *, timeout: float, url: str | None = None) -> tuple[str, str]:
    """``(error type, one line of text)`` for an exception raised while one request to ``url``
    was built, sent or its answer read. ``timeout`` is the request's, in seconds."""
    where = _where(error, url)
    kind, text = _describe(error, timeout=timeout, where=where, url=url)
    return kind, _one_line(text, url)


def _describe(
    error: BaseException, *, timeout: float, where: str, url: str | None
) -> tuple[str, str]:
    at = f" {where}" if where else ""
    if isinstance(error, TimeoutError):  # the sender's timeout, from when the request left
        return "timeout", f"no answer within {timeout:g} s"
    if isinstance(error, ConnectFailed):
        return _not_connected(error.os_error, dns=error.dns, at=at, where=where, url=url)
    if isinstance(error, Disconnected):
        return "disconnected", "connection closed before the status line" + (
            f" (by {where})" if where else ""
        )
    if isinstance(error, Malformed):
        return "malformed", f"malformed answer from{at}: {error}"
    if isinstance(error, CutShort):
        return "cut-short", f"the answer's body was cut short: {error}"
    if isinstance(error, ConnectionResetError):
        return "reset", f"connection reset by {where}" if where else "connection reset"
    if isinstance(error, OSError):
        return "connect", f"connection to{at} failed: {_reason(error)}"
    return "request", f"request could not be built: {type(error).__name__}: {_reason(error)}"


def _not_connected(
    cause: OSError, *, dns: bool, at: str, where: str, url: str | None
) -> tuple[str, str]:
    """What kept the client from connecting: the resolver's, TLS's or the socket's error."""
    if dns:
        return "dns", f"cannot resolve {where.rpartition(':')[0]}: {_reason(cause)}"
    if isinstance(cause, ssl.SSLCertVerificationError):
        reason = cause.verify_message or _reason(cause)
        return "certificate", f"TLS certificate of{at} not accepted: {reason}"
    if isinstance(cause, ssl.SSLError):
        reason = _reason(cause)
        if "wrong version number" in reason or "record layer failure" in reason:
            reason += " (does it speak plain HTTP? then use http://)"
        return "tls", f"TLS handshake failed with{at}: {reason}"
    if isinstance(cause, ConnectionRefusedError):
        return "refused", f"connection refused by {where}"
    if _https(url) and isinstance(cause, ConnectionResetError | ConnectionAbortedError):
        return "tls", f"TLS handshake failed with{at}: the connection was closed"
    return "connect", f"cannot connect to{at}: {_reason(cause)}"


def _where(error: BaseException, url: str | None) -> str:
    """``HOST:PORT`` the request went to: the error's, else the URL's (no user info)."""
    host, port = getattr(error, "host", None), getattr(error, "port", None)
    if not (isinstance(host, str) and host and isinstance(port, int)):
        if url is None:
            return ""
        try:
            parsed = URL(url)
        except ValueError:  # UnicodeError too: the URL itself is what failed
            return ""
        host, port = parsed.raw_host, parsed.port
        if not host:
            return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reason(error: BaseException | None) -> str:
    """An OS, TLS or library error's reason without its errno and file-position decoration."""
    if error is None:
        return "no reason given"
    if isinstance(error, ssl.SSLError) and error.reason:
        return error.reason.lower().replace("_", " ")
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error) or type(error).__name__
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", text)


def _https(url: str | None) -> bool:
    return url is not None and url.lower().startswith("https:")


def _secrets(url: str) -> list[str]:
    """What ``url`` holds that a message must not: its user info, secret options' values."""
    found = _USERINFO.match(url)
    secrets = [found["info"], *found["info"].split(":")] if found is not None else []
    for part in url.partition("?")[2].partition("#")[0].split("&"):
        name, _, value = part.partition("=")
        if value and is_secret_option(name) and not is_reference(value):
            secrets.append(value)
    return secrets


def _one_line(text: str, url: str | None) -> str:
    line = " ".join(scrub(text, _secrets(url) if url is not None else []).split())
    return line if len(line) <= LIMIT else line[: LIMIT - 1] + "…"
