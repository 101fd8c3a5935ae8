"""Many directors on one JobDB (issue 34): 3 ``exactly deliver`` processes share 6 partitions
while 20 SIGKILLs hit them at random (the killed one restarted) and the receiver flaps.

Each request carries ``X-Exactly-Director`` (the sender's pid and a nonce) and each director's
``took partition N`` / ``released partition N`` lines are timed as they arrive, so the test
reads from the receiver's log who sent each bucket's jobs when.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exactly.delivery.jobdb import BACKENDS, JobDB, open_jobdb
from exactly.delivery.jobdb.base import EXECUTING, SUCCEEDED, NewJob
from exactly.delivery.partitions import partition_of
from tests.integration.test_delivery_crash import SECRET, verify
from tests.jobdb import jobdb_url
from tests.receiver import Receiver
from tests.requests_in_flight import TIMEOUT
from tests.seeds import crash_seed

PARTITIONS = 6
DIRECTORS = 3
KILLS = 20
SOURCES = 12
PER_SOURCE = 84  # 1,008 jobs
LEASE = re.compile(rb"(took|released) partition (\d+)")


def config(work: Path, url: str) -> Path:
    path = work / "exactly.toml"
    path.write_text(
        f'data_dir = "{work / "data"}"\n'
        f"[delivery]\npartitions = {PARTITIONS}\n"
        f'[[destinations]]\nname = "hook"\nurl = "{url}"\nsecret = "{SECRET}"\n'
        f'timeout = "{TIMEOUT}"\nmax_in_flight = 6\n'
        '[destinations.backoff]\nmin = "50ms"\nmax = "300ms"\n'
        "[destinations.breaker]\nopen_after = 1000\n"
    )
    return path


@dataclass
class Director:
    """One ``exactly deliver`` process, its lease lines timed on arrival (monotonic)."""

    process: subprocess.Popen[bytes]
    events: list[tuple[float, str, int]] = field(default_factory=list)
    killed_at: float | None = None
    last_lines: deque[bytes] = field(default_factory=lambda: deque(maxlen=20))

    @property
    def pid(self) -> int:
        return self.process.pid

    def read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.last_lines.append(line)
            found = LEASE.search(line)
            if found:
                self.events.append((time.monotonic(), found[1].decode(), int(found[2])))


def start(config_path: Path, url: str) -> Director:
    command = [sys.executable, "-m", "exactly", "--config", str(config_path), "deliver"]
    process = subprocess.Popen(
        [*command, "--jobdb", url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    director = Director(process)
    threading.Thread(target=director.read, daemon=True).start()
    return director


def executing_ids(db: JobDB) -> set[str]:
    return {job.message_id for job in db.jobs_of("hook") if job.state == EXECUTING}


def enqueue(db: JobDB) -> None:
    for batch, source in enumerate(f"s{n}" for n in range(SOURCES)):
        db.add(
            [
                NewJob(
                    source=source,
                    destination="hook",
                    payload=b'{"messageId":"%s-%d"}' % (source.encode(), i),
                    message_id=f"{source}-{i}",
                    expire_at=time.time() + 3600,
                )
                for i in range(PER_SOURCE)
            ],
            query_id="route",
            batch_id=batch,
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", BACKENDS)
def test_three_directors_killed_20_times_while_the_receiver_flaps(
    tmp_path: Path, backend: str
) -> None:
    rng = random.Random(f"directors-{backend}-{crash_seed('34')}")
    began = time.monotonic()
    with jobdb_url(backend, tmp_path) as url, Receiver(delay=0.1) as receiver:
        config_path = config(tmp_path, receiver.url + "/flap")
        with open_jobdb(url) as db:
            enqueue(db)
        expected = {f"s{n}-{i}" for n in range(SOURCES) for i in range(PER_SOURCE)}
        stop_flapping = threading.Event()

        def flap() -> None:
            while not stop_flapping.wait(rng.uniform(0.2, 0.6)):
                receiver.down = not receiver.down

        flapper = threading.Thread(target=flap, daemon=True)
        flapper.start()
        running = [start(config_path, url) for _ in range(DIRECTORS)]
        every = list(running)
        in_flight_at_kills: set[str] = set()
        try:
            deadline = time.monotonic() + 60
            while not receiver.requests:
                assert time.monotonic() < deadline, "no request in 60 s"
                time.sleep(0.05)
            for _ in range(KILLS):
                time.sleep(rng.uniform(0.4, 1.2))
                victim = rng.randrange(DIRECTORS)
                director = running[victim]
                assert director.process.poll() is None, (
                    f"director {director.pid} died: {b''.join(director.last_lines).decode()}"
                )
                director.process.send_signal(signal.SIGKILL)
                director.process.wait(30)
                director.killed_at = time.monotonic()
                with open_jobdb(url) as db:
                    in_flight_at_kills |= executing_ids(db)
                running[victim] = start(config_path, url)
                every.append(running[victim])
            stop_flapping.set()
            flapper.join(5)
            receiver.down = False
            deadline = time.monotonic() + 120
            while True:
                with open_jobdb(url) as db:
                    states = db.states()
                    if states == {"hook": {SUCCEEDED: len(expected)}}:
                        time.sleep(3)  # a heartbeat or two since the last lease changed
                        heartbeats = db.directors()
                        break
                assert time.monotonic() < deadline, f"not drained: {states}"
                time.sleep(0.5)
        finally:
            stop_flapping.set()
            for director in running:
                director.process.send_signal(signal.SIGTERM)
            for director in running:
                try:
                    director.process.wait(30)
                except subprocess.TimeoutExpired:
                    director.process.kill()
                    director.process.wait(10)

        # every job delivered, every copy signed and with the same key
        verify(receiver, "/flap", expected)
        successes = receiver.successes("/flap")
        duplicates = {key for key, count in successes.items() if count > 1}
        assert duplicates <= in_flight_at_kills, duplicates - in_flight_at_kills

        # each partition held by one director at a time, from the receiver's log
        pids = {director.pid: director for director in every}
        senders: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for request in receiver.requests:
            if request.path != "/flap":
                continue
            pid = int(request.headers["X-Exactly-Director"].partition(".")[0])
            assert pid in pids, pid
            source = request.headers["webhook-id"].partition("-")[0]
            senders[partition_of(f"{source}/hook", PARTITIONS)].append((request.at, pid))
        handovers = 0
        for partition, sent in senders.items():
            sent.sort()
            runs: list[tuple[int, float, float]] = []  # (pid, first, last)
            for at, pid in sent:
                if runs and runs[-1][0] == pid:
                    runs[-1] = (pid, runs[-1][1], at)
                else:
                    runs.append((pid, at, at))
            handovers += len(runs) - 1
            for (pid, _, last), (other, first, _) in itertools.pairwise(runs):
                director = pids[pid]
                # the earlier holder was killed, or released the partition, before the next
                # one's first request for it (its lines are timed on arrival: 0.5 s slack)
                gone = director.killed_at if director.killed_at is not None else None
                released = [
                    at
                    for at, kind, number in director.events
                    if kind == "released" and number == partition and at >= last - 0.5
                ]
                ends = [t for t in ([gone] if gone is not None else []) + released]
                assert ends and min(ends) <= first + 0.5, (
                    f"partition {partition}: {other} sent at {first:.3f} while {pid} held it "
                    f"(its last at {last:.3f})"
                )
        # and from the JobDB: the live directors' heartbeats hold disjoint partitions
        live = [
            held
            for name, held, _ in heartbeats
            if int(name.split(":")[1].split(".")[0]) in {d.pid for d in running}
        ]
        flat = [partition for held in live for partition in held]
        assert len(flat) == len(set(flat)), heartbeats
    took = time.monotonic() - began
    print(
        f"{backend}: {KILLS} kills, {len(receiver.requests)} requests, {len(duplicates)} "
        f"duplicates ({len(in_flight_at_kills)} executing at the kills), {handovers} "
        f"handovers, {took:.1f} s"
    )
    assert handovers >= 1


def test_deliveries_lists_the_directors_and_their_partitions(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'data' / 'jobdb'}"
    path = config(tmp_path, "http://127.0.0.1:9/hook")
    with open_jobdb(url) as db:
        enqueue(db)
        now = time.time()
        db.heartbeat("12345@host-a", [0, 1, 2, 5], now)
        db.heartbeat("678@host-b", [3, 4], now - 20)  # not seen for 20 s: counted out
    command = [sys.executable, "-m", "exactly", "--config", str(path), "deliveries"]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    lines = shown.stdout.splitlines()
    assert "directors (2) sharing 6 partitions:" in lines
    assert any(re.match(r"12345@host-a +0-2, 5 +\d s ago$", line) for line in lines), lines
    assert any(re.match(r"678@host-b +3-4 +2\d s ago \(gone\?\)$", line) for line in lines)
    assert max(len(line) for line in lines) <= 80
    listed = subprocess.run(
        [*command, "directors", "--json"], capture_output=True, text=True, timeout=60, check=True
    )
    assert [(d["director"], d["partitions"]) for d in json.loads(listed.stdout)] == [
        ("12345@host-a", [0, 1, 2, 5]),
        ("678@host-b", [3, 4]),
    ]
