"""The aggregate database's state for ``exactly status``: the newest micro-batch it committed."""

from __future__ import annotations

from pathlib import Path

from exactly.aggregate.commit import Marker
from exactly.urls import embedded_path


def read(url: str) -> Marker | None:
    """The newest marker of the database at ``url``; None when nothing was committed, or when
    an embedded database is not there (looking creates nothing)."""
    path = embedded_path(url) if url.startswith("sqlite://") else None
    if path is not None and not path.exists():
        return None
    from exactly.aggregate import open_db

    with open_db(url, retry_seconds=0) as db:
        return db.latest_marker()


def render(marker: Marker, url: str, data_dir: Path) -> str:
    """The section for people, within 80 columns."""
    from exactly.text import count, fit, place, wrap

    return "\n".join(
        [
            fit("aggregate", place(url, data_dir)),
            wrap(
                f"  batch {marker.batch_id:,} committed at {marker.committed_at} "
                f"({count(marker.events)} events)",
                "    ",
            ),
            fit("  of query", marker.query_id, "    "),
        ]
    )
