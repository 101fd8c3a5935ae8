"""``exactly forget`` after ``exactly up`` delivered, counted and landed a person's events among
others'.

On the embedded defaults, no byte of the data dir holds anything of them afterwards, and what
they send later is suppressed. Every file under the data dir is read as bytes, gzip files
decompressed and Parquet files read whole (their pages are compressed), and searched for the
person's ids, traits, properties and context. Everybody else's events stay: delivered, counted
(``exactly audit`` passes) and landed.

On the scale-out stack (Kafka, Redis, PostgreSQL), the same holds of every row of every table in
the PostgreSQL schema, and a lake rebuilt from the broker's records (which no broker rewrites)
holds none of the person's.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.receiver import Receiver
from tests.servers import RedisServer
from tests.up_service import WRITE_KEY, Clients, Stack, UpService, counted, write_config

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
ALICE, ALICE_ANONYMOUS = "alice-uid-7f3a91", "anon-alice-5c2e08"
SECRETS = (  # what Alice's events carry that nobody else's does
    ALICE,
    ALICE_ANONYMOUS,
    "alice@example.com",
    "Alice Liddell",
    "12 Wonderland Road",
    "203.0.113.77",
)
BOB = "bob-uid-44d2e1"
BOB_SECRETS = (BOB, "bob@example.org", "Bob the Builder")


def bob(count: int) -> list[dict[str, Any]]:
    """Bob's events, forgotten while `up` runs."""
    return [
        {
            "messageId": f"bob-{uuid.uuid4()}",
            "type": "identify" if n % 2 else "track",
            "userId": BOB,
            "event": "Order Completed",
            "traits": {"email": "bob@example.org", "name": "Bob the Builder"},
            "properties": {"revenue": 3, "contact": "bob@example.org"},
        }
        for n in range(count)
    ]


def alice(count: int, prefix: str = "") -> list[dict[str, Any]]:
    """Alice's events: identifies with traits, tracks with properties, pages with context."""
    events: list[dict[str, Any]] = []
    for n in range(count):
        base: dict[str, Any] = {
            "messageId": f"{prefix}alice-{uuid.uuid4()}",
            "anonymousId": ALICE_ANONYMOUS,
            "context": {"ip": "203.0.113.77", "traits": {"email": "alice@example.com"}},
        }
        if n % 3 == 0:
            base |= {"type": "identify", "userId": ALICE,
                     "traits": {"email": "alice@example.com", "name": "Alice Liddell"}}  # fmt: skip
        elif n % 3 == 1:
            base |= {"type": "track", "userId": ALICE, "event": "Order Completed",
                     "properties": {"revenue": 12.5, "street": "12 Wonderland Road"}}  # fmt: skip
        else:
            url = "https://x.test/pricing?who=alice@example.com"
            base |= {"type": "page", "name": "Pricing", "properties": {"url": url}}
        events.append(base)
    return events


