"""Backfill killed: a destination added to a running pipeline gets its history once, through its
filter and transform, with ``exactly backfill`` SIGKILLed inside its chunks while the live route
runs beside it, on the SQLite and PostgreSQL JobDBs (MariaDB's runs the same backfill, unkilled,
in ``test_backfill.py``).

1. History (days 20 to 25) is routed to ``pro`` (a filter) by a route run.
2. ``late`` (a filter and a transform beside the config; the transform drops some events and
   fails on others) joins the config, and the live route starts with it while events keep
   arriving (``tests/route_job_child.py``).
3. Meanwhile ``exactly backfill late --since day 22`` runs (``tests/backfill_child.py``) and is
   SIGKILLed :data:`KILLS` times, each 0 to 0.4 s after its first, second or third chunk
   started (so that some runs commit chunks and their reruns go on from there). Each kill is
   recorded as inside a chunk (the chunk's JobDB marker not written) or between two, and at
   least three quarters must land inside.
4. The live route is killed and a last run catches up; a last backfill completes. The command
   ``exactly backfill late --since day 22`` then has nothing to do, and ``exactly backfill late``
   routes the two days before (read again, the ones already routed skipped event by event).
5. One director drains ``late`` to a receiver.

Then, worked out in plain Python: each destination has one job per event it takes (``late``:
history and live events alike; ``pro`` nothing more than its own), the events
filtered, skipped and dropped are counted once, and the receiver got each of ``late``'s
bodies once, as the transform makes it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import FAILED, RouteCounts
from exactly.log import Record, open_log
from tests.batches_in_flight import Landing, Landings
from tests.job_child import FAST_JVM, ROOT, Child
from tests.jobdb import jobdb_url
from tests.receiver import Receiver
from tests.seeds import crash_seed

pytestmark = [pytest.mark.spark, pytest.mark.slow]
KILLS = 10
PARTITIONS = 2
HISTORY = 4000  # events before late joins: 20 chunks of 200
DAY = 86_400_000
SINCE = 1795132800000 + 2 * DAY  # 2026-11-22T00:00:00Z: the killed runs' window
SHAPES = """
def to_crm(event):
    properties = event.get("properties") or {}
    if properties.get("plan") == "free":
        return None
    if event["messageId"].endswith("7"):
        raise ValueError("no crm id for " + event["messageId"])
    return {"id": event["messageId"], "plan": properties.get("plan"), "at": event["receivedAt"]}
"""
DESTINATIONS = {
    "pro": "filter = \"properties.plan = 'pro'\"\n",
    "late": 'filter = "type = \'track\'"\ntransform = "shapes:to_crm"\n',
}


def event(n: int) -> dict[str, Any]:
    """Event ``n``: history over six days from the 20th, then live ones on the 28th."""
    day = 20 + n * 6 // HISTORY if n < HISTORY else 28
    found: dict[str, Any] = {
        "messageId": f"b{n:06d}",
        "type": ("track", "identify", "page")[n % 3],
        "sourceId": "web",
        "userId": f"u{n % 50}",
        "receivedAt": f"2026-11-{day:02d}T{n % 24:02d}:00:00.000Z",
        "properties": {"plan": ("free", "pro", "team")[n // 3 % 3]},
    }
    if n % 3 == 0:
        found["event"] = "Signed Up"
    if n % 11 == 0:
        found["integrations"] = {"late": False} if n % 2 else {"All": False, "late": True}
    return found


def config(path: Path, names: list[str], url: str) -> Path:
    text = f'data_dir = "{path.parent / "data"}"\n[log]\nurl = "sqlite://{path.parent / "log"}"\n'
    for name in names:
        text += f'[[destinations]]\nname = "{name}"\nurl = "{url}/{name}"\n' + DESTINATIONS[name]
    path.write_text(text)
    (path.parent / "shapes.py").write_text(SHAPES)
    return path


class Truth:
    """What each destination must hold, in plain Python: ids, failed ids, bodies and counts."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        namespace: dict[str, Any] = {}
        exec(SHAPES, namespace)  # the test's own transform, as the route imports it
        self.ids: dict[str, set[str]] = {name: set() for name in DESTINATIONS}
        self.failed: set[str] = set()
        self.bodies: dict[str, bytes] = {}
        self.counts: dict[str, RouteCounts] = {}
        for name in DESTINATIONS:
            filtered = skipped = dropped = 0
            for found in events:
                integrations = found.get("integrations")
                if (name == "pro" and found["properties"]["plan"] != "pro") or (
                    name == "late" and found["type"] != "track"
                ):
                    filtered += 1
                elif integrations and not integrations.get(name, integrations.get("All", True)):
                    skipped += 1
                elif name != "late":
                    self.ids[name].add(found["messageId"])
                else:
                    try:
                        body = namespace["to_crm"](found)
                    except ValueError:
                        self.failed.add(found["messageId"])
                        self.ids[name].add(found["messageId"])
                        continue
                    if body is None:
                        dropped += 1
                    else:
                        self.ids[name].add(found["messageId"])
                        self.bodies[found["messageId"]] = orjson.dumps(body)
            if filtered or skipped or dropped:
                self.counts[name] = RouteCounts(filtered, skipped, dropped)


