"""Destinations that choose and shape what they get: ``filter``, ``transform`` and Segment's
``integrations`` object, in the real route query over a real log and each JobDB backend.

The expected jobs and counts are worked out here in plain Python from the events as JSON,
sharing no code with the route (the integrations rule and the filter are written again; the
transform is the same user module, imported directly).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from exactly.delivery.choosing import Choosing
from exactly.delivery.jobdb.base import FAILED, RouteCounts
from exactly.delivery.route import RoutePlan, drive
from exactly.delivery.settings import DestinationSettings
from exactly.errors import ConfigError
from exactly.log import open_log
from exactly.log.base import Record
from tests.job_child import FAST_JVM

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.delivery.jobdb import JobDB

pytestmark = pytest.mark.spark

PARTITIONS = 2
SHAPES = '''
def to_crm(event):
    """The test's transform: drops free plans, fails on two kinds of event, renames the rest."""
    properties = event.get("properties") or {}
    if properties.get("plan") == "free":
        return None
    number = int(event["messageId"][1:])
    if number % 10 == 7:
        raise ValueError(f"boom on {number}\\nsecond line")
    if number % 10 == 3:
        return {"seats": {1, 2}}  # a set: not JSON
    if number % 10 == 9:
        return [event["messageId"]]  # not a dict
    return {"id": event["messageId"], "what": event.get("event"), "plan": properties.get("plan")}
