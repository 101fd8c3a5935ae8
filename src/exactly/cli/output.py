"""How the CLI lays out what it prints: 80 columns, counts with thousands separators (the plain
text helpers are :mod:`exactly.text`; tables and the console are here).

Every command's text output fits an 80-column terminal, however wide the real one is: a long
value (a path, a URL, a query id) goes on its own line rather than stretching a line, paths
inside the data dir are shown relative to it, and tables are rendered at most :data:`WIDTH`
wide, wrapping a cell only between words.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Column, Table

from exactly.text import WIDTH, count, fit, message, place, wrap

__all__ = ["WIDTH", "console", "count", "fit", "message", "place", "table", "wrap"]


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
