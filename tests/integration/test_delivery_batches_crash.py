"""Batching destinations under crashes, and a ``segment`` destination feeding a real collector.

``exactly deliver`` is SIGKILLed 20 times, on each JobDB backend (SQLite, PostgreSQL, MariaDB),
while it sends batches to a receiver that flaps between 503 and 200 (packs, the batches the route
query makes: docs/delivery.md) and, in Segment's ``/v1/batch`` format, to a second ``exactly
collect`` (batches the director forms of single jobs). Each kill is recorded with the batches in
flight at it (received, their outcome not recorded: ``tests/requests_in_flight.py``); at least
three quarters of the kills must find one. A receiver may see a batch succeed again only if that
batch was in flight (``executing``) at a kill, once more per such kill, and then whole, under the
same Idempotency-Key; the collector's ``raw`` holds every event, again only for events of such
batches (its dedupe drops those by messageId).
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from exactly.config import load_settings
from exactly.delivery.jobdb import BACKENDS, JobDB, open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, NewJob
from exactly.delivery.packs import packing
from exactly.delivery.route import packed
from tests.integration.collector_server import KEYS, Collector
from tests.jobdb import jobdb_url
from tests.receiver import Receiver
from tests.requests_in_flight import TIMEOUT, RequestKills, executing_batches, received
from tests.seeds import crash_seed

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def config(path: Path, receiver_url: str, collector_url: str | None) -> Path:
    text = f'data_dir = "{path / "data"}"\n'
    text += (
        f'[[destinations]]\nname = "hook"\nurl = "{receiver_url}"\nsecret = "{SECRET}"\n'
        f'timeout = "{TIMEOUT}"\nmax_in_flight = 2\n'
        '[destinations.backoff]\nmin = "50ms"\nmax = "300ms"\n'
        "[destinations.breaker]\nopen_after = 0\n"
        '[destinations.batch]\nmax_events = 10\nmax_wait = "200ms"\n'
    )
    if collector_url is not None:
        auth = base64.b64encode(f"{KEYS['web']}:".encode()).decode()
        text += (
            f'[[destinations]]\nname = "collector"\nurl = "{collector_url}/v1/batch"\n'
            f'timeout = "10s"\nmax_in_flight = 2\nrate = 3\n'
            f'[destinations.headers]\nAuthorization = "Basic {auth}"\n'
            '[destinations.backoff]\nmin = "50ms"\nmax = "300ms"\n'
            '[destinations.batch]\nmax_events = 25\nmax_wait = "200ms"\nformat = "segment"\n'
        )
    config_path = path / "exactly.toml"
    config_path.write_text(text)
    return config_path


def segment_event(i: int) -> bytes:
    return json.dumps(
        {
            "type": "track",
            "event": "Order Completed",
            "userId": f"u{i % 7}",
            "messageId": f"msg-{i:05d}",
            "properties": {"n": i},
            "timestamp": "2026-01-02T03:04:05.000Z",
        }
    ).encode()


def enqueue(db: JobDB, name: str, count: int, *, packed_by: Path | None = None) -> None:
    """``count`` jobs for ``name``; with ``packed_by`` (a config), as the route query adds them
    for that destination (packs of its ``max_events``), else a job per event (the director
    forms the batches)."""
    jobs = [
        NewJob(
            source="web",
            destination=name,
            payload=segment_event(i),
            message_id=f"msg-{i:05d}",
            user_id=f"u{i % 7}",
            expire_at=time.time() + 3600,
        )
        for i in range(count)
    ]
    if packed_by is not None:
        (settings,) = [d for d in load_settings(packed_by).destinations if d.name == name]
        assert packing(settings)
        jobs = packed(jobs, settings)
    db.add(jobs, query_id=f"route-{name}", batch_id=0)


def deliver(config_path: Path, url: str, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "exactly", "--config", str(config_path), "deliver"]
    return subprocess.Popen(
        [*command, "--jobdb", url, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )


def message_ids(body: bytes) -> list[str]:
    document: Any = json.loads(body)
    events = document["batch"] if isinstance(document, dict) else document
    return [event["messageId"] for event in events]


KILLS = 20
JOBS = 600  # hook batches of 10: enough for 20 runs to each find some to send
SEGMENT_JOBS = 300


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_under_20_kills_resend_only_what_was_in_flight_and_whole(
    tmp_path: Path, backend: str
) -> None:
    rng = random.Random(f"batches-crash-{backend}-{crash_seed('34')}")
    kills = RequestKills(f"batches on {backend}")
    in_flight: dict[tuple[str, str], list[str]] = {}  # batches executing at some kill
    with (
        jobdb_url(backend, tmp_path) as url,
        Receiver(delay=0.1) as receiver,
        Collector(tmp_path / "collector") as collector,
    ):
        config_path = config(tmp_path, receiver.url + "/flap", collector.url)
        with open_jobdb(url) as db:
            enqueue(db, "hook", JOBS, packed_by=config_path)  # packs, as the route query makes
            enqueue(db, "collector", SEGMENT_JOBS)  # a job per event: the director batches
        stop = threading.Event()

        def flap() -> None:
            while not stop.wait(rng.uniform(0.1, 0.5)):
                receiver.down = not receiver.down

        flapper = threading.Thread(target=flap, daemon=True)
        flapper.start()
        try:
            while kills.kills < KILLS:
                seen = len(receiver.requests)
                began = time.monotonic()
                process = deliver(config_path, url)
                deadline = time.monotonic() + 60
                while len(receiver.requests) == seen:
                    assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                    assert time.monotonic() < deadline, "no request in 60 s"
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.4))
                assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                killed_at = time.monotonic()
                process.send_signal(signal.SIGKILL)
                process.wait(30)
                with open_jobdb(url) as db:
                    out = executing_batches(db)
                in_flight.update(out)
                # the collector's requests are not seen: only the hook's count for the share
                found = kills.add(received({"hook": receiver}, began, killed_at), out)
                print(f"{backend}: kill {kills.kills}: {len(found)} batches in flight")
        finally:
            stop.set()
            flapper.join(5)
        receiver.down = False
        final = deliver(config_path, url, "--until-drained")
        _, stderr = final.communicate(timeout=300)
        assert final.returncode == 0, stderr.decode()[-2000:]
        with open_jobdb(url) as db:
            assert db.states() == {
                "hook": {SUCCEEDED: JOBS},
                "collector": {SUCCEEDED: SEGMENT_JOBS},
            }
        raw = Counter(json.loads(record.value)["messageId"] for record in collector.records())
    # the receiver: every key always the same members; each event in one batch only
    webhook = Webhook(SECRET)
    members: dict[str, list[str]] = {}
    for request in receiver.requests:
        key = request.headers["webhook-id"]
        assert request.headers["Idempotency-Key"] == key
        webhook.verify(request.body, request.headers)
        assert members.setdefault(key, message_ids(request.body)) == message_ids(request.body)
    every = Counter(message for ids in members.values() for message in ids)
    assert set(every) == {f"msg-{i:05d}" for i in range(JOBS)} and set(every.values()) == {1}
    successes = receiver.successes()
    assert set(successes) == set(members)
    # a batch succeeds again only if it was in flight at a kill, once more per such kill
    again = kills.check_duplicates({"hook": successes})
    # the collector: every event; a copy only of events in batches in flight at a kill, as
    # many as the kills that found their batch executing
    assert set(raw) == {f"msg-{i:05d}" for i in range(SEGMENT_JOBS)}
    out_at_kills: Counter[str] = Counter()
    for (destination, batch), ids in in_flight.items():
        if destination == "collector":
            times = kills.left_executing[destination, batch]
            out_at_kills.update({message: times for message in ids})
    twice = {message: count for message, count in raw.items() if count > 1}
    assert all(count - 1 <= out_at_kills[message] for message, count in twice.items()), twice
    print(
        f"{backend}: {kills.kills} kills, {len(in_flight)} batches executing at the kills, "
        f"{again} received again at the receiver, {len(twice)} events twice in raw; "
        f"{len(members)} receiver batches, {len(receiver.requests)} requests"
    )
    kills.check()  # most kills found a batch in flight


def test_a_segment_destination_feeds_a_second_collector_each_event_once(tmp_path: Path) -> None:
    """``format = "segment"`` to another ``exactly collect``: each event once in its ``raw``,
    with the batch's ``sentAt`` taken as the client's send time."""
    from exactly.delivery.director import Director
    from exactly.delivery.settings import DestinationSettings

    auth = base64.b64encode(f"{KEYS['web']}:".encode()).decode()
    with Collector(tmp_path / "collector") as collector, open_jobdb(f"sqlite://{tmp_path}") as db:
        target = DestinationSettings.model_validate(
            {
                "name": "collector",
                "url": f"{collector.url}/v1/batch",
                "headers": {"Authorization": f"Basic {auth}"},
                "batch": {"max_events": 40, "max_wait": "100ms", "format": "segment"},
            }
        )
        enqueue(db, "collector", 250)
        Director(db, [target], poll_seconds=0.05, report=lambda _: None).run(until_drained=True)
        assert db.states() == {"collector": {SUCCEEDED: 250}}
        events = [json.loads(record.value) for record in collector.records()]
    assert sorted(event["messageId"] for event in events) == [f"msg-{i:05d}" for i in range(250)]
    assert {event["event"] for event in events} == {"Order Completed"}
    assert all(event["sentAt"] for event in events)
