"""Text for people within 80 columns: counts with thousands separators, long values on lines of
their own, paths inside the data dir relative to it.

Plain functions, used by the CLI (:mod:`exactly.cli.output` adds its tables) and by the stages
that describe themselves (``status``, the audit, the demo).
"""

from __future__ import annotations

from pathlib import Path

from exactly.urls import embedded_path, redact

__all__ = ["WIDTH", "count", "fit", "place", "wrap"]

WIDTH = 80


def count(number: int) -> str:
    """A count as every command shows one: ``2,000``."""
    return f"{number:,}"


def fit(head: str, value: str, indent: str = "  ") -> str:
    """``head value`` on one line when it fits :data:`WIDTH`, else ``value`` on its own line."""
    line = f"{head} {value}"
    return line if len(line) <= WIDTH else f"{head}\n{indent}{value}"


def wrap(text: str, indent: str = "  ") -> str:
    """``text`` broken between words into lines of :data:`WIDTH`, the later ones indented."""
    import textwrap

    return textwrap.fill(
        text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def place(url: str, data_dir: Path) -> str:
    """Where a store is, for people: an embedded one (``sqlite://PATH``, ``rocksdb://PATH``, a
    plain path) as its scheme and its path relative to the data dir (``sqlite log``), a server's
    URL with its password masked."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "file", url
    if not rest.startswith("/") and embedded_path(url) is None:
        return redact(url)
    path = Path(rest).resolve()
    home = data_dir.resolve()
    return f"{scheme} {path.relative_to(home) if path.is_relative_to(home) else path}"
