"""What the dedupe job has done, per partition, from durable sources only; and its metrics.

Figures come from where they are durable, so they are right after any crash:

* ``in``: the raw offsets Spark committed (the checkpoint's last committed batch);
* ``passed``, ``rejected``: records in ``events`` and ``<raw>.rejected`` (their end offsets:
  exact on sqlite; on Kafka transaction markers take offsets too, so these are upper bounds);
* ``dropped`` as duplicate: ``in - passed - rejected``;
* ``keys``, ``bytes``, ``window``, ``aged out``, ``position``: the claim store's own statistics;
* ``late`` (spark-state): rows Spark's operator dropped as late, summed from progress reports.

The job writes ``DATA_DIR/status/dedupe-<raw>.json`` (how to find its store and checkpoint, the
last progress report) and ``DATA_DIR/metrics/dedupe-<raw>.prom`` (its metrics exposed the shared
way, :mod:`exactly.metrics`, to a file for a node-exporter textfile collector: the job serves no
HTTP) after each micro-batch; ``exactly status`` reads the first and recomputes the rest live.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exactly.dedupe.job import DedupePlan, store_url
from exactly.dedupe.window import Bounds, below_minimum, shortest_window, window_in_effect
from exactly.errors import ConfigError, UnknownTopic
from exactly.events.ids import DEFAULT_SCOPE
from exactly.log import Log
from exactly.metrics import CollectorRegistry, counter, exposition, gauge, write_textfile
from exactly.spark import checkpoint
from exactly.units import format_duration
from exactly.urls import MASK, redact

Sample = tuple[Sequence[str], float | None]


@dataclass(frozen=True)
class PartitionStatus:
    partition: int
    raw_end: int
    committed: int | None  # raw offsets processed (Spark's last committed batch)
    passed: int
    rejected: int
    keys: int | None = None
    bytes: int | None = None
    window: int | None = None  # ms, the store's: None while nothing was aged out
    aged_out: int | None = None
    position: int | None = None  # the store's: one past the highest offset claimed durably
    suppressed: int = 0  # records of forgotten people dropped (``exactly forget``)

    @property
    def lag(self) -> int:
        return self.raw_end - (self.committed or 0)

    @property
    def dropped(self) -> int | None:
        if self.committed is None:
            return None
        return max(0, self.committed - self.passed - self.rejected - self.suppressed)


@dataclass(frozen=True)
class DedupeStatus:
    store: str
    source: str
    output: str
    checkpoint: str
    window: int
    min_window: int | None
    partitions: list[PartitionStatus] = field(default_factory=list)
    late: int = 0
    last_batch: dict[str, Any] = field(default_factory=dict)
    at: int = 0
    location: str = ""  # the store's URL, redacted
    scope: str = DEFAULT_SCOPE

    @property
    def effective_window(self) -> int:
        """The window duplicates are caught in now (ms): :func:`shortest_window`."""
        return shortest_window(self.window, [p.window for p in self.partitions])

    def warnings(self) -> list[str]:
        """One line per partition whose bounded window is below the minimum."""
        return [
            f"partition {p.partition}: the dedupe window is {format_duration(p.window or 0)}, "
            f"below the minimum {format_duration(self.min_window or 0)}: raise --max-keys or "
            "--max-bytes, or add partitions"
            for p in self.partitions
            if below_minimum(p.window, self.min_window)
        ]


def collect(
    log: Log, plan: DedupePlan, late: int = 0, last: dict[str, Any] | None = None
) -> DedupeStatus:
    """The job's status now (module docstring)."""
    raw = log.end_offsets(plan.source)
    passed = _ends(log, plan.output)
    rejected = _ends(log, plan.rejected)
    suppressed = _ends(log, plan.suppressed)
    committed = checkpoint.committed_end(plan.checkpoint)
    stats = {s.partition: s for s in plan.seen_ids().stats(len(raw))}
    now = int(time.time() * 1000)
    partitions = []
    for partition, end in sorted(raw.items()):
        found = stats.get(partition)
        partitions.append(
            PartitionStatus(
                partition,
                end,
                None if committed is None else committed.get(partition, 0),
                passed.get(partition, 0),
                rejected.get(partition, 0),
                None if found is None else found.keys,
                None if found is None else found.bytes,
                None if found is None else found.window(now),
                None if found is None else found.aged_out,
                None if found is None else found.position,
                suppressed.get(partition, 0),
            )
        )
    return DedupeStatus(
        plan.store_kind,
        plan.source,
        plan.output,
        str(plan.checkpoint),
        plan.window,
        plan.min_window,
        partitions,
        late,
        last or {},
        now,
        redact(plan.store_url),
        plan.scope,
    )


