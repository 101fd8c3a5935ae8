"""The logs under the data dir, cleared of what a forgotten person's events carried.

``DATA_DIR/up/<part>.log`` (a director's last error may quote a receiver's answer) and
``DATA_DIR/logs/spark-*.log`` (what a transform prints) are appended by running parts. Each
occurrence of a text is overwritten in place by as many ``*``, so a part appending meanwhile
keeps its place and nothing else of the file moves.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path

import orjson

PLACES = ("up", "logs")  # under the data dir


def scrub(data_dir: Path, texts: Iterable[str]) -> tuple[int, int]:
    """Overwrite every occurrence of ``texts`` (as written, and as JSON writes them) in the
    files under the data dir's log folders; (files changed, occurrences)."""
    needles = sorted(
        {form for text in texts if text for form in (text.encode(), orjson.dumps(text)[1:-1])},
        key=len,
        reverse=True,
    )
    files = places = 0
    if not needles:
        return 0, 0
    for folder in PLACES:
        for path in sorted((data_dir / folder).rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            found = _scrub_file(path, needles)
            files += found > 0
            places += found
    return files, places


def _scrub_file(path: Path, needles: list[bytes]) -> int:
    size = path.stat().st_size
    if not size:
        return 0
    found = 0
    descriptor = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(descriptor, size) as view:
            for needle in needles:
                at = view.find(needle)
                while at >= 0:
                    view[at : at + len(needle)] = b"*" * len(needle)
                    found += 1
                    at = view.find(needle, at + len(needle))
            if found:
                view.flush()
        if found:
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return found
