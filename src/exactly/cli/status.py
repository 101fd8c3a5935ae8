"""``exactly status``: what each stage of the pipeline holds and has done, from durable sources.

The log's topics, then each stage of :data:`exactly.stages.STAGES` as its entry reads and shows
itself (``Stage.status``). Every figure is read live where it is durable, so it is right after any
crash:

* **log**: each topic's partitions and end offsets;
* **dedupe**: per job that ran in this data dir (its status file under ``DATA_DIR/status``
  names the store by its URL, password masked, and the checkpoint): per partition in, passed,
  duplicate, rejected, lag, and the store's keys, position and window; the store's scope;
* **aggregate**: the newest micro-batch the aggregate database committed (its marker);
* **delivery**: per destination, the JobDB's jobs by state, the oldest queued, the last error;
* **lake** (with a ``[lake] url``, or the default Delta table once it exists): the table's
  version, the records of ``events`` it holds and its lag behind them; with ``[lake] layout =
  "segment"`` each of Segment's tables, its lag behind the events table and the values its
  ``_rejected`` keeps per column (:mod:`exactly.lake.status`).

A stage that never ran (an embedded database that does not exist yet) is left out, and nothing
is created by looking; when no stage ran, one line says so (exit status 1). Stores and databases
come from the settings (``[dedupe] store``, ``[aggregate] url``, ``[delivery] jobdb``), so no
flag needs repeating after a run.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, TypedDict, TypeVar

import typer

from exactly.cli.context import context, never_ran
from exactly.errors import ExactlyError
from exactly.text import message
from exactly.urls import redact, scrub

if TYPE_CHECKING:  # the command imports them when it runs, so other commands start fast
    from exactly.config import Settings
    from exactly.log import Log
    from exactly.stages import Shown, Stage

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
    from exactly.dedupe.status import status_files
    from exactly.stages import STAGES
    from exactly.up.watch import starting_now

    found = context(ctx)
    settings = found.settings
    topics: list[TopicStatus] | None = None
    shown: dict[Stage[Any, Any, Any], Shown | None] = {}
    errors: dict[Stage[Any, Any, Any], str | None] = {}
    with contextlib.ExitStack() as opened:
        log = None
        if status_files(settings.data_dir) or _exists(settings.log_url):
            log = opened.enter_context(found.open_log())
            topics = [t for t in _topics(log) if show_all or not internal(t["topic"])]
        for stage in STAGES:  # each stage's own reading, in the registry's order
            if stage.target_as is None:
                shown[stage], errors[stage] = stage.status(settings, log), None
            else:
                shown[stage], errors[stage] = _read(
                    stage.target(settings), partial(stage.status, settings, log)
                )
    starting = starting_now(settings.data_dir)
    if not (topics or any(shown.values()) or any(errors.values()) or starting):
        never_ran(settings)
    if as_json:
        listed = None if topics is None else {"topics": topics}
        report: dict[str, Any] = {"log": _stage({"url": settings.log_url}, None, listed)}
        for stage, found_there in shown.items():
            figures = None if found_there is None else found_there.json
            if stage.target_as is None:
                report[stage.shown_as] = [] if figures is None else figures
            else:
                where = {stage.target_as: stage.target(settings)}
                report[stage.shown_as] = _stage(where, errors[stage], figures)
        report["starting"] = {
            query: {"seconds": round(seconds), "waiting_on": waiting}
            for query, (seconds, waiting) in starting.items()
        }
        print(json.dumps(report, indent=1))
    else:
        sections = [section for entry in shown.values() if entry for section in entry.sections]
        if starting:
            sections.append(_render_starting(starting))
        _print(settings, topics, sections)
    for stage, error in errors.items():
        if error:
            print(message(f"error: {stage.shown_as}: {error}"), file=sys.stderr)
    if any(errors.values()):
        raise typer.Exit(1)


def _print(settings: Settings, topics: list[TopicStatus] | None, stages: list[str]) -> None:
    """The report as text within 80 columns: the data dir, the log, then each stage's sections,
    each embedded store's path relative to the data dir."""
    from exactly.cli.output import fit, place

    home = settings.data_dir
    sections = []
    if topics:
        sections.append(_render_topics(place(settings.log_url, home), topics))
    sections += stages
    if sections:
        print("\n\n".join([fit("data dir", str(home.resolve())), *sections]))


def _render_starting(starting: dict[str, tuple[float, str]]) -> str:
    """The queries ``exactly up``'s pipeline is starting, each with what it waits on."""
    lines = ["starting (exactly up's pipeline, no micro-batch yet)"]
    for query, (seconds, waiting) in starting.items():
        lines.append(f"  {query:<10} {seconds:4.0f} s  on {waiting}"[:80])
    return "\n".join(lines)


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