def _ends(log: Log, topic: str) -> dict[int, int]:
    try:
        return log.end_offsets(topic)
    except UnknownTopic:
        return {}


def status_path(data_dir: Path, source: str) -> Path:
    return data_dir.resolve() / "status" / f"dedupe-{source}.json"


def metrics_path(data_dir: Path, source: str) -> Path:
    return data_dir.resolve() / "metrics" / f"dedupe-{source}.prom"


def save(plan: DedupePlan, status: DedupeStatus) -> None:
    """Write the status file and the metrics file, each replaced atomically."""
    document = {
        "plan": {
            "store": redact(plan.store_url),  # a password stays in the settings
            "scope": plan.scope,
            "source": plan.source,
            "output": plan.output,
            "checkpoint": str(plan.checkpoint),
            "bounds": asdict(plan.bounds),
            "min_window": plan.min_window,
        },
        "status": asdict(status),
    }
    _replace(status_path(plan.data_dir, plan.source), json.dumps(document, indent=1))
    registry = CollectorRegistry()
    registry.register(StatusMetrics(status))
    write_textfile(metrics_path(plan.data_dir, plan.source), registry)


def load(
    path: Path, log_url: str, data_dir: Path, configured: str | None = None
) -> tuple[DedupePlan, DedupeStatus]:
    """A plan and the last saved status from a status file (``exactly status``).

    The file names the store by its URL without a password; such a store is opened with
    ``configured`` (``[dedupe] store``) when that is the same store, password included.
    """
    document = json.loads(path.read_text())
    given = document["plan"]
    source, checkpoint_dir = given["source"], Path(given["checkpoint"])
    store = given["store"]
    if MASK in store:
        found = configured and store_url(configured, data_dir, source, checkpoint_dir)
        if not found or redact(found) != store:
            raise ConfigError(
                f"the dedupe store of {path} ({store}) needs its password: set [dedupe] store "
                "(or EXACTLY_DEDUPE__STORE) to its URL"
            )
        store = found
    plan = DedupePlan(
        log_url=log_url,
        store=store,
        data_dir=data_dir,
        checkpoint=checkpoint_dir,
        source=source,
        output=given["output"],
        bounds=Bounds(**given["bounds"]),
        min_window=given["min_window"],
        scope=given.get("scope", DEFAULT_SCOPE),
    )
    return plan, read_saved(document)


def status_files(data_dir: Path) -> list[Path]:
    """The status file of each dedupe job that ran in ``data_dir``."""
    return sorted((data_dir.resolve() / "status").glob("dedupe-*.json"))


def read_jobs(log: Log, log_url: str, data_dir: Path, configured: str) -> list[DedupeStatus]:
    """Each dedupe job's status now (``exactly status``), its store opened by the URL its
    status file records (``configured``, ``[dedupe] store``, gives a masked password)."""
    reports = []
    for path in status_files(data_dir):
        plan, saved = load(path, log_url, data_dir, configured)
        reports.append(collect(log, plan, saved.late, saved.last_batch))
    return reports


def read_saved(document: dict[str, Any]) -> DedupeStatus:
    """The status a status file's ``document`` saved (as :func:`save` wrote it)."""
    saved = dict(document["status"])
    saved["partitions"] = [PartitionStatus(**p) for p in saved["partitions"]]
    return DedupeStatus(**saved)


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(text)
    staged.replace(path)


def prometheus(status: DedupeStatus) -> str:
    """The status in Prometheus text format: counters and gauges labelled by partition."""
    registry = CollectorRegistry()
    registry.register(StatusMetrics(status))
    return exposition(registry).decode()


