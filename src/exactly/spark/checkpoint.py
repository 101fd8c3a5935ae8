"""Reading a Spark streaming checkpoint: the query's id, the batches planned and committed.

Spark keeps, under a query's checkpoint directory, ``metadata`` (a JSON line with the query's
``id``, stable across restarts), ``offsets/<batch id>`` (written before the batch runs: a version
line, a metadata line, then one line per source with its end position) and
``commits/<batch id>`` (written after the sink returned). These functions read them, for local
checkpoints only, and never write: a job's progress stays Spark's to record.
"""

from __future__ import annotations

import json
from pathlib import Path

from exactly.errors import StreamError
from exactly.spark.datasource import offsets

__all__ = ["batch_end", "committed_end", "last_committed", "local_path", "planned", "query_id"]


def local_path(checkpoint: str | Path | None) -> Path | None:
    """The directory of a local checkpoint (``/dir``, ``file:/dir``, ``file:///dir``); else None."""
    if checkpoint is None or isinstance(checkpoint, Path):
        return checkpoint
    if not checkpoint or "://" in checkpoint.removeprefix("file://"):
        return None
    return Path(checkpoint.removeprefix("file://").removeprefix("file:"))


def query_id(checkpoint: str | Path | None) -> str | None:
    """The query id Spark stored in a local checkpoint, None if there is none yet."""
    path = local_path(checkpoint)
    if path is None:
        return None
    try:
        found = json.loads((path / "metadata").read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def planned(checkpoint: Path) -> bool:
    """Whether Spark has planned a micro-batch in this checkpoint (a numbered ``offsets`` file)."""
    folder = checkpoint / "offsets"
    return folder.is_dir() and any(entry.name.isdigit() for entry in folder.iterdir())


def batch_end(checkpoint: Path, batch_id: int) -> dict[int, int] | None:
    """The source's end offsets Spark recorded for a batch before running it; None if unreadable.

    The position of the first source (the exactly source: every job here reads one).
    """
    try:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
        position = json.loads(lines[2])
        return offsets.from_json(position) if isinstance(position, dict) else None
    except (OSError, IndexError, ValueError, StreamError):
        return None


def last_committed(checkpoint: Path) -> int | None:
    """The id of the last micro-batch Spark committed in this checkpoint; None if none yet."""
    found = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*") if p.name.isdigit()]
    return max(found) if found else None


def uncommitted(checkpoint: Path) -> int | None:
    """The micro-batch Spark planned in this checkpoint and has not committed (a stop or a kill
    came inside it; the query's next run starts by running it again), if any."""
    found = [int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*") if p.name.isdigit()]
    newest = max(found, default=None)
    if newest is None or newest == last_committed(checkpoint):
        return None
    return newest


def committed_end(checkpoint: Path) -> dict[int, int] | None:
    """The source position of the checkpoint's last committed micro-batch; None if none yet."""
    batch = last_committed(checkpoint)
    return None if batch is None else batch_end(checkpoint, batch)
