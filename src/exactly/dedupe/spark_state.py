"""The spark-state mode of the dedupe job: Spark's own ``dropDuplicatesWithinWatermark``.

Not a store: nothing claims ids in the tasks, which only route records without a messageId;
Spark's operator deduplicates afterwards, on the key (or with scope ``source`` the packed
``(source, messageId)``), with the watermark on the receive time the log recorded, in the
RocksDB state store with changelog checkpointing (``job.build``). The window is the watermark
delay. :class:`SparkState` is what the job keeps of it outside Spark: the window, and the scope
its state was built with, recorded in the checkpoint.

Guarantee: the state store is versioned per micro-batch in the query's checkpoint, so a replayed
batch yields the same rows. Records received more than a window behind the newest one seen are
*late* to Spark and dropped by its operator: the mode's one way to lose a record (keep the window
well above any backlog).
"""

from __future__ import annotations

from pathlib import Path

from exactly.dedupe.base import PartitionStats, SeenIds, write_once
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError
from exactly.units import format_duration

NAME = "spark-state"  # what [dedupe] store calls the mode
SCOPE_FILE = "exactly-dedupe-scope"  # in the checkpoint: the scope of its state
DEFAULT_WINDOW = 24 * 3_600_000


class SparkState(SeenIds):
    """Spark's state in the query's ``checkpoint``; ``bounds.window`` is the watermark delay."""

    name = NAME

    def __init__(self, checkpoint: Path | str, bounds: Bounds | None = None) -> None:
        bounds = bounds or Bounds()
        if bounds.max_keys is not None or bounds.max_bytes is not None:
            raise ConfigError(
                "the spark-state store is bounded by --window (the watermark delay), "
                "not by --max-keys or --max-bytes"
            )
        self.checkpoint = Path(checkpoint)
        self.bounds = Bounds(window=bounds.window or DEFAULT_WINDOW)

    @classmethod
    def at(cls, url: str, bounds: Bounds | None = None) -> SparkState:
        """The state of ``spark-state://CHECKPOINT``."""
        scheme, _, rest = url.partition("://")
        if scheme != NAME or not rest or rest == "/":
            raise ConfigError(
                f"dedupe store URL {url!r}: name the query's checkpoint, spark-state:///path/dir"
            )
        return cls(Path(rest), bounds)

    @property
    def window(self) -> int:
        """The watermark delay (ms)."""
        return self.bounds.window or DEFAULT_WINDOW

    def _refusal(self, found: str, scope: str) -> str:
        """Spark's state holds the keys it deduplicated on; read with another scope it would find
        none, and no rebuild from the output is possible: another scope needs a new checkpoint."""
        return (
            f"checkpoint {self.checkpoint} holds spark-state deduplicated by scope {found!r}, "
            f"not {scope!r}: set [dedupe] scope = {found!r} (EXACTLY_DEDUPE__SCOPE={found}); "
            "another scope needs a new checkpoint and output topic"
        )

    def _recorded_scope(self, partitions: int) -> str | None:
        """The scope file; ``workspace`` for a checkpoint with batches but none (before scopes)."""
        from exactly.spark.checkpoint import planned

        try:
            return (self.checkpoint / SCOPE_FILE).read_text().strip()
        except FileNotFoundError:
            return "workspace" if planned(self.checkpoint) else None

    def _record_scope(self, scope: str) -> str:
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        return write_once(self.checkpoint / SCOPE_FILE, scope)

    def location(self) -> str:
        return f"checkpoint {self.checkpoint}"

    def fresh_hint(self) -> str:
        return "use a new checkpoint and output topic"

    def describe(self) -> str:
        return f"spark-state, watermark {format_duration(self.window)}"

    def stats(self, partitions: int) -> list[PartitionStats]:
        return []  # Spark's state is not read here: its figures are in the progress reports
