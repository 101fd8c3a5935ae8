"""``exactly status``: what each stage of the pipeline holds and has done, from durable sources.

Every figure is read live where it is durable, so it is right after any crash:

* **log**: each topic's partitions and end offsets;
* **dedupe**: per job that ran in this data dir (its status file under ``DATA_DIR/status``
  names the store by its URL, password masked, and the checkpoint): per partition in, passed,
  duplicate, rejected, lag, and the store's keys, position and window; the store's scope;
* **aggregate**: the newest micro-batch the aggregate database committed (its marker);
* **delivery**: per destination, the JobDB's jobs by state, the oldest queued, the last error;
* **lake** (with a ``[lake] url``, or the default Delta table once it exists): the table's
  version, the records of ``events`` it holds and its lag behind them.

A stage that never ran (an embedded database that does not exist yet) is left out, and nothing
is created by looking; when no stage ran, one line says so (exit status 1). Stores and databases
come from the settings (``[dedupe] store``, ``[aggregate] url``, ``[delivery] jobdb``), so no
flag needs repeating after a run.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict, TypeVar

import typer

from exactly.cli.context import context, never_ran
from exactly.errors import ExactlyError
from exactly.text import message
from exactly.urls import redact, scrub

if TYPE_CHECKING:  # the command imports them when it runs, so other commands start fast
    from exactly.aggregate.commit import Marker
    from exactly.cli.context import Context
    from exactly.config import Settings
    from exactly.dedupe.status import DedupeStatus
    from exactly.delivery.jobdb.base import Summary
    from exactly.lake.status import LakeStatus
    from exactly.log import Log

T = TypeVar("T")


def status(
    ctx: typer.Context,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all", help="Show exactly's internal topics too (exactly.sinks, Kafka's __...)."
        ),
    ] = False,
) -> None:
    """Every stage that ran in this data dir: log topics, dedupe, aggregates, deliveries.

    Stores and databases are found from the config ([dedupe] store, [aggregate] url,
    [delivery] jobdb) and from what each job recorded, so no option needs repeating. Topics
    exactly keeps for itself are left out unless --all is given.
    """
    found = context(ctx)
    settings = found.settings
    topics: list[TopicStatus] | None = None
    dedupe: list[DedupeStatus] = []
    jobs = sorted((settings.data_dir.resolve() / "status").glob("dedupe-*.json"))
    if jobs or _exists(settings.log_url):
        with found.open_log() as log:
            topics = [t for t in _topics(log) if show_all or not internal(t["topic"])]
            dedupe = _dedupe(log, settings, jobs)
    marker, aggregate_error = _read(settings.aggregate_url, lambda: _marker(settings))
    destinations, jobdb_error = _read(settings.jobdb_url, lambda: _destinations(settings))
    lake, lake_error = _read(settings.lake_url, lambda: _lake(found, settings))
    if not (
        topics
        or dedupe
        or marker
        or destinations is not None
        or lake is not None
        or aggregate_error
        or jobdb_error
        or lake_error
    ):
        never_ran(settings)
    if as_json:
        listed = None if topics is None else {"topics": topics}
        counted = None if marker is None else {"marker": asdict(marker)}
        queues = None
        if destinations is not None:
            queues = {"destinations": [{**asdict(d), "queued": d.queued} for d in destinations]}
        report = {
            "log": _stage({"url": settings.log_url}, None, listed),
            "dedupe": [{"job": "dedupe", **asdict(job)} for job in dedupe],
            "aggregate": _stage({"url": settings.aggregate_url}, aggregate_error, counted),
            "delivery": _stage({"jobdb": settings.jobdb_url}, jobdb_error, queues),
            "lake": _stage(
                {"url": settings.lake_url}, lake_error, None if lake is None else asdict(lake)
            ),
        }
        print(json.dumps(report, indent=1))
    else:
        _print(settings, topics, dedupe, marker, destinations, lake)
    errors = (("aggregate", aggregate_error), ("delivery", jobdb_error), ("lake", lake_error))
    for where, error in errors:
        if error:
            print(message(f"error: {where}: {error}"), file=sys.stderr)
    if any(error for _, error in errors):
        raise typer.Exit(1)


def _print(
    settings: Settings,
    topics: list[TopicStatus] | None,
    dedupe: list[DedupeStatus],
    marker: Marker | None,
    destinations: list[Summary] | None,
    lake: LakeStatus | None,
) -> None:
    """The report as text within 80 columns: the data dir, then a section per stage, each
    embedded store's path relative to the data dir."""
    from exactly.cli.output import count, fit, place, wrap
    from exactly.dedupe.status import render

    home = settings.data_dir
    sections = []
    if topics:
        sections.append(_render_topics(place(settings.log_url, home), topics))
    sections += [render(job, home) for job in dedupe]
    if marker is not None:
        sections.append(
            "\n".join(
                [
                    fit("aggregate", place(settings.aggregate_url, home)),
                    wrap(
                        f"  batch {marker.batch_id:,} committed at {marker.committed_at} "
                        f"({count(marker.events)} events)",
                        "    ",
                    ),
                    fit("  of query", marker.query_id, "    "),
                ]
            )
        )
    if destinations is not None:
        sections.append(_render_destinations(place(settings.jobdb_url, home), destinations))
    if lake is not None:
        version = "no commit yet" if lake.version is None else f"version {lake.version}"
        behind = "" if lake.lag is None else f", lag {count(lake.lag)}"
        sections.append(
            "\n".join(
                [
                    fit("lake", place(lake.url, home)),
                    wrap(f"  {version}: {count(lake.landed)} records of events{behind}", "    "),
                ]
            )
        )
    if sections:
        print("\n\n".join([fit("data dir", str(home.resolve())), *sections]))