class StatusMetrics(Collector):
    """A saved status as metric families (the shared way, :mod:`exactly.metrics`)."""

    def __init__(self, status: DedupeStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        status, parts = self.status, self.status.partitions
        labels = ("source", "store", "partition")
        given = (status.source, status.store)

        def each(value: Callable[[PartitionStatus], float | None]) -> list[Sample]:
            return [((*given, str(p.partition)), value(p)) for p in parts]

        outcomes: list[Sample] = []
        for p in parts:
            where = (*given, str(p.partition))
            outcomes += [
                ((*where, "in"), p.committed),
                ((*where, "passed"), p.passed),
                ((*where, "duplicate"), p.dropped),
                ((*where, "rejected"), p.rejected),
                ((*where, "suppressed"), p.suppressed),
            ]
        name = "exactly_dedupe_"
        text = "raw records processed, by outcome"
        yield counter(f"{name}records_total", text, (*labels, "outcome"), outcomes)
        yield gauge(f"{name}lag_records", "raw records not processed yet", labels, each(_lag))
        yield gauge(f"{name}keys", "messageIds kept by the store", labels, each(_keys))
        yield gauge(f"{name}bytes", "bytes the store keeps on disk", labels, each(_bytes))
        text = "age of the oldest messageId kept, once the bounds age ids out"
        yield gauge(f"{name}window_seconds", text, labels, each(_window_seconds))
        text = "rows Spark dropped as late (spark-state)"
        yield counter(f"{name}late_total", text, labels[:2], [(given, status.late)])


def _lag(p: PartitionStatus) -> int:
    return p.lag


def _keys(p: PartitionStatus) -> int | None:
    return p.keys


def _bytes(p: PartitionStatus) -> int | None:
    return p.bytes


def _window_seconds(p: PartitionStatus) -> float | None:
    return None if p.window is None else p.window / 1000


def show_window(window: int) -> str:
    """A window as ``status``, the console and ``up`` show it (``1d``, ``3h 20m``)."""
    return format_duration(window)


def saved_window(data_dir: Path, plan: DedupePlan) -> tuple[int, DedupeStatus | None]:
    """The job's effective window from its status file (written after each micro-batch) and
    that status; the configured window and None before the job saved one."""
    try:
        saved = read_saved(json.loads(status_path(data_dir, plan.source).read_text()))
    except FileNotFoundError:
        return plan.window, None
    return saved.effective_window, saved


def render(status: DedupeStatus, data_dir: Path | None = None) -> str:
    """A table for people, within 80 columns: the store and the checkpoint each on a line of
    their own, as paths relative to ``data_dir`` when they are inside it."""
    from exactly.text import count, fit, place, wrap

    home = Path(".") if data_dir is None else data_dir
    store = status.location or status.store
    checkpoint_dir = Path(status.checkpoint)
    if data_dir is not None and checkpoint_dir.resolve().is_relative_to(home.resolve()):
        checkpoint_dir = checkpoint_dir.resolve().relative_to(home.resolve())
    head = [
        wrap(
            f"dedupe {status.source} -> {status.output} ({status.store}, scope {status.scope}, "
            f"window {show_window(status.effective_window)})"
        ),
        fit("  store", place(store, home) if data_dir is not None else store, "    "),
        fit("  checkpoint", str(checkpoint_dir), "    "),
    ]
    columns = ("partition", "raw", "in", "passed", "duplicate", "rejected", "lag", "keys", "window")
    rows = [columns]
    for p in status.partitions:
        window = "-" if p.keys is None else show_window(window_in_effect(status.window, p.window))
        rows.append(
            (
                str(p.partition),
                count(p.raw_end),
                "-" if p.committed is None else count(p.committed),
                count(p.passed),
                "-" if p.dropped is None else count(p.dropped),
                count(p.rejected),
                count(p.lag),
                "-" if p.keys is None else count(p.keys),
                window,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = head + [
        "  " + "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    ]
    if status.late:
        lines.append(f"late rows dropped by Spark's operator: {status.late:,}")
    suppressed = sum(p.suppressed for p in status.partitions)
    if suppressed:
        lines.append(f"suppressed, of people forgotten (exactly forget): {suppressed:,}")
    lines += [wrap(f"warning: {line}") for line in status.warnings()]
    return "\n".join(lines)
