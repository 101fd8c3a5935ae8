"""Backend URLs as people may see them, and the secrets that URLs refer to.

A backend URL can hold credentials: a password in its user info (``postgresql://user:pw@host/db``,
``redis://:pw@host``) or in a query option (``kafka://host:9092?sasl.password=pw``). Every URL that
`exactly` prints, logs, embeds in an error or returns over HTTP goes through :func:`redact` first;
the real URL stays only where a client is configured from it.

So that a secret need not be written in the URL at all, a log option's value may name where it is
(:func:`resolve`): ``env:NAME`` is the environment variable ``NAME``, ``file:PATH`` the content of
the file ``PATH`` (without its trailing newline). They are resolved when the log is opened, in
each process that opens it, and are shown as written (they are not secret).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from exactly.errors import ConfigError

MASK = "***"
ENV_PREFIX, FILE_PREFIX = "env:", "file:"
# option names that hold a secret: librdkafka's sasl.password, ssl.key.password,
# ssl.keystore.password, ssl.key.pem, sasl.oauthbearer.client.secret, sasl.oauthbearer.config;
# libpq's password; and anything named like a token, key or credential
_SECRET_NAME = re.compile(
    r"pass|pwd|secret|token|credential|key|jaas|oauthbearer\.config|signature|sig$", re.IGNORECASE
)
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/?#]*)@")


def is_secret_option(name: str) -> bool:
    """Whether a URL option called ``name`` holds a secret (then it is masked when shown)."""
    return bool(_SECRET_NAME.search(name))


def is_reference(value: str) -> bool:
    """Whether ``value`` names where a secret is (``env:NAME``, ``file:PATH``), not a secret."""
    return value.startswith((ENV_PREFIX, FILE_PREFIX))


def redact(url: str) -> str:
    """``url`` with every secret masked: the user info's password and secret-named options.

    Everything else is kept as written, so the result still says which server and which options;
    ``env:``/``file:`` references are kept too. Text that is not a URL is masked the same way.
    """
    base, mark, query = url.partition("?")
    found = _USERINFO.match(base)
    if found is not None and ":" in found["info"]:
        user = found["info"].split(":", 1)[0]
        base = f"{found['scheme']}{user}:{MASK}@{base[found.end() :]}"
    if not mark:
        return base
    fragment = ""
    if "#" in query:
        query, fragment = query.split("#", 1)
        fragment = "#" + MASK  # a fragment is never needed to tell which server
    parts = []
    for part in query.split("&"):
        name, equals, value = part.partition("=")
        if equals and value and is_secret_option(name) and not is_reference(value):
            value = MASK
        parts.append(f"{name}{equals}{value}")
    return f"{base}?{'&'.join(parts)}{fragment}"


def resolve(name: str, value: str) -> str:
    """The value of option ``name``: ``value`` itself, or the secret an ``env:``/``file:`` names.

    Raises :class:`ConfigError` naming the option and the variable or file, never the secret.
    """
    if value.startswith(ENV_PREFIX):
        variable = value[len(ENV_PREFIX) :]
        found = os.environ.get(variable)
        if not variable or found is None:
            raise ConfigError(
                f"option {name} = {value}: the environment variable {variable!r} is not set "
                "(set it in every process that opens the log, Spark executors included)"
            )
        return found
    if value.startswith(FILE_PREFIX):
        path = Path(value[len(FILE_PREFIX) :]).expanduser()
        try:
            return path.read_text().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise ConfigError(
                f"option {name} = {value}: cannot read the file {path} ({why}); it must be "
                "readable by every process that opens the log, Spark executors included"
            ) from None
    return value


def embedded_path(url: str) -> Path | None:
    """The file or directory an embedded store's URL names (``sqlite://PATH``, ``file://DIR`` or
    a plain path), or None for a server's URL: what a reader checks before opening, since opening
    an embedded store creates it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return Path(url) if url else None
    return Path(rest) if scheme in ("sqlite", "file") and rest else None


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` masked: for messages that come from a client library."""
    # a secret of 1 to 3 characters would mask every such piece of the text, and guards little
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
