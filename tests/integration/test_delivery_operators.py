"""``exactly deliveries pause|resume|expire`` while a real director runs, on every JobDB, and a
failing destination shown as paused: each command takes effect within a second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from exactly.delivery.director import Director
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import EXPIRED, SUCCEEDED, NewJob
from exactly.delivery.operators import BY_OPERATOR, expire
from exactly.delivery.settings import DestinationSettings
from tests.jobdb import jobdb_url
from tests.receiver import Receiver

BACKENDS = ["sqlite", "postgresql", "mysql"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def enqueue(db: JobDB, name: str, count: int) -> None:
    db.add(
        [NewJob("web", name, json.dumps({"n": n}).encode(), f"{name}-{n}") for n in range(count)],
        query_id=f"q-{name}",
        batch_id=0,
    )


def configure(tmp_path: Path, url: str, jobdb: str, **options: object) -> Path:
    text = f'data_dir = "{tmp_path / "data"}"\n[delivery]\njobdb = "{jobdb}"\n'
    text += f'[[destinations]]\nname = "hook"\nurl = "{url}"\n'
    text += "".join(f"{key} = {json.dumps(value)}\n" for key, value in options.items())
    text += '[destinations.backoff]\nmin = "1s"\nmax = "2s"\n'
    text += '[destinations.breaker]\nopen_after = 3\nfailing_for = "1s"\n'
    config = tmp_path / "exactly.toml"
    config.write_text(text)
    return config


def cli(config: Path, *args: str) -> str:
    command = [sys.executable, "-m", "exactly", "--config", str(config), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_for(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


class Running:
    """A director delivering in a thread until the block ends."""

    def __init__(self, url: str, target: DestinationSettings) -> None:
        self.db = open_jobdb(url)
        self.director = Director(self.db, [target], poll_seconds=0.05, report=lambda _: None)
        self.thread = threading.Thread(target=self.director.run)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.director.stop()
        self.thread.join(60)
        self.db.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_pause_resume_and_expire_while_the_director_runs(
    backend: str, tmp_path: Path, receiver: Receiver
) -> None:
    with jobdb_url(backend, tmp_path) as url:
        config = configure(tmp_path, f"{receiver.url}/slow/0.05", url, max_in_flight=2)
        target = DestinationSettings(name="hook", url=f"{receiver.url}/slow/0.05", max_in_flight=2)
        with open_jobdb(url) as db:
            enqueue(db, "hook", 400)
        with Running(url, target):
            wait_for(lambda: len(receiver.requests) >= 20)
            assert "hook: paused" in cli(config, "deliveries", "pause", "hook")
            time.sleep(1.5)  # within a second, plus the requests that were out
            held = len(receiver.requests)
            time.sleep(1.5)
            assert len(receiver.requests) == held
            assert "paused" in cli(config, "deliveries")
            line = cli(config, "deliveries", "expire", "hook")
            assert "pending events created before" in line and "expired" in line, line
            assert cli(config, "deliveries", "resume", "hook").strip() == "hook: resumed"
            with open_jobdb(url) as db:
                wait_for(lambda: not db.pending("web/hook", limit=1))
                states = db.states()["hook"]
                by_operator = sum(
                    1
                    for job in db.jobs_of("hook")
                    if db.history(job.id)[-1].error_type == BY_OPERATOR
                )
        assert states == {SUCCEEDED: held, EXPIRED: 400 - held}
        assert by_operator == 400 - held
        assert f"{400 - held} pending events" in line
        assert sorted(set(receiver.ids().values())) == [1]


def test_expire_with_no_director_running(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'jobdb'}"
    with open_jobdb(url) as db:
        enqueue(db, "hook", 5)
        enqueue(db, "other", 2)
        assert "5 pending events" in expire(db, "hook", time.time() + 1)
        assert db.states() == {"hook": {EXPIRED: 5}, "other": {"awaiting-scheduling": 2}}


def test_a_failing_destination_shows_as_paused(tmp_path: Path, receiver: Receiver) -> None:
    url = f"sqlite://{tmp_path / 'jobdb'}"
    config = configure(tmp_path, f"{receiver.url}/flap", url)
    target = DestinationSettings.model_validate(
        {
            "name": "hook",
            "url": f"{receiver.url}/flap",
            "breaker": {"open_after": 3, "failing_for": "1s"},
            "backoff": {"min": "1s", "max": "2s"},
        }
    )
    with open_jobdb(url) as db:
        enqueue(db, "hook", 20)
    receiver.down = True
    with Running(url, target):
        wait_for(lambda: "failing since" in cli(config, "deliveries"))
        receiver.down = False
        with open_jobdb(url) as db:
            wait_for(lambda: db.states()["hook"] == {SUCCEEDED: 20}, 60)
        wait_for(lambda: "failing since" not in cli(config, "deliveries"), 10)
