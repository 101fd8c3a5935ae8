"""Expiry -> archive (a directory, S3 on moto's server) -> replay -> delivered, against a real
receiver; and the JobDB staying small while datasets come and go."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from standardwebhooks.webhooks import Webhook

from exactly.delivery.archive import BACKENDS, Archive, open_archive, reopens
from exactly.delivery.archive.apart import NICE
from exactly.delivery.archive.directory import DirectoryArchive
from exactly.delivery.director import Director
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import EXPIRED, SUCCEEDED, NewJob, Transition
from exactly.delivery.replay import replay
from exactly.delivery.settings import DestinationSettings
from tests.archives import MotoServer, archive_url
from tests.cli_text import messages, said
from tests.receiver import Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture(params=BACKENDS)
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Archive]:
    s3 = request.getfixturevalue("moto_s3") if request.param == "s3" else None
    with archive_url(request.param, tmp_path, s3) as url:
        opened = open_archive(url)
        opened.check()
        yield opened


def destination(name: str, url: str, **options: Any) -> DestinationSettings:
    return DestinationSettings.model_validate(
        {
            "name": name,
            "url": url,
            "secret": SECRET,
            "timeout": 1.0,
            "backoff": {"min": 0.05, "max": 0.2},
            **options,
        }
    )


def enqueue(db: JobDB, target: DestinationSettings, first: int, count: int, batch: int) -> None:
    db.add(
        [
            NewJob(
                source="web",
                destination=target.name,
                payload=json.dumps({"messageId": f"e{i}", "n": i}).encode(),
                message_id=f"e{i}",
                expire_at=time.time() + target.window,
            )
            for i in range(first, first + count)
        ],
        query_id="route",
        batch_id=batch,
    )


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }


def deliver(db: JobDB, target: DestinationSettings, archive: Archive) -> Director:
    director = Director(
        db, [target], poll_seconds=0.05, report=lambda _: None, archive=archive, archive_seconds=0.2
    )
    director.run(until_drained=True)
    return director


def test_expired_jobs_are_archived_dropped_replayed_and_delivered(
    archive: Archive, tmp_path: Path
) -> None:
    with Receiver() as receiver:
        # 503 until the jobs expire; every job tried (no breaker) within the 3 s they live
        # (in 1 s, at a load average of 16, not every job had its first try: CI, 2026-11-30)
        receiver.down = True
        target = destination(
            "flaky", f"{receiver.url}/flap", expire="3s", breaker={"open_after": 0}
        )
        with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}", dataset_rows=20) as db:
            for batch in range(5):
                enqueue(db, target, batch * 20, 20, batch)
            first = deliver(db, target, archive)
            assert first.tallies["flaky"].expired == 100 and first.tallies["flaky"].succeeded == 0
            assert first.archived == 4  # datasets 1 to 4; the newest stays
            assert [dataset.number for dataset in db.datasets()] == [5]
            names = archive.names()
            assert len(names) == 4
            archived = [record for name in names for record in archive.records(name)]
            assert len(archived) == 80
            assert {record["transitions"][-2]["state"] for record in archived} == {EXPIRED}
            gone = {
                f"{kind}_{n}" for n in range(1, 5) for kind in ("jobs", "job_state_transitions")
            }
            assert not gone & tables(tmp_path / "jobdb" / "jobdb.sqlite")
            assert {"jobs_5", "job_state_transitions_5"} <= tables(
                tmp_path / "jobdb" / "jobdb.sqlite"
            )
            seen_before = set(receiver.ids("/flap"))
            assert seen_before == {f"e{i}" for i in range(100)}

            target = destination("flaky", f"{receiver.url}/flap", expire="1h")
            result = replay(db, archive, target)
            assert result.total == 100 and result.archived_jobs == 80 and result.live_jobs == 20

            receiver.down = False
            second = deliver(db, target, archive)
            assert second.tallies["flaky"].succeeded == 100
            assert db.states() == {"flaky": {SUCCEEDED: 100}}  # dataset 5 archived meanwhile
            assert second.archived == 1 and len(archive.names()) == 5
        assert set(receiver.successes()) == {f"e{i}" for i in range(100)}
        webhook = Webhook(SECRET)
        for request in receiver.requests:
            assert request.headers["Idempotency-Key"] == request.headers["webhook-id"]
            assert json.loads(request.body)["messageId"] == request.headers["webhook-id"]
            webhook.verify(request.body, request.headers)


@pytest.mark.slow
def test_the_jobdb_stays_small_over_many_datasets(tmp_path: Path) -> None:
    """60 datasets delivered, archived and dropped: the tables and the file stop growing."""
    archive = open_archive(str(tmp_path / "archive"))
    path = tmp_path / "jobdb" / "jobdb.sqlite"
    sizes: list[int] = []
    with Receiver() as receiver:
        target = destination("fast", f"{receiver.url}/ok", expire="1h")
        with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}", dataset_rows=100) as db:
            for batch in range(60):
                enqueue(db, target, batch * 100, 100, batch)
                deliver(db, target, archive)
                jobs_tables = {name for name in tables(path) if name.startswith("jobs_")}
                assert len(jobs_tables) <= 2 and len(db.datasets()) <= 2, jobs_tables
                with sqlite3.connect(path) as connection:  # the database's pages, WAL included
                    (pages,) = connection.execute("PRAGMA page_count").fetchone()
                sizes.append(int(pages))
        assert len(archive.names()) == 59
        assert sum(1 for name in archive.names() for _ in archive.records(name)) == 5900
    assert len(receiver.successes()) == 6000
    # the pages of dropped tables are reused: after the first rounds the database grows no more.
    # A few pages come and go with the free list and the indexes' splits; a dataset left behind
    # would add its ~12 pages every round, 600 over the 50 later rounds.
    print("JobDB pages after each dataset:", sizes)
    assert max(sizes[10:]) <= max(sizes[:10]) + 8, sizes


def test_an_archive_that_fails_mid_run_holds_back_only_the_drop(
    tmp_path: Path, moto_s3: MotoServer
) -> None:
    """The bucket disappears: delivery goes on, the datasets stay in the JobDB; once the bucket
    is back they are archived and dropped."""
    bucket = moto_s3.bucket()
    archive = open_archive(f"s3://{bucket}/jobs?endpoint={moto_s3.endpoint}")
    archive.check()
    moto_s3.client().delete_bucket(Bucket=bucket)
    said: list[str] = []
    with Receiver() as receiver:
        target = destination("kept", f"{receiver.url}/ok", expire="1h")
        with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}", dataset_rows=20) as db:
            for batch in range(3):
                enqueue(db, target, batch * 20, 20, batch)
            director = Director(
                db, [target], poll_seconds=0.05, report=said.append, archive=archive
            )
            director.run(until_drained=True)
            assert director.tallies["kept"].succeeded == 60 and director.archived == 0
            assert any("dataset 1 not archived" in line and "NoSuchBucket" in line for line in said)
            assert [dataset.number for dataset in db.datasets()] == [1, 2, 3]
            moto_s3.client().create_bucket(Bucket=bucket)
            assert deliver(db, target, archive).archived == 2
            assert [dataset.number for dataset in db.datasets()] == [3]
        assert len(archive.names()) == 2
    assert len(receiver.successes()) == 60


def test_deliver_and_replay_stop_in_one_line_when_the_archive_is_unreachable(
    tmp_path: Path,
) -> None:
    import os
    import subprocess
    import sys

    from tests.servers import free_port

    (tmp_path / "exactly.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n[delivery]\n'
        f'archive = "s3://nowhere/jobs?endpoint=http://127.0.0.1:{free_port()}"\n'
        '[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/now"\n'
    )
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    for args in (["deliver", "--until-drained"], ["replay", "--destination", "hook"]):
        command = [sys.executable, "-m", "exactly", "--config", str(tmp_path / "exactly.toml")]
        result = subprocess.run(
            [*command, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("error: the archive s3://nowhere/jobs")
        assert "reaching bucket 'nowhere' failed" in said(result.stderr)
        assert len(messages(result.stderr)) == 1, result.stderr
    assert not (tmp_path / "data" / "jobdb").exists()  # refused before the JobDB was opened


def test_requests_keep_leaving_while_a_dataset_is_archived(tmp_path: Path) -> None:
    """A file that takes 2 s to write (a slow disk or bucket) holds back no request: the file is
    written in a thread and on a connection of its own."""

    writing: list[float] = []

    class SlowDisk(DirectoryArchive):
        def _store(self, name: str, data: Any, size: int) -> None:
            writing.append(time.monotonic())
            time.sleep(2.0)
            super()._store(name, data, size)
            writing.append(time.monotonic())

    with Receiver() as receiver:
        done = destination("done", f"{receiver.url}/ok", expire="1h")
        live = destination("live", f"{receiver.url}/ok", expire="1h", max_in_flight=4)
        with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}", dataset_rows=50) as db:
            enqueue(db, done, 0, 50, 0)
            finished = [job.id for job in db.pending("web/done")]
            db.record([Transition(job_id, SUCCEEDED, 1) for job_id in finished])
            enqueue(db, live, 1000, 3000, 1)  # dataset 2: dataset 1 can be archived at once
            director = Director(
                db,
                [done, live],
                poll_seconds=0.05,
                report=lambda _: None,
                archive=SlowDisk(tmp_path / "archive"),
            )
            director.run(until_drained=True)
            assert director.archived == 1 and director.tallies["live"].succeeded == 3000
        started, ended = writing
        during = [r for r in receiver.requests if started <= r.at <= ended]
        assert len(during) > 100, f"{len(during)} requests while the file was written"


def test_archives_made_from_their_url_are_written_in_a_child_and_others_in_a_thread(
    tmp_path: Path,
) -> None:
    """Only an archive that ``open_archive`` remakes from its URL can be written by the child
    process; one made in code (a test's subclass) is written in the director's thread."""

    class Made(DirectoryArchive):
        pass

    assert reopens(open_archive(str(tmp_path / "a"))) and reopens(open_archive("file:///x"))
    assert not reopens(Made(tmp_path / "b"))


def test_the_archiving_child_is_niced_and_dies_with_its_director(tmp_path: Path) -> None:
    """The child runs at a lower priority than the director, and a director killed with
    SIGKILL takes its child with it (PR_SET_PDEATHSIG): nothing is left writing the archive.
    The child's stdin stays open here (this test holds its other end), so it is the signal,
    not the end of its input, that ends it."""
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}"):
        pass
    read, write = os.pipe()
    director = subprocess.Popen(  # a stand-in director: starts the child as Archiver does
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-m', "
            "'exactly.delivery.archive.apart'], stdin=int(sys.argv[1]))\n"
            "print(child.pid, flush=True); time.sleep(60)\n",
            str(read),
        ],
        stdout=subprocess.PIPE,
        pass_fds=(read,),
    )
    os.close(read)
    try:
        opening = {
            "parent": director.pid,
            "jobdb": f"sqlite://{tmp_path / 'jobdb'}",
            "archive": str(tmp_path / "archive"),
        }
        os.write(write, json.dumps(opening).encode() + b"\n")
        assert director.stdout is not None
        child = psutil.Process(int(director.stdout.readline()))
        deadline = time.monotonic() + 30
        while child.nice() != os.nice(0) + NICE:
            assert time.monotonic() < deadline, f"nice {child.nice()}"
            time.sleep(0.05)
        director.kill()
        director.wait()
        child.wait(10)  # psutil.TimeoutExpired if it outlived its director
    finally:
        os.close(write)
        director.kill()
        director.wait()
