"""The demo run by the README's first command: the whole pipeline, on embedded defaults.

1. ``exactly up`` starts (a subprocess, as one service: the collector with two sources, one Spark
   application running the dedupe, aggregate, route and lake queries, and the director) with a
   config the demo writes under the data dir, whose four destinations (one of them taking
   batches) are paths of a local receiver that answers 503 to a fifth of the requests
   (:mod:`exactly.delivery.demo`);
2. generated clients send Segment events through ``/v1/batch``; some batches are sent again, as a
   client that timed out before seeing the answer does, so ``raw`` holds the same messageIds
   twice;
3. while ``up`` deduplicates them into ``events`` (rocksdb store), counts them into SQLite
   (``event_counts``) and delivers them, the demo watches each stage's lag until all is done,
   then stops ``up`` with SIGTERM;
4. ``audit`` recounts ``events`` with a batch read and compares with the table, what each
   destination received is compared with what its filters take, and the lake table (Delta,
   ``DATA_DIR/lake/events``) must hold every event of ``events`` once; a DuckDB query over it
   ends the demo (``exactly lake sql``), with two over Segment's tables beside it (the segment
   layout: ``order_completed``'s typed ``revenue``, ``users``' newest ``plan``).

Everything lives under the data dir: the sqlite log, the rocksdb store, the aggregates file, the
JobDB and the checkpoints, so a second run adds to the first.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exactly.config import Settings
from exactly.errors import ExactlyError
from exactly.text import fit, place, wrap

EVENT_NAMES = ["Order Completed", "Product Viewed", "Signed Up", "Cart Viewed", "Checkout Started"]
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
SOURCES = {"web": "demo-web-write-key", "ios": "demo-ios-write-key"}
BATCH = 500
STATS_ROWS = 40  # of the counts table the demo shows


def iso_millis(moment: float) -> str:
    """``moment`` as the SDKs write times: ISO 8601 in UTC, to the millisecond."""
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1000):03d}Z"
    )


def generate_events(count: int, rng: random.Random, now: float) -> Iterator[dict[str, Any]]:
    """Segment events of about 300 bytes from the last few minutes, a few from an hour ago."""
    for _ in range(count):
        late = rng.random() < 0.01  # a phone that was offline: its events arrive late
        moment = now - (3600 + rng.uniform(0, 300) if late else rng.uniform(0, 180))
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + ".000Z"
        kind = rng.choices(["track", "page", "identify"], [8, 3, 1])[0]
        event: dict[str, Any] = {
            "type": kind,
            "messageId": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            "userId": f"user-{rng.randrange(10_000)}",
            "timestamp": stamp,
            "context": {"library": {"name": "analytics-python", "version": "2.3.2"}},
        }
        if kind == "track":
            event["event"] = rng.choice(EVENT_NAMES)
            event["properties"] = {"sku": f"sku-{rng.randrange(500)}"}
            if event["event"] == "Order Completed":
                event["properties"]["revenue"] = round(rng.uniform(5, 200), 2)
        elif kind == "page":
            event["name"] = rng.choice(PAGES)
        else:
            event["traits"] = {"plan": rng.choice(["free", "pro"])}
        yield event


@dataclass
class Traffic:
    """What the clients sent: requests, events, the events sent again, the distinct ids."""

    requests: int = 0
    events: int = 0
    resent: int = 0
    distinct: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def collector_answers(port: int) -> bool:
    """Whether a collector on ``port`` answers ``GET /health`` with 200."""
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


class UpService:
    """``exactly up`` in a subprocess (its own process group), stopped with SIGTERM."""

    def __init__(self, settings: Settings, config: Path, port: int) -> None:
        self.port = port
        self.log = settings.data_dir.resolve() / "demo" / "up.log"
        env = {  # secrets of the URLs through the environment, not the config file or argv
            **os.environ,
            "EXACTLY_LOG__URL": settings.log_url,
            "EXACTLY_AGGREGATE__URL": settings.aggregate_url,
        }
        with self.log.open("wb") as output:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "exactly", "--config", str(config), "up", "--no-live"],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace").strip()[-300:]
                raise ExactlyError(f"exactly up did not start: {tail}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        return collector_answers(self.port)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def write_config(settings: Settings, partitions: int, receiver_url: str) -> tuple[Path, int]:
    """The demo's exactly.toml (under the data dir) and the collector's port in it."""
    from exactly.delivery.demo import destinations_toml

    port = free_port()
    home = settings.data_dir.resolve() / "demo"
    home.mkdir(parents=True, exist_ok=True)
    sources = "\n".join(f'{name} = "{key}"' for name, key in SOURCES.items())
    config = home / "exactly.toml"
    config.write_text(
        f'''data_dir = {json.dumps(str(settings.data_dir.resolve()))}

[collector]
port = {port}
partitions = {partitions}

[console]
port = {free_port()}

[collector.sources]
{sources}

[dedupe]
store = "rocksdb"
scope = "{settings.dedupe.scope}"

[lake]
url = {json.dumps(settings.lake_url)}

{destinations_toml(receiver_url)}'''
    )
    return config, port


def send(
    port: int,
    events: int,
    *,
    seed: int = 0,
    clients: int = 4,
    resend_rate: float = 0.02,
    rate: float | None = None,
    on_sent: Callable[[float, int], None] | None = None,
    on_accepted: Callable[[float, list[dict[str, Any]]], None] | None = None,
    on_start: Callable[[], None] | None = None,
    sources: dict[str, str] | None = None,
) -> Traffic:
    """Send ``events`` through ``/v1/batch`` from ``clients`` threads; some batches twice.

    A resent batch is the same request again (same messageIds), as a client whose first attempt
    timed out would send it. ``rate`` (events/s over all clients) paces the clients;
    ``on_sent(started, n)`` is told the start time of each accepted batch of ``n`` new events;
    ``on_accepted(started, events)`` the same with the batch's events (to count some of them);
    ``on_start()`` is called once every event is made, right before the first request.
    ``sources`` (name -> write key; the demo's two by default) take the batches in turn. The
    events are made before the clock starts (about 6 µs each), so ``Traffic.seconds`` is the
    sending's time alone.
    """
    traffic = Traffic()
    lock = threading.Lock()
    now = time.time()
    per_client = [events // clients + (1 if i < events % clients else 0) for i in range(clients)]

    def client(index: int, pending: list[dict[str, Any]], rng: random.Random) -> None:
        keys = SOURCES if sources is None else sources
        names = list(keys)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        began = time.monotonic()
        sent = 0
        for at in range(0, len(pending), BATCH):
            chunk = pending[at : at + BATCH]
            source = names[(at // BATCH + index) % len(names)]
            auth = base64.b64encode(f"{keys[source]}:".encode()).decode()
            headers = {"Content-Type": "application/json", "Authorization": f"Basic {auth}"}
            if rate is not None:
                wait = began + sent / (rate / clients) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            # sentAt is when the client sends, by its clock (right here): the collector corrects
            # each timestamp by the gap to its own clock, so a late event stays where it was
            body = json.dumps({"batch": chunk, "sentAt": iso_millis(time.time())}).encode()
            attempts = 2 if rng.random() < resend_rate else 1
            started = time.time()
            for attempt in range(attempts):
                connection.request("POST", "/v1/batch", body, headers)
                response = connection.getresponse()
                answer = response.read()
                if response.status != 200:
                    with lock:
                        traffic.failures.append(f"{response.status} {answer[:200]!r}")
                    return
                with lock:
                    traffic.requests += 1
                    traffic.events += len(chunk)
                    if attempt:
                        traffic.resent += len(chunk)
            sent += len(chunk)
            if on_sent is not None:
                on_sent(started, len(chunk))
            if on_accepted is not None:
                on_accepted(started, chunk)
        with lock:
            traffic.distinct += len(pending)

    threads = []
    for index, count in enumerate(per_client):
        rng = random.Random(f"{seed}-{index}-{now}")
        pending = list(generate_events(count, rng, now))
        threads.append(threading.Thread(target=client, args=(index, pending, rng), daemon=True))
    if on_start is not None:
        on_start()
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    traffic.seconds = time.perf_counter() - began
    if traffic.failures:
        raise ExactlyError(f"the collector refused a batch: {traffic.failures[0]}")
    return traffic


def topic_size(log_url: str, topic: str) -> int:
    return sum(topic_ends(log_url, topic).values())


def topic_ends(log_url: str, topic: str) -> dict[int, int]:
    """Each partition's end offset; none for a topic not there yet."""
    from exactly.errors import UnknownTopic
    from exactly.log import open_log

    with open_log(log_url) as log:
        try:
            return dict(log.end_offsets(topic))
        except UnknownTopic:
            return {}


@dataclass(frozen=True)
class LakeCheck:
    """The lake table after the run, beside the ``events`` topic it lands."""

    url: str
    rows: int  # rows in the table
    distinct: int  # distinct messageIds among them
    events: int  # records in the events topic
    by_event: Any  # pyarrow.Table: LAKE_QUERY's answer
    segment: list[tuple[str, Any]] = field(default_factory=list)  # SEGMENT_QUERIES, answered

    @property
    def exact(self) -> bool:
        return self.rows == self.distinct == self.events


LAKE_QUERY = "select type, event, count(*) as n from events group by all order by n desc"
# Segment's tables beside events (the segment layout): typed columns, users' newest traits
SEGMENT_QUERIES = (
    "select count(*) as orders, round(sum(revenue), 2) as revenue, "
    "round(avg(revenue), 2) as average from order_completed",
    "select plan, count(*) as users from users group by plan order by users desc",
)


@dataclass
class DemoResult:
    traffic: Traffic
    raw: int = 0  # records added to raw by this run
    events: int = 0  # records added to events by this run
    counted: int = 0  # events the aggregate query counted in this run
    seconds: dict[str, float] = field(default_factory=dict)
    audit: Any = None  # exactly.aggregate.audit.AuditResult
    stats: list[tuple[Any, ...]] = field(default_factory=list)
    received: list[Any] = field(default_factory=list)  # exactly.delivery.demo.Received
    lake: LakeCheck | None = None

    @property
    def duplicates_dropped(self) -> int:
        return self.raw - self.events


def run_pipeline(
    settings: Settings, events: int, partitions: int, say: Callable[[str], None]
) -> DemoResult:
    """``exactly up``, clients, the wait for every stage, audit; see the module docstring."""
    from exactly.aggregate import open_db
    from exactly.aggregate.audit import run_audit
    from exactly.aggregate.frame import check
    from exactly.aggregate.spec import EVENT_COUNTS
    from exactly.aggregate.stats import StatsQuery, event_counts
    from exactly.config import load_settings
    from exactly.delivery.demo import FlakyReceiver, received
    from exactly.spark.session import build_session

    raw_before = topic_size(settings.log_url, "raw")
    events_start = topic_ends(settings.log_url, "events")
    events_before = sum(events_start.values())
    counted_before = _counted(settings)
    with FlakyReceiver() as receiver:
        config, port = write_config(settings, partitions, receiver.url)
        clock = time.perf_counter()
        say("1/3 exactly up: collector, Spark (dedupe, aggregate, route, lake), director")
        say(fit("    on the log", place(settings.log_url, settings.data_dir), "      "))
        say(f"    sending {events:,} events ...")
        up = UpService(settings, config, port)
        say(f"    watch it on http://127.0.0.1:{load_settings(config).console.port}")
        try:
            traffic = send(port, events)
            result = DemoResult(traffic)
            result.seconds["collect"] = time.perf_counter() - clock
            result.raw = topic_size(settings.log_url, "raw") - raw_before
            say("2/3 waiting for dedupe, aggregate, route, lake and delivery to catch up")
            say("    (records each stage has still to read, deliveries waiting) ...")
            _wait_until_done(load_settings(config), up, say)
            result.seconds["pipeline"] = time.perf_counter() - clock
        finally:
            up.stop()
        result.events = topic_size(settings.log_url, "events") - events_before
        result.counted = _counted(settings) - counted_before
        result.received = received(receiver, settings.log_url, events_start)
        result.lake = check_lake(settings)

    say("3/3 audit: recounting events with a batch read ...")
    clock = time.perf_counter()
    spark = build_session(settings, app_name="exactly-demo-audit")
    try:
        with open_db(settings.aggregate_url, say=say) as db:
            result.stats = event_counts(db, StatsQuery(by="hour", limit=STATS_ROWS))
            result.audit = run_audit(
                spark, settings.log_url, "events", db, check(spark, [EVENT_COUNTS])
            )
    finally:
        spark.stop()
    result.seconds["audit"] = time.perf_counter() - clock
    return result


def _wait_until_done(settings: Settings, up: UpService, say: Callable[[str], None]) -> None:
    """Until every query has read its topic's end and no job is queued or retrying."""
    from exactly.delivery.jobdb.base import AWAITING_RETRY
    from exactly.log import open_log
    from exactly.up import watch

    stages = watch.stages(settings)
    began = time.monotonic()
    shown: float | None = None
    jobdb = watch.JobDBReader(settings)
    with open_log(settings.log_url) as log, contextlib.closing(jobdb):
        while True:
            if not up.alive():
                raise ExactlyError(f"exactly up stopped; see {up.log}")
            now = watch.take(settings, log, stages, jobdb)
            lags = {stage.name: now.lag(stage) for stage in stages}
            waiting = sum(
                entry.queued + entry.states.get(AWAITING_RETRY, 0)
                for entry in now.deliveries.values()
            )
            if all(lag == 0 for lag in lags.values()) and waiting == 0:
                return
            if shown is None or time.monotonic() - shown >= 5:
                shown = time.monotonic()
                behind = "  ".join(
                    f"{name} {'starting' if lag is None else f'{lag:,}'}"
                    for name, lag in lags.items()
                )
                elapsed = shown - began
                say(wrap(f"  {elapsed:4.0f} s  {behind}  deliver {waiting:,}", " " * 10))
            time.sleep(0.5)


def check_lake(settings: Settings) -> LakeCheck:
    """The lake table counted with DuckDB (``exactly lake sql``) beside the events topic."""
    from exactly.lake import open_table
    from exactly.lake.sql import query

    with open_table(settings.lake_url) as table:
        (counts,) = query(
            table, "select count(*) as n, count(distinct messageId) as d from events"
        ).to_pylist()
        by_event = query(table, LAKE_QUERY)
        segment = []
        if settings.lake.layout == "segment":
            segment = [(text, query(table, text, siblings=True)) for text in SEGMENT_QUERIES]
    events = topic_size(settings.log_url, "events")
    return LakeCheck(table.url, counts["n"], counts["d"], events, by_event, segment)


def _counted(settings: Settings) -> int:
    """Events counted in event_counts so far (0 before the table exists)."""
    from exactly.aggregate import open_db
    from exactly.aggregate.stats import total_events

    with open_db(settings.aggregate_url) as db:
        return total_events(db)