def internal(topic: str) -> bool:
    """Whether exactly (``exactly.sinks``) or Kafka (``__consumer_offsets``) keeps ``topic``
    for itself: ``exactly status`` shows it only with ``--all``."""
    return topic.startswith(("exactly.", "__"))


def _stage(
    where: dict[str, str], error: str | None, found: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A stage in the JSON report: where it is (the URL redacted), then what was found there or
    the error that kept it from being read; None if it never ran."""
    shown = {key: redact(url) for key, url in where.items()}
    if error:
        return {**shown, "error": error}
    return None if found is None else {**shown, **found}


def _read(url: str, read: Callable[[], T]) -> tuple[T | None, str | None]:
    """What ``read`` returns, or one line saying what kept it from reading the database at
    ``url`` (down, refusing, ...), its password masked."""
    try:
        return read(), None
    except ExactlyError as error:
        return None, str(error)
    except Exception as error:  # noqa: BLE001 - a client library's own: say it, show the rest
        from urllib.parse import urlsplit

        password = urlsplit(url).password
        text = f"cannot read {redact(url)}: {type(error).__name__}: {error}"
        return None, scrub(" ".join(text.split()), [password] if password else [])


class TopicStatus(TypedDict):
    topic: str
    partitions: int
    records: int
    end_offsets: dict[int, int]


def _exists(url: str) -> bool:
    """False for an embedded (``sqlite://``) store whose file or directory is not there yet."""
    from exactly.urls import embedded_path

    path = embedded_path(url) if url.startswith("sqlite://") else None
    return path is None or path.exists()


def _topics(log: Log) -> list[TopicStatus]:
    topics = []
    for name in log.topics():
        ends = log.end_offsets(name)
        size = sum(ends.values())
        topics.append(TopicStatus(topic=name, partitions=len(ends), records=size, end_offsets=ends))
    return topics


def _dedupe(log: Log, settings: Settings, jobs: list[Path]) -> list[DedupeStatus]:
    """Each dedupe job's status now, its store opened by the URL its status file records."""
    from exactly.dedupe.status import collect, load

    reports = []
    for path in jobs:
        plan, saved = load(path, settings.log_url, settings.data_dir, settings.dedupe.store)
        reports.append(collect(log, plan, saved.late, saved.last_batch))
    return reports


def _marker(settings: Settings) -> Marker | None:
    """The newest micro-batch the aggregate database committed."""
    if not _exists(settings.aggregate_url):
        return None
    from exactly.aggregate import open_db

    with open_db(settings.aggregate_url, retry_seconds=0) as db:
        return db.latest_marker()


def _lake(found: Context, settings: Settings) -> LakeStatus | None:
    """The lake table's status: with a ``[lake] url``, or once the default table exists."""
    from exactly.lake import open_table
    from exactly.lake.status import collect

    if not settings.has_lake:
        return None
    with open_table(settings.lake_url) as table, found.open_log() as log:
        return collect(table, log)


def _destinations(settings: Settings) -> list[Summary] | None:
    """Per destination (each configured one too), its jobs in the JobDB by state."""
    if not _exists(settings.jobdb_url):
        return None
    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.jobdb.base import Summary

    with open_jobdb(settings.jobdb_url) as jobdb:
        found = jobdb.summary(time.time())
    for destination in settings.destinations:
        found.setdefault(destination.name, Summary(destination.name, {}))
    return [entry for _, entry in sorted(found.items())]


def _render_topics(where: str, topics: list[TopicStatus]) -> str:
    from exactly.cli.output import fit

    width = max(len(t["topic"]) for t in topics)
    return "\n".join(
        [fit("log", where)]
        + [
            f"  {t['topic']:<{width}}  {t['partitions']:>4,} partitions  "
            f"{t['records']:>12,} records"
            for t in topics
        ]
    )


def _render_destinations(where: str, destinations: list[Summary]) -> str:
    from exactly.cli.output import count, fit, wrap
    from exactly.delivery.jobdb.base import AWAITING_RETRY, DISCARDED, EXPIRED, SUCCEEDED
    from exactly.units import format_duration

    lines = [fit("delivery", where)]
    for entry in destinations:
        states, age = entry.states, entry.oldest_pending_seconds
        lines.append(
            wrap(
                f"  {entry.destination}: queued {count(entry.queued)}, retrying "
                f"{count(states.get(AWAITING_RETRY, 0))}, succeeded "
                f"{count(states.get(SUCCEEDED, 0))}, discarded {count(states.get(DISCARDED, 0))}, "
                f"expired {count(states.get(EXPIRED, 0))}"
                + ("" if age is None else f", oldest queued {format_duration(round(age * 1000))}"),
                "    ",
            )
        )
        if entry.last_error:
            error = " ".join(entry.last_error.split())[:160]
            lines.append(wrap(f"    last error: {error}", "      "))
    return "\n".join(lines)
