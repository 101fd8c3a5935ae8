"""The archive contract, the same assertions on every backend (a directory; S3 on moto's server)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exactly.delivery.archive import BACKENDS, Archive, archive_name, open_archive
from exactly.delivery.archive.directory import DirectoryArchive
from exactly.delivery.archive.s3 import S3Archive
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED, Dataset, NewJob, Transition
from exactly.errors import ArchiveError, ConfigError
from tests.archives import MotoServer, archive_url
from tests.seeds import crash_rng
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    s3 = request.getfixturevalue("moto_s3") if request.param == "s3" else None
    with archive_url(request.param, tmp_path, s3) as found:
        yield found


@pytest.fixture
def archive(url: str) -> Archive:
    opened = open_archive(url)
    opened.check()
    return opened


def name_of(number: int, *, created: float = 1_700_000_000.0, first: int = 1) -> str:
    return archive_name(Dataset(number, first, 10, created))


def records(count: int, *, start: int = 0, payload: str = "x\u00e9") -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "destination": "hook",
            "message_id": f"m{i}",
            "payload": json.dumps({"messageId": f"m{i}", "p": payload}),
            "transitions": [{"state": SUCCEEDED, "attempt": 1, "time": 1.5}],
        }
        for i in range(start, start + count)
    ]


def raw(archive: Archive, name: str) -> bytes:
    """The stored bytes of ``name``, read around the interface."""
    if isinstance(archive, DirectoryArchive):
        return (archive.directory / name).read_bytes()
    assert isinstance(archive, S3Archive)
    answer = archive._client.get_object(Bucket=archive.bucket, Key=archive.key(name))
    return bytes(answer["Body"].read())


def put_foreign(archive: Archive, name: str) -> None:
    if isinstance(archive, DirectoryArchive):
        archive.directory.mkdir(parents=True, exist_ok=True)
        (archive.directory / name).parent.mkdir(parents=True, exist_ok=True)
        (archive.directory / name).write_bytes(b"not an archive")
    else:
        assert isinstance(archive, S3Archive)
        archive._client.put_object(Bucket=archive.bucket, Key=archive.key(name), Body=b"x")


def test_written_records_read_back_in_order(archive: Archive) -> None:
    assert archive.names() == []
    name = name_of(3, first=41)
    kept = records(25)
    where = archive.write(name, kept)
    assert where == archive.location(name) and name in where
    assert archive.names() == [name]
    assert list(archive.records(name)) == kept
    assert gzip.decompress(raw(archive, name)).decode().count("\n") == 25


def test_writing_a_dataset_again_replaces_it_with_the_same_bytes(archive: Archive) -> None:
    name = name_of(1)
    archive.write(name, records(10))
    first = raw(archive, name)
    archive.write(name, records(10))  # a crash between the write and the drop repeats it
    assert archive.names() == [name]
    assert raw(archive, name) == first
    archive.write(name, records(3, start=100))  # a write replaces, never appends
    assert [r["id"] for r in archive.records(name)] == [100, 101, 102]


def test_a_failed_write_leaves_the_previous_content(archive: Archive) -> None:
    name = name_of(2)

    def failing() -> Iterator[dict[str, Any]]:
        yield from records(5)
        raise RuntimeError("the JobDB went away mid-read")

    with pytest.raises(RuntimeError):
        archive.write(name, failing())
    assert archive.names() == []  # nothing under the final name
    archive.write(name, records(4))
    with pytest.raises(RuntimeError):
        archive.write(name, failing())
    assert [r["id"] for r in archive.records(name)] == [0, 1, 2, 3]


def test_names_are_sorted_and_other_files_ignored(archive: Archive) -> None:
    later, earlier = name_of(2, created=1_700_000_500.0), name_of(1)
    archive.write(later, records(1))
    archive.write(earlier, records(1))
    put_foreign(archive, "notes.txt")
    put_foreign(archive, "sub/" + name_of(9))
    assert archive.names() == [earlier, later]
    with pytest.raises(ValueError):
        archive.write("notes.txt", records(1))


def test_a_large_file_is_spooled_to_disk_and_streamed_back(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("exactly.delivery.archive.base.SPOOL_BYTES", 64 << 10)
    name = name_of(5)
    noise = os.urandom(600).hex()  # little to compress: a file of a few MB
    archive.write(name, records(3000, payload=noise))
    count = 0
    for count, record in enumerate(archive.records(name), 1):
        assert record["message_id"] == f"m{count - 1}"
    assert count == 3000


def test_a_missing_archive_fails_in_one_line_at_start(url: str, tmp_path: Path) -> None:
    if url.startswith("s3://"):
        missing = url.replace("s3://exactly-", "s3://missing-", 1)
        with pytest.raises(ArchiveError, match=r"reaching bucket 'missing-.*AWS_ACCESS_KEY_ID"):
            open_archive(missing).check()
        closed = f"s3://bucket/p?endpoint=http://127.0.0.1:{free_port()}"
        started = time.monotonic()
        with pytest.raises(ArchiveError) as error:
            open_archive(closed).check()
        assert "\n" not in str(error.value) and time.monotonic() - started < 60
    else:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        with pytest.raises(ArchiveError, match="cannot be created"):
            open_archive(f"file://{blocker / 'archive'}").check()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("gs://bucket/x", "is not understood"),
        ("s3://", "names no bucket"),
        ("s3://b/p?colour=red", "unknown option 'colour'"),
        ("s3://AKIA:hunter2@b/p", "do not go in the URL"),
        ("file://", "names no directory"),
    ],
)
def test_open_archive_refuses_wrong_urls_in_one_line(bad: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        open_archive(bad)
    assert "hunter2" not in str(error.value) and "\n" not in str(error.value)


def test_every_listed_backend_has_a_test_archive(tmp_path: Path, moto_s3: MotoServer) -> None:
    for backend in BACKENDS:
        with archive_url(backend, tmp_path, moto_s3) as found:
            assert open_archive(found).names() == []
    with pytest.raises(AssertionError, match="no test archive"), archive_url("gcs", tmp_path, None):
        pass


def fill(jobdb: str, datasets: int, per: int) -> None:
    """``datasets`` datasets of ``per`` succeeded jobs each, and a newest one left open."""
    with open_jobdb(jobdb, dataset_rows=per) as db:
        for batch in range(datasets + 1):
            db.add(
                [NewJob("web", "hook", b'{"n":%d}' % i, f"m{batch}-{i}") for i in range(per)],
                query_id="fill",
                batch_id=batch,
            )
        done = [job.id for job in db.pending("web/hook", limit=(datasets + 1) * per)]
        db.record([Transition(job_id, SUCCEEDED, 1) for job_id in done])


def live_datasets(path: Path) -> int:
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as connection:
        return int(connection.execute("SELECT COUNT(*) FROM jobdb_datasets").fetchone()[0])


@pytest.mark.slow
def test_archiving_survives_sigkill(url: str, tmp_path: Path) -> None:
    """SIGKILL the archiver at random points: each dataset ends in exactly one file, whole, and
    every job in it once; the dropped datasets are exactly the archived ones."""
    jobdb = f"sqlite://{tmp_path / 'jobdb'}"
    fill(jobdb, 40, 100)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    command = [sys.executable, "-m", "tests.archive_child", jobdb, url]
    rng = crash_rng("archive-crash", "13")
    kills = 0
    for _ in range(8):
        before = live_datasets(tmp_path / "jobdb" / "jobdb.sqlite")
        child = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline:  # until it has progressed
            if live_datasets(tmp_path / "jobdb" / "jobdb.sqlite") < before:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.03))  # then anywhere in the next dataset's steps
        if child.poll() is not None:
            break
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        kills += 1
    finished = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=300)
    assert finished.returncode == 0, finished.stderr.decode()[-2000:]
    assert kills >= 4, f"the archiver finished after {kills} kills: make the JobDB larger"
    archive = open_archive(url)
    with open_jobdb(jobdb) as db:
        assert [dataset.number for dataset in db.datasets()] == [41]
    names = archive.names()
    assert len(names) == 40
    seen: Counter[str] = Counter()
    for name in names:
        kept = list(archive.records(name))
        assert len(kept) == 100
        seen.update(record["message_id"] for record in kept)
        assert all(record["transitions"][-1]["state"] == "archiving" for record in kept)
    assert set(seen.values()) == {1} and len(seen) == 40 * 100
