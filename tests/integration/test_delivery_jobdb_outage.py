"""A PostgreSQL JobDB failing under a running ``exactly deliver``: its backends terminated (the
director reconnects, takes its lock again and delivers everything), or its database dropped (the
director stops with one ``error:`` line naming the JobDB and the cause, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, NewJob
from tests.aggregate_db import postgres_missing
from tests.cli_text import messages, said
from tests.conftest import require
from tests.receiver import Receiver

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN, autocommit=True) as connection:
        connection.execute(sql)


@pytest.fixture
def database() -> Iterator[tuple[str, str]]:
    """A database of its own, so terminating its backends touches no other test."""
    require(postgres_missing())
    name = f"exactly_outage_{uuid.uuid4().hex[:12]}"
    admin(f"CREATE DATABASE {name}")
    try:
        yield name, f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def deliver(tmp_path: Path, url: str, jobdb: str, *extra: str) -> subprocess.Popen[bytes]:
    config = tmp_path / "exactly.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[delivery]\njobdb_patience = "20s"\n'
        f'[[destinations]]\nname = "hook"\nurl = "{url}"\ntimeout = "2s"\nmax_in_flight = 4\n'
        '[destinations.backoff]\nmin = "50ms"\nmax = "200ms"\n'
    )
    command = [sys.executable, "-m", "exactly", "--config", str(config), "deliver"]
    return subprocess.Popen(
        [*command, "--jobdb", jobdb, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )


def enqueue(jobdb: str, url: str, count: int) -> set[str]:
    ids = {f"hook-{n}" for n in range(count)}
    with open_jobdb(jobdb) as db:
        db.add(
            [
                NewJob("web", "hook", b'{"messageId":"%s"}' % i.encode(), i, None, 0.0)
                for i in sorted(ids)
            ],
            query_id="route",
            batch_id=0,
        )
    return ids


def wait_for(condition: object, seconds: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.time() + seconds
    while not condition():  # type: ignore[operator]
        assert process.poll() is None, process.communicate()[1].decode()[-3000:]
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def terminate_backends(name: str) -> None:
    admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )


def test_terminated_backends_are_reconnected_and_everything_is_delivered(
    tmp_path: Path, database: tuple[str, str]
) -> None:
    name, jobdb = database
    with Receiver(delay=0.01) as receiver:
        url = f"{receiver.url}/ok"
        ids = enqueue(jobdb, url, 1500)
        process = deliver(tmp_path, url, jobdb, "--until-drained")
        try:
            wait_for(lambda: len(receiver.successes()) >= 200, 60, process)
            for _ in range(2):
                terminate_backends(name)  # every connection: the JobDB's and the lock's
                time.sleep(0.5)
            after = len(receiver.successes())
            wait_for(lambda: len(receiver.successes()) >= after + 100, 60, process)
            # the lock was taken again: a second director cannot have it
            (tmp_path / "second").mkdir()
            second = deliver(tmp_path / "second", url, jobdb, "--no-wait")
            _, err = second.communicate(timeout=60)
            assert second.returncode == 1
            assert messages(err.decode())[-1].startswith(
                "error: another director holds the lock of postgresql://"
            )
            _, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    stderr = err.decode()
    assert process.returncode == 0, stderr[-3000:]
    assert "the JobDB failed (" in said(stderr) and "retrying" in stderr
    assert "Traceback" not in stderr
    assert set(receiver.successes()) == ids
    duplicates = len(receiver.requests) - len(ids)
    assert 0 <= duplicates <= 2 * 8  # at most the requests out at each termination
    with open_jobdb(jobdb) as db:
        assert db.states() == {"hook": {SUCCEEDED: 1500}}


def test_a_dropped_jobdb_stops_deliver_with_one_line(
    tmp_path: Path, database: tuple[str, str]
) -> None:
    name, jobdb = database
    config = tmp_path / "exactly.toml"
    with Receiver(delay=0.01) as receiver:
        url = f"{receiver.url}/ok"
        enqueue(jobdb, url, 3000)
        process = deliver(tmp_path, url, jobdb)
        try:
            wait_for(lambda: len(receiver.successes()) >= 100, 60, process)
            admin(f"DROP DATABASE {name} WITH (FORCE)")
            dropped = time.time()
            _, err = process.communicate(timeout=60)
            took = time.time() - dropped
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert config.exists()
    stderr = err.decode()
    assert process.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    errors = [line for line in messages(stderr) if line.startswith("error:")]
    assert len(errors) == 1 and messages(stderr)[-1] == errors[0]
    assert errors[0].startswith(f"error: the JobDB postgresql://postgres@127.0.0.1:5432/{name}")
    assert f'database "{name}" does not exist' in errors[0]
    assert "did not recover within 20 s" in errors[0]
    assert 19 <= took <= 50
