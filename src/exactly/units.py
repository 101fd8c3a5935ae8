"""Durations and sizes as people write them in settings and flags: pure functions.

Every option that takes a duration (``24h``, ``1h30m``) or a size (``512MB``, ``2GiB``) reads it
here, so each unit means the same thing everywhere; errors name the option they came from.
"""

from __future__ import annotations

import re

from exactly.errors import ConfigError

__all__ = ["MS", "format_duration", "parse_duration", "parse_size"]

MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str, name: str = "window") -> int:
    """Milliseconds of a duration such as ``24h``, ``7d``, ``90m``, ``1h30m``, ``1.5h``.

    Units: ms, s, m, h, d, w. Raises :class:`~exactly.errors.ConfigError` naming ``name``.
    """
    cleaned = text.strip().lower().replace(" ", "")
    total = 0.0
    at = 0
    for match in _DURATION.finditer(cleaned):
        if match.start() != at:
            break
        total += float(match.group(1)) * MS[match.group(2)]
        at = match.end()
    if not cleaned or at != len(cleaned) or total < 1:
        raise ConfigError(
            f"{name} {text!r} is not a duration: use a number and a unit (ms, s, m, h, d, w), "
            "e.g. 24h, 7d or 1h30m"
        )
    return round(total)


def format_duration(ms: int) -> str:
    """A duration for people, largest units first, two of them at most: ``1d 2h``, ``3m 4s``."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    parts: list[str] = []
    rest = ms
    for unit in ("w", "d", "h", "m", "s"):
        count, rest = divmod(rest, MS[unit])
        if count or parts:
            parts.append(f"{count}{unit}")
        if len(parts) == 2:
            break
    return " ".join(part for part in parts if not part.startswith("0")) or "0s"


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(i)?)?b?")


def parse_size(text: str, name: str = "size") -> int:
    """Bytes of a size such as ``512MB``, ``2GiB``, ``1.5g`` or ``1000000``."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise ConfigError(f"{name} {text!r} is not a size: use e.g. 512MB, 2GiB or 1000000")
    number, unit, binary = float(match.group(1)), match.group(2) or "", match.group(3)
    base = 1024 if binary else 1000
    size = round(number * float(base ** " kmgt".index(unit or " ")))
    if size < 1:
        raise ConfigError(f"{name} {text!r} must be at least one byte")
    return size
