"""The demo run by the README's first command: the whole pipeline so far, on embedded defaults.

1. ``exactly collect`` starts (a subprocess, two sources) and generated clients send Segment
   events through ``/v1/batch``; some batches are sent again, as a client that timed out before
   seeing the answer does, so ``raw`` holds the same messageIds twice;
2. ``dedupe`` (rocksdb) turns ``raw`` into ``events``, dropping the resent copies;
3. ``aggregate`` counts ``events`` into SQLite (``event_counts``);
4. ``audit`` recounts ``events`` with a batch read and compares with the table.

Everything lives under the data dir: the sqlite log, the rocksdb store, the aggregates file and
the checkpoints, so a second run adds to the first.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from exactly.config import Settings
from exactly.errors import ExactlyError
from exactly.urls import redact

EVENT_NAMES = ["Order Completed", "Product Viewed", "Signed Up", "Cart Viewed", "Checkout Started"]
PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
SOURCES = {"web": "demo-web-write-key", "ios": "demo-ios-write-key"}
BATCH = 500


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


class Collector:
    """``exactly collect`` in a subprocess on a free port, stopped with SIGTERM (drains first)."""

    def __init__(self, settings: Settings, partitions: int) -> None:
        self.port = free_port()
        args = [sys.executable, "-m", "exactly", "--data-dir", str(settings.data_dir)]
        args += ["collect", "--port", str(self.port)]
        args += ["--partitions", str(partitions)]
        env = {  # not in argv: ps shows argv
            **os.environ,
            "EXACTLY_LOG__URL": settings.log_url,
            "EXACTLY_COLLECTOR__SOURCES": ",".join(f"{n}={k}" for n, k in SOURCES.items()),
        }
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        deadline = time.monotonic() + 60
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                error = self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.stop()
                raise ExactlyError(f"the collector did not start: {error.strip()[-300:]}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            connection.request("GET", "/health")
            return connection.getresponse().status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def send(
    port: int,
    events: int,
    *,
    seed: int = 0,
    clients: int = 4,
    resend_rate: float = 0.02,
    rate: float | None = None,
    on_sent: Callable[[float, int], None] | None = None,
) -> Traffic:
    """Send ``events`` through ``/v1/batch`` from ``clients`` threads; some batches twice.

    A resent batch is the same request again (same messageIds), as a client whose first attempt
    timed out would send it. ``rate`` (events/s over all clients) paces the clients;
    ``on_sent(started, n)`` is told the start time of each accepted batch of ``n`` new events.
    """
    traffic = Traffic()
    lock = threading.Lock()
    now = time.time()
    per_client = [events // clients + (1 if i < events % clients else 0) for i in range(clients)]

    def client(index: int, count: int) -> None:
        rng = random.Random(f"{seed}-{index}-{now}")
        names = list(SOURCES)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        pending = list(generate_events(count, rng, now))
        began = time.monotonic()
        sent = 0
        for at in range(0, len(pending), BATCH):
            chunk = pending[at : at + BATCH]
            source = names[(at // BATCH + index) % len(names)]
            body = json.dumps({"batch": chunk, "sentAt": chunk[0]["timestamp"]}).encode()
            auth = base64.b64encode(f"{SOURCES[source]}:".encode()).decode()
            headers = {"Content-Type": "application/json", "Authorization": f"Basic {auth}"}
            if rate is not None:
                wait = began + sent / (rate / clients) - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
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
        with lock:
            traffic.distinct += count

    began = time.perf_counter()
    threads = [
        threading.Thread(target=client, args=(i, n), daemon=True) for i, n in enumerate(per_client)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    traffic.seconds = time.perf_counter() - began
    if traffic.failures:
        raise ExactlyError(f"the collector refused a batch: {traffic.failures[0]}")
    return traffic


def topic_size(log_url: str, topic: str) -> int:
    from exactly.errors import UnknownTopic
    from exactly.log import open_log

    with open_log(log_url) as log:
        try:
            return sum(log.end_offsets(topic).values())
        except UnknownTopic:
            return 0


@dataclass
class DemoResult:
    traffic: Traffic
    raw: int = 0  # records added to raw by this run
    events: int = 0  # records added to events by this run
    counted: int = 0  # events the aggregate job counted in this run
    seconds: dict[str, float] = field(default_factory=dict)
    audit: Any = None  # exactly.aggregate.audit.AuditResult
    stats: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def duplicates_dropped(self) -> int:
        return self.raw - self.events


def run_pipeline(
    settings: Settings, events: int, partitions: int, say: Callable[[str], None]
) -> DemoResult:
    """Collector -> raw -> dedupe -> events -> aggregates -> audit; see the module docstring."""
    from exactly.aggregate import open_db
    from exactly.aggregate.audit import run_audit
    from exactly.aggregate.driver import drive
    from exactly.aggregate.frame import check
    from exactly.aggregate.job import AggregatePlan, default_checkpoint
    from exactly.aggregate.spec import EVENT_COUNTS
    from exactly.aggregate.stats import StatsQuery, event_counts
    from exactly.dedupe.job import DedupePlan
    from exactly.dedupe.job import default_checkpoint as dedupe_checkpoint
    from exactly.dedupe.job import prepare as prepare_dedupe
    from exactly.dedupe.job import run as run_dedupe
    from exactly.log import open_log
    from exactly.spark.session import build_session

    raw_before, events_before = (topic_size(settings.log_url, t) for t in ("raw", "events"))
    clock = time.perf_counter()
    shown = redact(settings.log_url)
    say(f"1/4 collector on the embedded log {shown}; sending {events:,} events ...")
    collector = Collector(settings, partitions)
    try:
        traffic = send(collector.port, events)
    finally:
        collector.stop()
    result = DemoResult(traffic)
    result.seconds["collect"] = time.perf_counter() - clock
    result.raw = topic_size(settings.log_url, "raw") - raw_before

    say("2/4 dedupe raw -> events (rocksdb store), Spark starting ...")
    clock = time.perf_counter()
    spark = build_session(settings, app_name="exactly-demo")
    try:
        plan = DedupePlan(
            settings.log_url,
            "rocksdb",
            settings.data_dir,
            dedupe_checkpoint(settings.data_dir, "rocksdb", "raw", "events"),
            until_caught_up=True,
            max_record_bytes=settings.log.max_record_bytes,
            scope=settings.dedupe.scope,
        )
        with open_log(settings.log_url) as log:
            dedupe_partitions = prepare_dedupe(log, plan)
        spark.conf.set("spark.sql.shuffle.partitions", str(dedupe_partitions))
        run_dedupe(spark, plan, dedupe_partitions)
        result.seconds["dedupe"] = time.perf_counter() - clock
        result.events = topic_size(settings.log_url, "events") - events_before

        say(f"3/4 aggregate events -> {redact(settings.aggregate_url)} ...")
        clock = time.perf_counter()
        aggregate = AggregatePlan(
            settings.log_url,
            default_checkpoint(settings.data_dir, "events"),
            until_caught_up=True,
        )
        with open_db(settings.aggregate_url, say=say) as db:
            progress = drive(spark, aggregate, db, say=lambda _line: None)
            result.counted = progress.events
            result.seconds["aggregate"] = time.perf_counter() - clock
            result.stats = event_counts(db, StatsQuery(by="hour", limit=40))

            say("4/4 audit: recounting events with a batch read ...")
            clock = time.perf_counter()
            result.audit = run_audit(
                spark, settings.log_url, "events", db, check(spark, [EVENT_COUNTS])
            )
            result.seconds["audit"] = time.perf_counter() - clock
    finally:
        spark.stop()
    return result
