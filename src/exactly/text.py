"""Text for people within 80 columns: counts with thousands separators, long values on lines of
their own, messages broken at their clauses, paths inside the data dir relative to it.

Plain functions, used by the CLI (:mod:`exactly.cli.output` adds its tables) and by the stages
that describe themselves (``status``, the audit, the demo).
"""

from __future__ import annotations

from pathlib import Path

from exactly.urls import embedded_path, redact

__all__ = ["WIDTH", "count", "fit", "message", "place", "wrap"]

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


def message(text: str, indent: str = "  ") -> str:
    """A message (an error, a notice) in lines of :data:`WIDTH`, nothing cut or dropped.

    A line that fits is left as it is. A longer one is broken at its clauses (after ``"; "``)
    where they fit, so that "what to do" (``create it with: exactly log create ...``) stays on
    a line of its own, and between words inside a clause that does not; the later lines are
    indented by ``indent`` under the line's own indentation. A word longer than a line (a path,
    a URL) goes on a line of its own, whole.
    """
    return "\n".join(_message_line(line, indent) for line in text.splitlines() or [""])


def _message_line(line: str, indent: str) -> str:
    import textwrap

    if len(line) <= WIDTH:
        return line
    body = line.lstrip(" ")
    first, later = line[: len(line) - len(body)], line[: len(line) - len(body)] + indent
    clauses = [part + ";" for part in body.split("; ")]
    clauses[-1] = clauses[-1][:-1]
    done: list[str] = []
    current = ""
    for clause in clauses:
        if current and len(f"{current} {clause}") <= WIDTH:
            current = f"{current} {clause}"
            continue
        if current:
            done.append(current)
        pieces = textwrap.wrap(
            clause,
            WIDTH,
            initial_indent=later if done else first,
            subsequent_indent=later,
            break_long_words=False,
            break_on_hyphens=False,
        )
        done += pieces[:-1]
        current = pieces[-1] if pieces else ""
    return "\n".join([*done, current])


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