def post(port: int, events: list[dict[str, Any]]) -> None:
    auth = base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(
            "POST",
            "/v1/batch",
            json.dumps({"batch": events}).encode(),
            {"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
        )
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
    finally:
        connection.close()


def post_once_up(service: UpService, events: list[dict[str, Any]]) -> None:
    """:func:`post`, tried again until ``up`` has started its collector (at most 180 s)."""
    deadline = time.monotonic() + 180
    while True:
        try:
            post(service.port, events)
            return
        except (OSError, AssertionError):
            assert time.monotonic() < deadline, service.stderr()[-3000:]
            time.sleep(0.5)


def traces(data_dir: Path, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """Where the data dir still holds one of ``secrets``: ``path: secret``."""
    found = []
    for path in sorted(data_dir.rglob("*")):
        if not path.is_file():
            continue
        contents = [path.read_bytes()]
        if path.suffix == ".gz":
            contents.append(gzip.decompress(contents[0]))
        if path.suffix == ".parquet":
            contents.append(json.dumps(pq.read_table(path).to_pylist(), default=str).encode())
        for secret in secrets:
            if any(secret.encode() in content for content in contents):
                found.append(f"{path.relative_to(data_dir)}: {secret}")
    return found


def exactly(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EXACTLY_CONFIG": str(config), "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def lake_ids(data_dir: Path) -> set[str]:
    """The messageIds in the data dir's Delta lake."""
    return delta_ids(data_dir / "lake" / "events")


def delta_ids(lake: Path) -> set[str]:
    """The messageIds in the Delta table at ``lake``; none before its first commit (the lake
    query creates the table's folder before it writes the table's first version)."""
    from deltalake import DeltaTable

    if not any((lake / "_delta_log").glob("*.json")):
        return set()
    table = DeltaTable(str(lake))
    return set(table.to_pyarrow_table(columns=["messageId"]).column("messageId").to_pylist())


@pytest.mark.timeout(900)
def test_a_forgotten_person_leaves_no_byte_in_the_data_dir_and_is_suppressed_after(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with Receiver() as receiver:
        config = write_config(tmp_path, receiver.url)
        lake = data_dir / "lake" / "events"
        config.write_text(config.read_text() + f'\n[lake]\nurl = "delta://{lake}"\n')
        service = UpService(config, tmp_path)
        service.start()
        try:
            others = Clients(service.port, batches=6, size=20).start()
            hers = alice(12)
            post_once_up(service, hers)
            assert others.wait(180), "the clients could not send"
            everyone = others.ids | {event["messageId"] for event in hers}
            deadline = time.monotonic() + 300
            while not (
                set(receiver.successes("/ok")) >= everyone
                and counted(data_dir) >= len(everyone)
                and lake_ids(data_dir) >= everyone
            ):
                assert time.monotonic() < deadline, service.stderr()[-3000:]
                assert service.alive(), service.stderr()[-3000:]
                time.sleep(1)
            code, _ = service.terminate()
            assert code == 0, service.stderr()[-3000:]
        finally:
            service.kill()
        assert traces(data_dir), "the person was never stored: the test proves nothing"

        # forget Alice, with nothing running: the command clears every store itself
        done = exactly(config, "forget", ALICE, "--anonymous-id", ALICE_ANONYMOUS)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.startswith("forgotten: regulation "), done.stdout
        for store in ("files", "jobdb", "archive", "lake", "log"):
            assert f"forget: {store}: done" in done.stderr, done.stderr
        assert traces(data_dir) == []
        status = exactly(config, "forget", "--status")
        assert status.returncode == 0 and " done" in status.stdout.splitlines()[0], status.stdout
        # everybody else's events stay: landed, and counted exactly (Alice's as counts only)
        assert lake_ids(data_dir) == others.ids
        audit = exactly(config, "audit")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert counted(data_dir) == len(everyone)

        # what Alice sends later is suppressed: never stored, delivered, counted or landed; and
        # Bob is forgotten while `up` runs: its lake query and director apply it
        service.start()
        try:
            later = alice(3, prefix="later-")
            post_once_up(service, later)
            his = bob(6)
            post(service.port, his)
            more = Clients(service.port, batches=1, size=10, prefix="more-").start()
            assert more.wait(60)
            wanted = more.ids | {event["messageId"] for event in his}
            deadline = time.monotonic() + 300
            while not (set(receiver.successes("/ok")) >= wanted and lake_ids(data_dir) >= wanted):
                assert time.monotonic() < deadline, service.stderr()[-3000:]
                time.sleep(1)
            assert traces(data_dir, BOB_SECRETS)
            running = exactly(config, "forget", BOB)
            assert running.returncode == 0, running.stderr[-3000:]
            for store in ("jobdb", "archive", "lake"):
                assert f"forget: {store}: done by its running part" in running.stderr
            code, _ = service.terminate()
            assert code == 0, service.stderr()[-3000:]
        finally:
            service.kill()
        assert not {e["messageId"] for e in later} & set(receiver.successes("/ok"))
        assert traces(data_dir) == []
        assert traces(data_dir, BOB_SECRETS) == []
        assert lake_ids(data_dir) == others.ids | more.ids
        audit = exactly(config, "audit")
        assert audit.returncode == 0, audit.stdout + audit.stderr


def rows_holding(database: str, secrets: tuple[str, ...] = SECRETS) -> list[str]:
    """Where the rows of every table in ``database``'s schema (the aggregates, the JobDB, the
    lake table) still hold one of ``secrets``, as text or as bytes: ``table: secret``."""
    import psycopg

    found = []
    with psycopg.connect(database) as connection:
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        ]
        for table in tables:
            for (row,) in connection.execute(f'SELECT t::text FROM "{table}" t'):
                for secret in secrets:
                    # a bytea column (the JobDB's payloads) reads as \x and lower-case hex
                    if secret in row or secret.encode().hex() in row:
                        found.append(f"{table}: {secret}")
    return sorted(set(found))


def table_ids(url: str) -> set[str]:
    """The messageIds of a lake table in PostgreSQL (``...&table=NAME``)."""
    import psycopg

    database, _, table = url.partition("&table=")
    with psycopg.connect(database) as connection:
        try:
            return {row[0] for row in connection.execute(f'SELECT "messageId" FROM "{table}"')}
        except psycopg.errors.UndefinedTable:
            return set()


@pytest.mark.kafka
@pytest.mark.timeout(900)
def test_a_forget_on_the_scale_out_stack_leaves_no_row_and_no_reader_of_kafka_brings_it_back(
    tmp_path: Path, scale_out: tuple[Stack, RedisServer]
) -> None:
    """The log on a Kafka-protocol broker, the aggregates, the JobDB and the lake table in
    PostgreSQL: Alice is forgotten while ``up`` runs. No row of any table holds her, nor any
    byte of the data dir; the broker keeps her records (no broker rewrites one), and a lake
    rebuilt from them afterwards skips her."""
    backends, _ = scale_out
    lake = f"{backends.database}&table=lake_events"
    data_dir = tmp_path / "data"
    with Receiver() as receiver:
        config = write_config(tmp_path, receiver.url, scale_out=backends)
        config.write_text(config.read_text() + f'\n[lake]\nurl = "{lake}"\n')
        service = UpService(config, tmp_path)
        service.start()
        try:
            others = Clients(service.port, batches=4, size=20).start()
            hers = alice(12)
            post_once_up(service, hers)
            assert others.wait(180), "the clients could not send"
            everyone = others.ids | {event["messageId"] for event in hers}
            deadline = time.monotonic() + 300
            while not (
                set(receiver.successes("/ok")) >= everyone
                and counted(backends.database) >= len(everyone)
                and table_ids(lake) >= everyone
            ):
                assert time.monotonic() < deadline, service.stderr()[-3000:]
                assert service.alive(), service.stderr()[-3000:]
                time.sleep(1)
            assert rows_holding(backends.database), (
                "Alice was never stored: the test proves nothing"
            )
            done = exactly(config, "forget", ALICE, "--anonymous-id", ALICE_ANONYMOUS)
            assert done.returncode == 0, done.stderr[-3000:]
            for store in ("jobdb", "archive", "lake"):
                assert f"forget: {store}: done by its running part" in done.stderr, done.stderr
            assert "records kept by the broker until retention" in done.stderr, done.stderr
            code, _ = service.terminate()
            assert code == 0, service.stderr()[-3000:]
        finally:
            service.kill()
        assert rows_holding(backends.database) == []
        assert traces(data_dir) == []
        assert table_ids(lake) == others.ids
        audit = exactly(config, "audit")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert counted(backends.database) == len(everyone)

        # Kafka still holds her events; a lake rebuilt from the start of `events` skips them
        from exactly.log import open_log

        with open_log(backends.log) as log:
            held = [
                record.value
                for partition in log.end_offsets("events")
                for batch in log.read_range("events", partition, 0)
                for record in batch
            ]
        assert any(ALICE.encode() in value for value in held), "the broker dropped her records"
        rebuilt = tmp_path / "rebuilt" / "events"  # the layout's tables beside, in rebuilt/
        run = exactly(
            config,
            "lake",
            "--table",
            f"delta://{rebuilt}",
            "--checkpoint",
            str(tmp_path / "rebuild"),
            "--until-caught-up",
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert delta_ids(rebuilt) == others.ids
        assert traces(tmp_path / "rebuilt") == []
        assert rows_holding(backends.database) == []