class Events:
    """The log's events, appended from the test: the history, then live ones every 0.25 s."""

    def __init__(self, log_url: str) -> None:
        self.log_url = log_url
        self.written: list[dict[str, Any]] = []
        self.growing = threading.Event()
        self.thread = threading.Thread(target=self._grow, daemon=True)

    def append(self, count: int) -> None:
        with open_log(self.log_url) as log:
            log.create_topic("events", PARTITIONS, exist_ok=True)
            batch = [event(len(self.written) + i) for i in range(count)]
            for partition in range(PARTITIONS):
                values = [orjson.dumps(found) for found in batch[partition::PARTITIONS]]
                log.append("events", partition, [Record(value) for value in values])
            self.written += batch

    def _grow(self) -> None:
        while self.growing.is_set():
            self.append(6)
            time.sleep(0.25)

    def start(self) -> None:
        self.growing.set()
        self.thread.start()

    def stop(self) -> None:
        self.growing.clear()
        self.thread.join(30)


def child(module: str, args: list[str], mode: str = "streaming") -> Child:
    """A crash child of this tree, warming up (``tests/job_child.py``)."""
    path = f"{ROOT / 'src'}:{ROOT}"
    env = {**os.environ, "JDK_JAVA_OPTIONS": FAST_JVM, "PYTHONPATH": path}
    return Child(module, args, env, mode)


def run_through(running: Child, what: str) -> None:
    assert running.wait_for("warm", 240), f"{what} did not start: {running.report()}"
    running.go()
    assert running.wait_for("done", 600), f"{what} did not finish: {running.report()}"
    running.kill()


def started(running: Child, chunk: int, timeout: float = 240) -> bool:
    """Wait until the run started ``chunk`` (or ended: False)."""
    with running.changed:
        running.changed.wait_for(
            lambda: f"started {chunk}" in running.lines or running.saw("<exit>"), timeout
        )
        return f"started {chunk}" in running.lines


