"""``exactly deliver`` as a process: killed with SIGKILL at random points, and two directors.

Kill counts are asserted: the crash test kills 20 times on each JobDB backend (SQLite, PostgreSQL,
MariaDB), each kill once requests are out. Each kill is recorded with the requests in flight at
it (received by a receiver, their outcome not recorded: ``tests/requests_in_flight.py``); at
least three quarters of each backend's kills must find one, and a message may succeed twice only
if it was ``executing`` at a kill, once more for each such kill (the only duplicate window).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from exactly.delivery.jobdb import BACKENDS, JobDB, open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, NewJob
from tests.jobdb import jobdb_url
from tests.receiver import Receiver
from tests.requests_in_flight import TIMEOUT, RequestKills, executing, received
from tests.seeds import crash_seed

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def config(
    tmp_path: Path, receivers: dict[str, str], *, max_in_flight: int = 4, breaker: int = 20
) -> Path:
    path = tmp_path / "exactly.toml"
    text = f'data_dir = "{tmp_path / "data"}"\n'
    for name, url in receivers.items():
        text += (
            f'[[destinations]]\nname = "{name}"\nurl = "{url}"\nsecret = "{SECRET}"\n'
            f'timeout = "{TIMEOUT}"\nmax_in_flight = {max_in_flight}\n'
            '[destinations.backoff]\nmin = "50ms"\nmax = "300ms"\n'
            f"[destinations.breaker]\nopen_after = {breaker}\n"
        )
    path.write_text(text)
    return path


def enqueue(db: JobDB, name: str, url: str, count: int) -> None:
    db.add(
        [
            NewJob(
                source="web",
                destination=name,
                payload=b'{"messageId":"%s-%d"}' % (name.encode(), i),
                message_id=f"{name}-{i}",
                expire_at=time.time() + 3600,
            )
            for i in range(count)
        ],
        query_id=f"route-{name}",
        batch_id=0,
    )


def deliver(config_path: Path, url: str, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "exactly", "--config", str(config_path), "deliver"]
    return subprocess.Popen(
        [*command, "--jobdb", url, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )


def verify(receiver: Receiver, path: str, expected: set[str]) -> None:
    webhook = Webhook(SECRET)
    got = [r for r in receiver.requests if r.path == path]
    assert {r.headers["webhook-id"] for r in got if 200 <= r.status < 300} == expected
    for request in got:
        assert request.headers["Idempotency-Key"] == request.headers["webhook-id"]
        assert (
            webhook.verify(request.body, request.headers)["messageId"]
            == (request.headers["webhook-id"])
        )


@dataclass
class CrashReport:
    backend: str
    requests: RequestKills
    duplicates: int = 0

    @property
    def kills(self) -> int:
        return self.requests.kills


def crash_deliver(backend: str, work: Path, seed: str) -> CrashReport:
    """``exactly deliver`` on a JobDB of ``backend``, SIGKILLed 20 times while sending.

    Each run is killed once the receivers have seen a request of its own, a moment later (0 to
    0.3 s), so most kills find requests out; two receivers, one flapping between 503 and 200.
    """
    rng = random.Random(f"deliver-crash-{backend}-{seed}")
    report = CrashReport(backend, RequestKills(f"deliver on {backend}"))
    work.mkdir(parents=True)
    with (
        jobdb_url(backend, work) as url,
        Receiver(delay=0.05) as steady,
        Receiver(delay=0.02) as flapping,
    ):
        paths = {"steady": "/ok", "flapping": "/flap"}
        urls = {"steady": steady.url + "/ok", "flapping": flapping.url + "/flap"}
        config_path = config(work, urls)
        with open_jobdb(url) as db:
            for name, target in urls.items():
                enqueue(db, name, target, JOBS)
        stop_flapping = threading.Event()

        def flap() -> None:
            while not stop_flapping.wait(rng.uniform(0.1, 0.5)):
                flapping.down = not flapping.down

        flapper = threading.Thread(target=flap, daemon=True)
        flapper.start()
        try:
            while report.kills < KILLS:
                seen = len(steady.requests) + len(flapping.requests)
                began = time.monotonic()
                process = deliver(config_path, url)
                deadline = time.monotonic() + 60
                while len(steady.requests) + len(flapping.requests) == seen:
                    assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                    assert time.monotonic() < deadline, f"{backend}: no request in 60 s"
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.3))
                assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
                killed_at = time.monotonic()
                process.send_signal(signal.SIGKILL)
                process.wait(30)
                with open_jobdb(url) as db:
                    out = executing(db)
                got = received({"steady": steady, "flapping": flapping}, began, killed_at)
                found = report.requests.add(got, out)
                print(
                    f"{backend}: kill {report.kills}: {len(found)} requests in flight", flush=True
                )
        finally:
            stop_flapping.set()
            flapper.join(5)
        flapping.down = False
        final = deliver(config_path, url, "--until-drained")
        _, stderr = final.communicate(timeout=300)
        assert final.returncode == 0, stderr.decode()[-2000:]
        with open_jobdb(url) as db:
            assert db.states() == {"steady": {SUCCEEDED: JOBS}, "flapping": {SUCCEEDED: JOBS}}
        for name, receiver in (("steady", steady), ("flapping", flapping)):
            verify(receiver, paths[name], {f"{name}-{i}" for i in range(JOBS)})
        successes = {"steady": steady.successes(), "flapping": flapping.successes()}
        report.duplicates = report.requests.check_duplicates(successes)
    return report


KILLS = 20
JOBS = 500


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_deliver_killed_20_times_on_each_jobdb_while_receivers_flap(tmp_path: Path) -> None:
    """20 SIGKILLs of the director on each JobDB backend, the backends side by side."""
    seed = crash_seed("13")
    with ThreadPoolExecutor(len(BACKENDS)) as pool:
        futures = [
            pool.submit(crash_deliver, backend, tmp_path / backend, seed) for backend in BACKENDS
        ]
        reports = [future.result() for future in futures]
    for report in reports:
        print(f"{report.backend}: {report.kills} kills, {report.duplicates} duplicates")
        assert report.kills == KILLS
        # a duplicate is a request out when the director died (each key's copies are bounded
        # by the kills it was executing at: crash_deliver), at most max_in_flight a destination
        assert report.duplicates <= KILLS * 2 * 4
    for report in reports:
        report.requests.check()  # most kills found requests in flight


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_standby_director_takes_over_after_kill_9(tmp_path: Path, backend: str) -> None:
    with jobdb_url(backend, tmp_path) as url, Receiver(delay=0.05) as receiver:
        config_path = config(tmp_path, {"hook": receiver.url + "/ok"}, max_in_flight=2)
        with open_jobdb(url) as db:
            enqueue(db, "hook", receiver.url + "/ok", 200)
        first = deliver(config_path, url)
        deadline = time.time() + 60
        while not receiver.requests and time.time() < deadline:
            time.sleep(0.05)
        assert receiver.requests, "the first director sent nothing"
        second = deliver(config_path, url, "--until-drained")
        time.sleep(1.5)
        assert second.poll() is None
        with open_jobdb(url) as db:
            before = db.states()["hook"].get(SUCCEEDED, 0)
        assert 0 < before < 200  # the first delivers, the second waits on the lock
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        _, stderr = second.communicate(timeout=120)
        assert second.returncode == 0, stderr.decode()[-2000:]
        assert b"waiting for the director lock" in stderr
        with open_jobdb(url) as db:
            assert db.states() == {"hook": {SUCCEEDED: 200}}
        verify(receiver, "/ok", {f"hook-{i}" for i in range(200)})
        assert sum(n - 1 for n in receiver.successes().values()) <= 2  # max_in_flight


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "exactly", "--config", str(tmp_path / "exactly.toml"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})


def test_deliver_and_deliveries_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "exactly.toml").write_text(f'data_dir = "{tmp_path / "data"}"\n')
    result = run_cli(tmp_path, "deliver", "--until-drained")
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0
    assert "no [[destinations]]" in result.stderr
    (tmp_path / "exactly.toml").write_text('[[destinations]]\nname = "a"\nurl = "gopher://x"\n')
    result = run_cli(tmp_path, "deliveries")
    assert result.returncode == 1 and "destinations[0] (a).url" in result.stderr
    with Receiver() as receiver:
        config(tmp_path, {"hook": receiver.url + "/ok", "refusing": receiver.url + "/status/404"})
        url = f"sqlite://{tmp_path / 'data' / 'jobdb'}"
        with open_jobdb(url) as db:
            enqueue(db, "hook", receiver.url + "/ok", 3)
            enqueue(db, "refusing", receiver.url + "/status/404", 2)
        result = run_cli(tmp_path, "deliver", "--until-drained")
        assert result.returncode == 0, result.stderr
        assert "hook: 3 requests, 3 succeeded" in result.stdout
        assert "refusing: 2 requests, 0 succeeded, 0 to retry, 2 discarded" in result.stdout
    result = run_cli(tmp_path, "deliveries", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["destination"]: row for row in json.loads(result.stdout)}
    assert rows["hook"]["states"] == {"succeeded": 3} and rows["hook"]["queued"] == 0
    assert rows["refusing"]["states"] == {"discarded": 2}
    assert rows["refusing"]["last_error"].startswith("404: status 404")
    table = run_cli(tmp_path, "deliveries")
    assert table.returncode == 0 and "refusing" in table.stdout


def latencies(path: Path, message_ids: set[str]) -> list[float]:
    """Seconds from each job's creation to its success, from the JobDB's own records (waits)."""
    import sqlite3

    deadline = time.time() + 60
    while True:
        with sqlite3.connect(path) as connection:
            rows = connection.execute(
                "SELECT j.message_id, t.time - j.created_at FROM jobs_1 j JOIN "
                "job_state_transitions_1 t ON t.job_id = j.id WHERE t.state = 'succeeded' "
                "AND j.destination = 'good'"
            ).fetchall()
        found = sorted(float(seconds) for message_id, seconds in rows if message_id in message_ids)
        if len(found) >= len(message_ids) or time.time() > deadline:
            return found
        time.sleep(0.2)


def trickle(db: JobDB, url: str, start: int, count: int, per_second: float, batch: int) -> set[str]:
    ids = set()
    for i in range(start, start + count):
        db.add(
            [
                NewJob(
                    source="web",
                    destination="good",
                    payload=b'{"messageId":"good-%d"}' % i,
                    message_id=f"good-{i}",
                    expire_at=time.time() + 3600,
                )
            ],
            query_id="route-good",
            batch_id=batch + i,
        )
        ids.add(f"good-{i}")
        time.sleep(1 / per_second)
    return ids


BACKLOG = 100_000  # jobs queued for the destination that is down (issue 13)


@pytest.mark.slow
def test_a_destination_down_with_a_backlog_leaves_another_latency(tmp_path: Path) -> None:
    with Receiver() as good_receiver, Receiver() as bad_receiver:
        bad_receiver.down = True
        urls = {"good": good_receiver.url + "/ok", "bad": bad_receiver.url + "/flap"}
        # no breaker: the bad destination keeps failing hard beside the good one
        config_path = config(tmp_path, urls, max_in_flight=8, breaker=0)
        url = f"sqlite://{tmp_path / 'jobdb'}"
        with open_jobdb(url, dataset_rows=10**7) as db:
            director = deliver(config_path, url)
            try:
                time.sleep(1.5)
                path = tmp_path / "jobdb" / "jobdb.sqlite"
                alone = latencies(path, trickle(db, urls["good"], 0, 100, 40, 0))
                enqueue(db, "bad", urls["bad"], BACKLOG)
                time.sleep(2)  # the bad bucket is paged in and failing
                beside = latencies(path, trickle(db, urls["good"], 100, 100, 40, 0))
                failing = sum(1 for r in bad_receiver.requests if r.status == 503)
                bad_receiver.down = False
                recovered = time.time()
                deadline = recovered + 300
                while db.states().get("bad", {}).get(SUCCEEDED, 0) < BACKLOG:
                    assert time.time() < deadline, db.states()
                    time.sleep(0.5)
                drained = time.time() - recovered
            finally:
                director.send_signal(signal.SIGTERM)
                director.wait(60)
        assert len(alone) == 100 and len(beside) == 100
        median_alone = alone[len(alone) // 2]
        median_beside = beside[len(beside) // 2]
        print(
            f"good latency median alone {median_alone * 1000:.0f} ms, beside a failing backlog "
            f"{median_beside * 1000:.0f} ms ({failing} 503s meanwhile); {BACKLOG:,} drained in "
            f"{drained:.1f} s after recovery"
        )
        assert failing > 100  # the bad destination was failing hard meanwhile
        # within 2x of its own baseline; 50 ms for the director's 200 ms poll
        assert median_beside <= 2 * median_alone + 0.05
