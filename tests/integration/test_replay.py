"""exactly replay: finished jobs sent again with the same message ids, once, even after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from exactly.delivery.archive import BACKENDS, Archive, archive_name, open_archive
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import (
    AWAITING_SCHEDULING,
    DISCARDED,
    EXECUTING,
    EXPIRED,
    SUCCEEDED,
    Job,
    NewJob,
    Transition,
    bucket_of,
    lane_of,
)
from exactly.delivery.replay import parse_time, replay
from exactly.delivery.settings import DestinationSettings
from exactly.errors import ConfigError
from tests.archives import archive_url
from tests.cli_text import messages, said

OUTCOME = {0: EXPIRED, 1: DISCARDED, 2: SUCCEEDED}


@pytest.fixture(params=BACKENDS)
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Archive]:
    s3 = request.getfixturevalue("moto_s3") if request.param == "s3" else None
    with archive_url(request.param, tmp_path, s3) as url:
        yield open_archive(url)


def target(url: str = "http://127.0.0.1:9/now", **options: object) -> DestinationSettings:
    return DestinationSettings.model_validate(
        {"name": "hook", "url": url, "headers": {"X-Now": "1"}, "expire": "2h", **options}
    )


def add_finished(db: JobDB, first: int, count: int, *, batch: int) -> None:
    """Jobs m<first>.. of hook, each ended as OUTCOME[i % 3]."""
    db.add(
        [
            NewJob(
                "web",
                "hook",
                b'{"messageId":"m%d"}' % i,
                f"m{i}",
                user_id=f"u{i}",
                expire_at=time.time() + 60,
            )
            for i in range(first, first + count)
        ],
        query_id="route",
        batch_id=batch,
    )
    finish(db, {job.id: OUTCOME[int(job.message_id[1:]) % 3] for job in pending(db)})


def pending(db: JobDB, limit: int = 10_000) -> list[Job]:
    """hook's pending jobs in every bucket (a replayed job is in its user's lane), by id."""
    found = [job for bucket in db.buckets() for job in db.pending(bucket, limit=limit)]
    return sorted(found, key=lambda job: job.id)


def finish(db: JobDB, outcomes: dict[int, str]) -> None:
    db.record([Transition(job_id, EXECUTING, 1) for job_id in outcomes])
    db.record([Transition(job_id, state, 1) for job_id, state in outcomes.items()])


def archive_all(db: JobDB, archive: Archive) -> int:
    datasets = {dataset.number: dataset for dataset in db.datasets()}
    ready = db.archivable()
    for number in ready:
        name = archive_name(datasets[number])
        db.archive(number, lambda records, name=name: archive.write(name, records))
    return len(ready)


def test_replay_takes_each_message_once_by_its_latest_outcome(
    archive: Archive, tmp_path: Path
) -> None:
    hook = target(lanes=8)  # a replayed job goes to its user's lane
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}", dataset_rows=10) as db:
        for batch in range(4):
            add_finished(db, batch * 10, 10 if batch < 3 else 5, batch=batch)
        assert archive_all(db, archive) == 3  # m0..m29 archived; m30..m34 live, finished
        assert len(archive.names()) == 3
        wanted = {f"m{i}" for i in range(35) if i % 3 != 2}
        started = time.time()
        preview = replay(db, archive, hook, dry_run=True)
        assert preview.enqueued == Counter({EXPIRED: 12, DISCARDED: 12})
        assert "24 jobs would be re-enqueued" in preview.line() and pending(db) == []
        result = replay(db, archive, hook)
        assert result.enqueued == Counter({EXPIRED: 12, DISCARDED: 12})
        assert result.archive_files == 3 and result.archived_jobs == 30 and result.live_jobs == 5
        assert "hook: 24 jobs re-enqueued (12 discarded, 12 expired)" in result.line()
        new = pending(db)
        assert {job.message_id for job in new} == wanted and len(new) == 24
        assert [job.message_id for job in new] == sorted(wanted, key=lambda m: int(m[1:]))
        for job in new:
            assert job.state == AWAITING_SCHEDULING and job.destination == hook.name
            assert job.user_id == f"u{job.message_id[1:]}"
            assert job.bucket == bucket_of("web", "hook", lane_of(job.user_id, hook.lanes))
            assert job.payload == b'{"messageId":"%s"}' % job.message_id.encode()
            assert started + 7200 - 5 < job.expire_at < time.time() + 7200 + 5
        # the same command again: every message's latest job is the pending copy
        assert replay(db, archive, hook).total == 0
        # the copies expire too: the next replay sends them again, and only them
        finish(db, {job.id: EXPIRED for job in new})
        again = replay(db, archive, hook)
        assert again.enqueued == Counter({EXPIRED: 24})
        latest = pending(db)
        assert {job.message_id for job in latest} == wanted
        finish(db, {job.id: SUCCEEDED for job in latest})
        # succeeded ones only when asked; a replayed copy that succeeded counts as succeeded
        everything = replay(db, archive, hook, states=(SUCCEEDED,))
        assert everything.total == 35
        assert replay(db, archive, hook, states=(EXPIRED, DISCARDED)).total == 0


def test_the_window_is_the_first_routing_time(tmp_path: Path) -> None:
    archive = open_archive(str(tmp_path / "archive"))
    hook = target()
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}") as db:
        add_finished(db, 0, 6, batch=0)
        time.sleep(0.05)
        middle = datetime.fromtimestamp(time.time(), UTC).isoformat()
        time.sleep(0.05)
        add_finished(db, 6, 6, batch=1)
        early = replay(db, archive, hook, until=middle)
        assert early.enqueued == Counter({EXPIRED: 2, DISCARDED: 2})
        copies = pending(db)
        assert {job.message_id for job in copies} == {"m0", "m1", "m3", "m4"}
        finish(db, {job.id: EXPIRED for job in copies})
        # the copies were made after `middle`, but their messages were first routed before it
        assert replay(db, archive, hook, until=middle).total == 4
        late = replay(db, archive, hook, since=middle)
        assert late.enqueued == Counter({EXPIRED: 2, DISCARDED: 2})
        assert replay(db, archive, hook, since="1h").total == 0  # everything is pending now


def test_times_and_states_are_checked_in_one_line() -> None:
    now = 1_800_000_000.0
    assert parse_time("2h", now, "--since") == now - 7200
    at_eight = datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    assert parse_time("2027-01-15T08:00:00Z", now, "--since") == at_eight
    assert parse_time("2027-01-15T09:00:00+01:00", now, "--since") == at_eight
    assert parse_time("2027-01-15", now, "--until") == datetime(2027, 1, 15, tzinfo=UTC).timestamp()
    with pytest.raises(ConfigError, match="--since 'yesterday' is neither a time"):
        parse_time("yesterday", now, "--since")


ROOT = Path(__file__).resolve().parents[2]


def cli(tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "exactly", "--config", str(tmp_path / "exactly.toml"), *args]


def markers(path: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as connection:
        rows = connection.execute("SELECT query_id, batch_id FROM jobdb_markers").fetchall()
    return {str(query): int(batch) for query, batch in rows}


@pytest.mark.slow
def test_a_sigkilled_replay_run_again_enqueues_no_message_twice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (tmp_path / "exactly.toml").write_text(
        f'data_dir = "{data}"\n[delivery]\narchive = "file://{tmp_path / "archive"}"\n'
        '[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/now"\n'
    )
    jobdb = data / "jobdb" / "jobdb.sqlite"
    archive = open_archive(f"file://{tmp_path / 'archive'}")
    total = 3000
    with open_jobdb(f"sqlite://{data / 'jobdb'}", dataset_rows=500) as db:
        for batch in range(total // 500):
            db.add(
                [
                    NewJob("web", "hook", b"{}", f"m{i}", expire_at=time.time() + 60)
                    for i in range(batch * 500, batch * 500 + 500)
                ],
                query_id="route",
                batch_id=batch,
            )
            finish(db, {job.id: EXPIRED for job in pending(db)})
        assert archive_all(db, archive) == 5  # 2,500 archived, 500 live
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    command = cli(tmp_path, "replay", "--destination", "hook", "--chunk", "10")
    kills: list[int] = []
    failed_again = 0
    first_start: float | None = None
    for progress in (3, 60, 180):  # of 300 chunks
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        reached = -1
        while time.monotonic() < deadline and child.poll() is None:
            found = markers(jobdb)
            chunks = [v for k, v in found.items() if k.startswith("replay:") and k.count(":") == 2]
            reached = max(chunks, default=-1)
            if reached >= progress:
                os.kill(child.pid, signal.SIGKILL)
                break
            time.sleep(0.002)
        child.wait(30)
        assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        kills.append(reached)
        # the copies made so far fail again before the next run (the receiver is still down):
        # only the resumed start keeps the next run from taking their messages a second time
        with open_jobdb(f"sqlite://{data / 'jobdb'}") as db:
            copies = {job.id: EXPIRED for job in pending(db, limit=10 * total)}
            finish(db, copies)
        failed_again += len(copies)
        if first_start is None:
            (key,) = [k for k in markers(jobdb) if k.startswith("replay:") and k.count(":") == 1]
            first_start = markers(jobdb)[key] / 1000
    assert kills[0] < kills[1] < kills[2] < 299, kills
    assert first_start is not None
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    with open_jobdb(f"sqlite://{data / 'jobdb'}") as db:
        made = Counter(
            job.message_id
            for job in db.jobs_of("hook", limit=10 * total)
            if job.created_at >= first_start
        )
    assert made.keys() == {f"m{i}" for i in range(total)}
    assert set(made.values()) == {1}, Counter(made.values())  # no message enqueued twice
    assert "resuming the replay started" in finished.stderr
    assert "hook: " in finished.stdout and "resumed the run started" in finished.stdout
    found = markers(jobdb)
    assert found[f"{key}:done"] == found[key] == round(first_start * 1000)
    # the same command now is a new replay: it takes the copies that failed again, once each
    preview = subprocess.run(
        [*command, "--dry-run", "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert preview.returncode == 0, preview.stderr
    (shown,) = json.loads(preview.stdout)
    assert shown["destination"] == "hook" and shown["dry_run"] and not shown["resumed"]
    assert shown["enqueued"] == failed_again and shown["by_state"] == {EXPIRED: failed_again}
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    shown_count = f"{failed_again:,}"  # counts are written with thousands separators
    assert f"hook: {shown_count} jobs re-enqueued ({shown_count} expired)" in again.stdout


def test_replay_refuses_unknown_destinations_and_states_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "exactly.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        '[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/now"\n'
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    for args, message in [
        (("--destination", "nope"), "--destination 'nope' is not in [[destinations]]"),
        (("--destination", "hook", "--state", "executing"), "--state 'executing' cannot be"),
        (("--destination", "hook", "--since", "soon"), "--since 'soon' is neither"),
    ]:
        result = subprocess.run(
            cli(tmp_path, "replay", *args), env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1 and message in said(result.stderr)
        assert len(messages(result.stderr)) == 1, result.stderr
    with open_jobdb(f"sqlite://{tmp_path / 'data' / 'jobdb'}") as db, db.replay_lock("hook"):
        command = cli(tmp_path, "replay", "-d", "hook")
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "another replay of 'hook' is running" in said(result.stderr)
    assert len(messages(result.stderr)) == 1, result.stderr
