"""The console's page: rendered on the server with the state of the moment, kept current by a
few lines of script (``page.html``) that poll ``/api/state``.

Every figure is an element with ``data-k`` (its path in the state document, ``totals.accepted``,
``destinations.0.queued``) and ``data-f`` (its format); the script sets each from the new
document with the same formats as :func:`show` here, so the page needs no template engine and no
library. Rows follow the configured stages and destinations, which do not change while ``up``
runs. The chart is drawn by the script from ``counts`` (an SVG of stacked bars).
"""

from __future__ import annotations

import html
import json
import time
from functools import cache
from importlib.resources import files
from typing import Any

from exactly.units import format_duration

EMPTY = "—"  # an empty cell: styled grey by the page (``.empty``)
FAVICON = (  # an inline SVG: served at /favicon.svg and linked, so no request ends in a 404
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" '
    'rx="3" fill="#1d2330"/><path d="M4 8.5l2.5 2.5L12 5" stroke="#43a868" stroke-width="2" '
    'fill="none"/></svg>'
)


def show(value: Any, form: str) -> str:
    """A value as the page shows it: ``n`` a count, ``r`` a rate, ``s`` an age in seconds,
    ``w`` a window in milliseconds, ``ms`` a latency in milliseconds, ``time`` a clock time
    (UTC, 24 h: the page's one clock), ``t`` text; a missing value is :data:`EMPTY` and a list
    its items."""
    if isinstance(value, list):
        return "; ".join(str(item) for item in value) or "none"
    if value is None or value == "":
        return EMPTY
    if form == "n":
        return f"{int(value):,}"
    if form == "r":
        return f"{float(value):,.0f}/s" if value >= 10 else f"{float(value):.1f}/s"
    if form == "s":
        return format_duration(int(float(value) * 1000))
    if form == "w":
        return format_duration(int(value))
    if form == "ms":
        return f"{float(value) / 1000:.1f} s" if value >= 1000 else f"{float(value):.0f} ms"
    if form == "time":
        return time.strftime("%H:%M:%S UTC", time.gmtime(float(value)))
    return str(value)


def figure(document: dict[str, Any], path: str, form: str, tag: str = "span") -> str:
    """An element showing the value at ``path`` (dotted) in ``document``."""
    value: Any = document
    for key in path.split("."):
        if isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        elif isinstance(value, dict):
            value = value.get(key)
        else:
            value = None
    text = html.escape(show(value, form))
    empty = ' class="empty"' if text == EMPTY else ""
    return (
        f'<{tag} data-k="{html.escape(path)}" data-f="{form}"{empty} title="{text}">{text}</{tag}>'
    )


def render(document: dict[str, Any]) -> str:
    """The whole page for ``document`` (a state from :class:`exactly.console.state.Reader`)."""
    parts = {
        "totals": _totals(document),
        "stages": _stages(document),
        "dedupe": _dedupe(document),
        "destinations": _destinations(document),
        "latency": _latency(document),
        "state": json.dumps(document).replace("<", "\\u003c"),
    }
    page = _template()
    for name, text in parts.items():
        page = page.replace(f"{{{{{name}}}}}", text)
    return page


@cache
def _template() -> str:
    return files("exactly.console").joinpath("page.html").read_text(encoding="utf-8")


def _card(label: str, inner: str) -> str:
    return f'<div class="card"><div class="label">{html.escape(label)}</div>{inner}</div>'


def _totals(document: dict[str, Any]) -> str:
    cards = [
        _card("accepted", figure(document, "totals.accepted", "n", "div")),
        _card("kept", figure(document, "totals.kept", "n", "div")),
        _card("duplicates dropped", figure(document, "totals.duplicates", "n", "div")),
        _card("rejected", figure(document, "totals.rejected", "n", "div")),
        _card("suppressed", figure(document, "totals.suppressed", "n", "div")),
        _card("counted", figure(document, "totals.counted", "n", "div")),
    ]
    for name in document["totals"].get("delivered", {}):
        path = f"totals.delivered.{name}"
        cards.append(_card(f"delivered → {name}", figure(document, path, "n", "div")))
    return "\n".join(cards)


def _latency(document: dict[str, Any]) -> str:
    cards = []
    for key, label in (("counted", "accepted → counted"), ("delivered", "accepted → delivered")):
        for share in ("p50", "p99"):
            path = f"latency.{key}.{share}_ms"
            cards.append(_card(f"{label} {share}", figure(document, path, "ms", "div")))
    return "\n".join(cards)


def _row(cells: list[str]) -> str:
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _stages(document: dict[str, Any]) -> str:
    rows = []
    for i, stage in enumerate(document["stages"]):
        at = f"stages.{i}"
        rows.append(
            _row(
                [
                    html.escape(stage["name"]),
                    html.escape(stage["part"]),
                    figure(document, f"{at}.state", "t"),
                    figure(document, f"{at}.done", "n"),
                    figure(document, f"{at}.per_second", "r"),
                    figure(document, f"{at}.lag", "n"),
                    figure(document, f"{at}.restarts", "n"),
                    figure(document, f"{at}.last_words", "t"),
                ]
            )
        )
    return "\n".join(rows)


def _dedupe(document: dict[str, Any]) -> str:
    fields = [
        ("store", figure(document, "dedupe.store", "t")),
        ("scope", figure(document, "dedupe.scope", "t")),
        ("duplicates dropped", figure(document, "dedupe.duplicates", "n")),
        ("window (configured)", figure(document, "dedupe.window_ms", "w")),
        ("effective window", figure(document, "dedupe.effective_window_ms", "w")),
        ("ids kept", figure(document, "dedupe.keys", "n")),
        ("warnings", figure(document, "dedupe.warnings", "t")),
    ]
    return "\n".join(f"<dt>{html.escape(k)}</dt><dd>{v}</dd>" for k, v in fields)


def _destinations(document: dict[str, Any]) -> str:
    rows = []
    for i, destination in enumerate(document["destinations"]):
        at = f"destinations.{i}"
        rows.append(
            _row(
                [
                    html.escape(destination["name"]),
                    figure(document, f"{at}.queued", "n"),
                    figure(document, f"{at}.retrying", "n"),
                    figure(document, f"{at}.succeeded", "n"),
                    figure(document, f"{at}.discarded", "n"),
                    figure(document, f"{at}.expired", "n"),
                    figure(document, f"{at}.oldest_queued_seconds", "s"),
                    figure(document, f"{at}.per_second", "r"),
                    figure(document, f"{at}.sending", "t"),
                    figure(document, f"{at}.last_error", "t"),
                    figure(document, f"{at}.not_sent", "t"),
                ]
            )
        )
    return "\n".join(rows) or '<tr><td colspan="11">no destinations configured</td></tr>'
