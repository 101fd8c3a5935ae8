"""How the CLI lays out what it prints: 80 columns, counts with thousands separators.

Every command's text output fits an 80-column terminal, however wide the real one is: a long
value (a path, a URL, a query id) goes on its own line rather than stretching a line, paths
inside the data dir are shown relative to it, and tables are rendered at most :data:`WIDTH`
wide, wrapping a cell only between words.
"""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Column, Table

from exactly.urls import embedded_path, redact

__all__ = ["WIDTH", "console", "count", "fit", "place", "table", "wrap"]

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


def console(*, stderr: bool = False) -> Console:
    """A console never wider than :data:`WIDTH` (narrower if the terminal is)."""
    terminal = Console(stderr=stderr).width
    return Console(stderr=stderr, width=min(WIDTH, terminal), highlight=False)


def table(*columns: Column | str, show_footer: bool = False) -> Table:
    """A table without vertical rules: two spaces between columns, a rule under the header (and
    above the footer, a total), so that a few columns of counts and names fit in 80 without
    cutting a name."""
    return Table(
        *columns,
        show_footer=show_footer,
        box=box.SIMPLE,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