'''
INTEGRATIONS = (
    {"All": False, "pro": True},
    {"shaped": False},
    {"shaped": {"option": 1}},
    {"SHAPED": False},
    {"All": False},
    {"hears": True, "All": False},
)


def destinations(directory: Path) -> tuple[DestinationSettings, ...]:
    return (
        DestinationSettings(name="everyone", url="http://127.0.0.1:9/e", ignore_integrations=True),
        DestinationSettings(
            name="pro",
            url="http://127.0.0.1:9/p",
            filter="properties.plan = 'pro' or properties.revenue > 100",
        ),
        DestinationSettings(
            name="pricing",
            url="http://127.0.0.1:9/pr",
            sources=("web",),
            filter="context.page.url like '%/pricing%'",
        ),
        DestinationSettings(
            name="shaped",
            url="http://127.0.0.1:9/s",
            filter="type = 'track'",
            transform="shapes:to_crm",
            transform_dir=str(directory),
        ),
        DestinationSettings(name="hears", url="http://127.0.0.1:9/h"),
    )


def make_events(count: int) -> list[dict[str, Any]]:
    rng = random.Random(11)
    events = []
    for n in range(count):
        kind = ("track", "identify", "page")[n % 3]
        event: dict[str, Any] = {
            "messageId": f"m{n:05d}",
            "type": kind,
            "sourceId": "ios" if n % 4 == 0 else "web",
            "userId": f"u{n % 40}",
            "receivedAt": "2026-11-28T12:00:00.000Z",
            "properties": {
                "plan": rng.choice(["free", "pro", "team"]),
                "revenue": rng.choice([12.5, "150.25", "n/a", 300, None, {"a": 1}, True, "99"]),
            },
        }
        if kind == "track":
            event["event"] = rng.choice(["Order Completed", "Signed Up"])
        if kind == "page":
            url = rng.choice(["https://x.test/pricing?a=1", "https://x.test/home"])
            event["context"] = {"page": {"url": url}}
        if n % 5 == 0:
            event["integrations"] = INTEGRATIONS[(n // 5) % len(INTEGRATIONS)]
        events.append(event)
    return events


def revenue(value: Any) -> float | None:
    """What ``try_cast(text as double)`` makes of the property's JSON."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def lets(integrations: dict[str, Any] | None, name: str) -> bool:
    """Segment's rule, written again: a key set to false, or no key and All false, refuses."""
    if integrations is None:
        return True
    if name in integrations and integrations[name] is not None:
        return integrations[name] is not False
    return integrations.get("All") is not False


def chooses(name: str, event: dict[str, Any]) -> bool:
    properties = event["properties"]
    if name == "pro":
        found = revenue(properties.get("revenue"))
        return properties["plan"] == "pro" or (found is not None and found > 100)
    if name == "pricing":
        url = event.get("context", {}).get("page", {}).get("url", "")
        return event["sourceId"] == "web" and "/pricing" in url
    if name == "shaped":
        return event["type"] == "track"
    return True


def load_shapes(directory: Path) -> Any:
    spec = importlib.util.spec_from_file_location("shapes_for_the_test", directory / "shapes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.to_crm


def expected(
    events: list[dict[str, Any]], directory: Path
) -> tuple[Counter[tuple[str, str, bytes]], set[tuple[str, str]], dict[str, RouteCounts]]:
    """(destination, message id, payload) of each job to send; (destination, message id) of
    each failed job; and the counts of events not sent, per destination."""
    to_crm = load_shapes(directory)
    jobs: Counter[tuple[str, str, bytes]] = Counter()
    failed: set[tuple[str, str]] = set()
    counts: dict[str, RouteCounts] = {}
    for destination in destinations(directory):
        name = destination.name
        filtered = skipped = dropped = 0
        for event in events:
            stored = orjson.dumps(event)
            if not chooses(name, event):
                filtered += 1
            elif not destination.ignore_integrations and not lets(event.get("integrations"), name):
                skipped += 1
            elif name != "shaped":
                jobs[(name, event["messageId"], stored)] += 1
            else:
                try:
                    body = to_crm(json.loads(stored))
                    encoded = None if not isinstance(body, dict) else orjson.dumps(body)
                except Exception:  # noqa: BLE001 (the failing events of the transform)
                    encoded, body = None, "failed"
                if body is None:
                    dropped += 1
                elif encoded is None:
                    failed.add((name, event["messageId"]))
                else:
                    jobs[(name, event["messageId"], encoded)] += 1
        if filtered or skipped or dropped:  # a destination that misses nothing has no row
            counts[name] = RouteCounts(filtered, skipped, dropped)
    return jobs, failed, counts


def stored_jobs(db: JobDB) -> tuple[Counter[tuple[str, str, bytes]], set[tuple[str, str]]]:
    sent: Counter[tuple[str, str, bytes]] = Counter()
    failed: set[tuple[str, str]] = set()
    for bucket in db.buckets():
        for job in db.pending(bucket, limit=10**6):
            sent[(job.destination, job.message_id, job.payload)] += 1
    for name in ("shaped",):
        for job in db.jobs_of(name, limit=10**6):
            if job.state == FAILED:
                failed.add((name, job.message_id))
    return sent, failed


def route(spark: SparkSession, log_url: str, db: JobDB, checkpoint: Path, directory: Path) -> Any:
    plan = RoutePlan(
        log_url,
        checkpoint,
        destinations(directory),
        until_caught_up=True,
        read_records=200,
        max_records_per_trigger=250,
    )
    return drive(spark, plan, db, say=lambda _: None)


def test_filters_transforms_and_integrations_choose_and_shape_each_job_once(
    spark: SparkSession, tmp_path: Path, jobdb: JobDB
) -> None:
    (tmp_path / "config").mkdir()
    directory = tmp_path / "config"
    (directory / "shapes.py").write_text(SHAPES)
    log_url = f"sqlite://{tmp_path / 'log'}"
    events = make_events(600)
    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS)
        for partition in range(PARTITIONS):
            values = [orjson.dumps(event) for event in events[partition::PARTITIONS]]
            log.append("events", partition, [Record(value) for value in values])
    checkpoint = tmp_path / "checkpoint"

    first = route(spark, log_url, jobdb, checkpoint, directory)
    assert len(first.batches) >= 3 and first.replays == 0
    jobs, failed, counts = expected(events, directory)
    sent, stored_failed = stored_jobs(jobdb)
    assert sent == jobs
    assert stored_failed == failed and len(failed) > 10
    assert jobdb.route_counts() == counts
    assert all(counts[name].filtered and counts[name].skipped for name in ("pro", "pricing"))
    assert counts["hears"].skipped and counts["shaped"].filtered and "everyone" not in counts
    assert counts["shaped"].dropped > 10
    # a failed job says why in one line, and exactly deliveries shows the last of them
    lines = {
        transition.response
        for message in ("m00007", "m00013", "m00019")
        for job, transitions in jobdb.jobs_with(message)
        if job.destination == "shaped"
        for transition in transitions
    }
    assert {line.split(":")[0] for line in lines if line} <= {
        "ValueError",
        "TypeError",
        "the transform returned list, not a dict",
    }
    assert all("\n" not in (line or "") for line in lines)
    summary = jobdb.summary()["shaped"]
    assert summary.states[FAILED] == len(failed) and summary.withheld == counts["shaped"]
    assert summary.last_error is not None and summary.last_error.startswith("transform")

    # a replayed micro-batch (its commit lost) adds no job and no count
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replayed = route(spark, log_url, jobdb, checkpoint, directory)
    assert replayed.replays == 1 and replayed.jobs == 0
    assert stored_jobs(jobdb) == (jobs, failed)
    assert jobdb.route_counts() == counts
    # the route turned ANSI off on its own (cloned) session only
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"


def test_top_level_filters_and_the_integrations_rule_read_in_the_source_as_from_json(
    spark: SparkSession, tmp_path: Path
) -> None:
    """With no filter naming an object, the source reads the routed fields in its Python worker
    (the filters' ``source_fields``), ``from_json`` only what it cannot be sure of: the jobs
    are the ones the rule and the filter, written again here, choose. (The JobDB only stores
    them: one backend.)"""
    from exactly.delivery.jobdb import open_jobdb

    chosen = (
        DestinationSettings(name="everyone", url="http://127.0.0.1:9/e", ignore_integrations=True),
        DestinationSettings(name="tracks", url="http://127.0.0.1:9/t", filter="type = 'track'"),
        DestinationSettings(name="hears", url="http://127.0.0.1:9/h", filter="userId != 'u7'"),
        DestinationSettings(name="shaped", url="http://127.0.0.1:9/s"),
    )
    choosing = Choosing.compile(spark, chosen)
    reading = choosing.source_reading()
    assert reading["keepValues"] == "true"
    assert ["integrations", "map", ["All", "hears", "shaped", "tracks"]] in json.loads(
        reading["fields"]
    )
    for named in ("properties.plan = 'pro'", "integrations['x'] = 'false'", "context is null"):
        with_object = (DestinationSettings(name="d", url="http://127.0.0.1:9/d", filter=named),)
        assert Choosing.compile(spark, with_object).source_reading() == {}
    events = make_events(600)
    for n, event in enumerate(events[::7]):  # null values: still read by the source
        event["integrations"] = ({"hears": None, "All": False}, {"All": None}, {})[n % 3]
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS)
        for partition in range(PARTITIONS):
            values = [orjson.dumps(event) for event in events[partition::PARTITIONS]]
            log.append("events", partition, [Record(value) for value in values])
    read = spark.read.format("exactly").options(log=log_url, topic="events", **reading).load()
    assert read.where("fields is not null").count() > 400  # most read by the source
    assert read.where("value is null").count() == 0  # every payload kept
    plan = RoutePlan(
        log_url, tmp_path / "checkpoint", chosen, until_caught_up=True, read_records=200
    )
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}") as jobdb:
        drive(spark, plan, jobdb, say=lambda _: None)
        stored = stored_jobs(jobdb)[0]
    jobs: Counter[tuple[str, str, bytes]] = Counter()
    for destination in chosen:
        for event in events:
            takes = {"tracks": event["type"] == "track", "hears": event["userId"] != "u7"}
            rule = destination.ignore_integrations or lets(
                event.get("integrations"), destination.name
            )
            if takes.get(destination.name, True) and rule:
                jobs[(destination.name, event["messageId"], orjson.dumps(event))] += 1
    assert stored == jobs


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("x ==== 2", "destinations[0] (crm).filter: [PARSE_SYNTAX_ERROR] Syntax error"),
        ("1 = 1", "names no field of the event"),
        ("userid = 'a'", "events have no field 'userid'"),
        ("type", "'type' is a string, not a condition"),
        ("type.page = 'a'", "destinations[0] (crm).filter: [INVALID_EXTRACT_BASE_FIELD_TYPE]"),
        ("properties.plan = ", "[PARSE_SYNTAX_ERROR]"),
        ("nosuchfunction(type)", "[UNRESOLVED_ROUTINE]"),
    ],
)
def test_a_filter_that_cannot_run_is_refused_at_start_in_one_line(
    spark: SparkSession, text: str, says: str
) -> None:
    crm = DestinationSettings(name="crm", url="http://127.0.0.1:9/c", filter=text)
    with pytest.raises(ConfigError) as raised:
        Choosing.compile(spark, [crm])
    assert says in str(raised.value)
    assert str(raised.value).startswith("destinations[0] (crm).filter: ")
    assert "\n" not in str(raised.value) and "SQLSTATE" not in str(raised.value)


@pytest.mark.parametrize(
    ("module", "transform", "says"),
    [
        ("", "shapes:to_crm", "shapes.py is not in"),
        ("def other(event):\n    return event\n", "shapes:to_crm", "shapes has no to_crm"),
        ("to_crm = 3\n", "shapes:to_crm", "shapes.to_crm is not a function"),
        ("raise RuntimeError('no config')\n", "shapes:to_crm", "RuntimeError: no config"),
    ],
)
def test_a_transform_that_cannot_load_is_refused_at_start_in_one_line(
    spark: SparkSession, tmp_path: Path, module: str, transform: str, says: str
) -> None:
    directory = tmp_path / f"t{abs(hash(module))}"
    directory.mkdir()
    if module:
        (directory / "shapes.py").write_text(module)
    crm = DestinationSettings(
        name="crm", url="http://127.0.0.1:9/c", transform=transform, transform_dir=str(directory)
    )
    with pytest.raises(ConfigError) as raised:
        Choosing.compile(spark, [crm])
    assert str(raised.value).startswith("destinations[0] (crm).transform: ")
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_exactly_transform_prints_what_a_destination_would_get(tmp_path: Path) -> None:
    (tmp_path / "shapes.py").write_text(SHAPES)
    config = tmp_path / "exactly.toml"
    config.write_text(
        '[[destinations]]\nname = "shaped"\nurl = "http://127.0.0.1:9/s"\n'
        "filter = \"type = 'track' and properties.revenue > 100\"\n"
        'transform = "shapes:to_crm"\n'
    )
    events = [
        {"messageId": "m00001", "type": "track", "properties": {"plan": "pro", "revenue": "150"}},
        {"messageId": "m00002", "type": "track", "properties": {"plan": "pro", "revenue": 5}},
        {"messageId": "m00004", "type": "track", "properties": {"plan": "free", "revenue": 500}},
        {"messageId": "m00007", "type": "track", "properties": {"plan": "pro", "revenue": 500}},
        {
            "messageId": "m00008",
            "type": "track",
            "properties": {"revenue": 500},
            "integrations": {"All": False},
        },
    ]
    lines = [json.dumps(event) for event in events] + ["[1, 2]"]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "exactly", "--config", str(config), "transform", "shaped"]
    done = subprocess.run(
        [*command, str(tmp_path / "events.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM},
    )
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line.get("messageId"), line["outcome"]) for line in printed] == [
        ("m00001", "sent"),
        ("m00002", "filtered"),
        ("m00004", "dropped"),
        ("m00007", "failed"),
        ("m00008", "skipped"),
        (None, "invalid"),
    ]
    assert printed[0]["body"] == {"id": "m00001", "what": None, "plan": "pro"}
    assert printed[3]["error"].startswith("ValueError: boom on 7")
    assert printed[5]["error"] == "line 6 is not a JSON object"


def test_exactly_up_stops_at_once_on_a_filter_it_cannot_run(tmp_path: Path) -> None:
    """The pipeline part refuses the filter in one line, and ``up`` stops with it at its first
    death, not after the restarts a crash gets."""
    from tests.servers import free_port

    config = tmp_path / "exactly.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[console]\nport = 0\n'
        f'[collector]\nport = {free_port()}\n[collector.sources]\nweb = "key-0123"\n'
        '[[destinations]]\nname = "crm"\nurl = "http://127.0.0.1:9/c"\nfilter = "userid = \'a\'"\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "exactly", "--config", str(config), "up", "--no-live"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM},
    )
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 1, stderr
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(said) == 1, stderr
    assert "the pipeline part refused the configuration" in said[0]
    assert "events have no field 'userid'" in stderr
    assert "times in a row" not in stderr