def landing(running: Child, marker: int | None) -> Landing:
    """Inside a chunk when the run had started one whose marker it had not written."""
    started = [int(line.split()[1]) for line in running.lines if line.startswith("started ")]
    if started and (marker is None or marker < started[-1]):
        return Landing((f"backfill chunk {started[-1]}",))
    return Landing(())


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])  # MariaDB: test_backfill.py
def test_backfill_killed_beside_the_live_route_gives_each_event_one_job(
    tmp_path: Path, backend: str
) -> None:
    rng = random.Random(f"backfill-{crash_seed('17')}-{backend}")
    with jobdb_url(backend, tmp_path) as jobdb, Receiver() as receiver:
        log_url = f"sqlite://{tmp_path / 'log'}"
        events = Events(log_url)
        events.append(HISTORY)
        checkpoint = str(tmp_path / "checkpoint")
        before = config(tmp_path / "before.toml", ["pro"], receiver.url)
        after = config(tmp_path / "exactly.toml", ["pro", "late"], receiver.url)
        # 1. the history to pro
        run_through(
            child("tests.route_job_child", [str(before), jobdb, checkpoint], "catch-up"), "route"
        )
        # 2. late joins; the live route starts with it as events arrive
        live = child("tests.route_job_child", [str(after), jobdb, checkpoint])
        assert live.wait_for("warm", 240), live.report()
        live.go()
        events.start()
        # 3. backfill, killed inside its chunks
        landings = Landings("backfill", inside_what="inside a chunk")
        args = [str(after), jobdb, "late", str(SINCE)]
        runs: list[Child] = []
        began = time.monotonic()
        try:
            current = child("tests.backfill_child", [*args, "run0"])
            runs.append(current)
            for kill in range(KILLS):
                following = child("tests.backfill_child", [*args, f"run{kill + 1}"])
                runs.append(following)
                assert current.wait_for("warm", 240), current.report()
                current.go()
                chunk = rng.randint(1, 3)  # some runs commit chunks before the kill
                assert started(current, chunk), f"run {kill}: {current.report()}"
                time.sleep(rng.uniform(0.0, 0.4))
                assert not current.saw("<exit>"), f"run {kill} ended: {current.report()}"
                current.kill()
                with open_jobdb(jobdb) as db:
                    marker = db.marker(f"backfill:late:run{kill}")
                found = landings.add(landing(current, marker))
                print(f"backfill kill {kill + 1} at {time.monotonic() - began:.0f} s: {found}")
                current = following
            # 4. the live route killed, then caught up; the last backfill runs through
            events.stop()
            assert live.alive(), live.report()
            live.kill()
            run_through(current, "the last backfill")
        finally:
            events.stop()
            for run in [live, *runs]:
                run.kill()
                run.stderr.close()
        run_through(
            child("tests.route_job_child", [str(after), jobdb, checkpoint], "catch-up"), "route"
        )
        exactly = [sys.executable, "-m", "exactly", "--config", str(after)]
        again = subprocess.run(
            [*exactly, "backfill", "late", "--since", "2026-11-22", "--jobdb", jobdb,
             "--master", "local[2]"],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        assert again.stdout.strip() == "backfill late: nothing to do, every event is routed to it"
        wider = subprocess.run(
            [*exactly, "backfill", "late", "--jobdb", jobdb, "--master", "local[2]"],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        assert wider.returncode == 0, wider.stderr[-3000:]
        told = [line for line in wider.stderr.splitlines() if line.startswith("backfill")]
        assert told and all(len(line) <= 80 for line in told)
        assert "chunk 1 committed, " in wider.stderr
        # 5. late's jobs sent
        drained = subprocess.run(
            [*exactly, "deliver", "--jobdb", jobdb, "--until-drained"],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        assert drained.returncode == 0, drained.stderr[-3000:]

        truth = Truth(events.written)
        with open_jobdb(jobdb) as db:
            for name in DESTINATIONS:
                jobs = Counter(job.message_id for job in db.jobs_of(name, limit=10**7))
                assert set(jobs) == truth.ids[name], name
                assert set(jobs.values()) == {1}, f"{name}: {jobs.most_common(3)}"
            failed = {
                job.message_id for job in db.jobs_of("late", limit=10**7) if job.state == FAILED
            }
            assert failed == truth.failed and failed
            assert db.route_counts() == truth.counts
        got = {
            request.headers["webhook-id"]: request.body
            for request in receiver.requests
            if request.path == "/late"
        }
        assert receiver.successes("/late") == Counter(list(truth.bodies))  # each once
        assert got == truth.bodies
    print(
        f"{len(events.written)} events; late: {len(truth.ids['late'])} jobs "
        f"({len(truth.failed)} failed), not sent {truth.counts.get('late')}"
    )
    landings.check()
