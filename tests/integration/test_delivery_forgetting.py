"""The director's forget chore (``director/forgetting.py``) against real parts: a SQLite JobDB,
the embedded log holding the regulations, an archive on moto's S3 server, a real receiver.

A regulation the director cannot apply (its archive's bucket gone) must not stop delivery: the
director says why in one line, keeps delivering everybody else, never sends the forgotten
person's jobs, and applies the regulation once the bucket is back.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from exactly.delivery.archive import open_archive
from exactly.delivery.director import Director
from exactly.delivery.director.forgetting import Forgetting
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import NewJob
from exactly.forget.regulations import USER, Regulations
from exactly.log import open_log
from tests.archives import MotoServer
from tests.integration.test_delivery_archive import destination
from tests.receiver import Receiver

KEY = bytes(range(32))


def enqueue(db: JobDB, users: list[str], batch: int) -> list[str]:
    """One job per user for ``web/kept``; their message ids."""
    ids = [f"b{batch}-{n}" for n in range(len(users))]
    db.add(
        [
            NewJob(
                source="web",
                destination="kept",
                payload=json.dumps({"messageId": id_, "userId": user}).encode(),
                message_id=id_,
                user_id=user,
            )
            for id_, user in zip(ids, users, strict=True)
        ],
        query_id="route",
        batch_id=batch,
    )
    return ids


def wait_for(condition: object, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_regulation_the_director_cannot_apply_is_said_retried_and_never_stops_delivery(
    tmp_path: Path, moto_s3: MotoServer
) -> None:
    bucket = moto_s3.bucket()
    archive = open_archive(f"s3://{bucket}/jobs?endpoint={moto_s3.endpoint}")
    archive.check()
    moto_s3.client().delete_bucket(Bucket=bucket)  # the archive's store fails until it is back
    log_url = f"sqlite://{tmp_path / 'log'}"
    said: list[str] = []
    with (
        Receiver() as receiver,
        open_log(log_url) as log,
        open_jobdb(f"sqlite://{tmp_path / 'jobdb'}") as db,
    ):
        target = destination("kept", f"{receiver.url}/ok", expire="1h")
        regulations = Regulations(log)
        regulation = regulations.record(KEY, {USER: ["alice"]}, ("jobdb", "archive"))
        first = enqueue(db, ["bob", "alice", "carol"], 0)
        director = Director(
            db,
            [target],
            poll_seconds=0.05,
            report=said.append,
            forgetting=lambda calls, archive: Forgetting(
                open_log(log_url), KEY, calls, archive, said.append
            ),
            archive=archive,
            archive_seconds=3600.0,
        )
        runner = threading.Thread(target=director.run)
        runner.start()
        try:

            def failed(times: int) -> bool:
                lines = [line for line in said if "could not apply regulations" in line]
                return len(lines) >= times

            wait_for(lambda: failed(2), f"no failure said: {said}")
            failure = next(line for line in said if "could not apply regulations" in line)
            assert "NoSuchBucket" in failure and "delivery goes on" in failure, failure
            assert len(failure) <= 300 and "\n" not in failure
            # delivery goes on while the regulation waits: everybody but Alice is delivered
            later = enqueue(db, ["dave", "alice", "erin"], 1)
            wanted = {first[0], first[2], later[0], later[2]}
            wait_for(lambda: set(receiver.successes("/ok")) >= wanted, "delivery stopped")
            assert runner.is_alive()
            moto_s3.client().create_bucket(Bucket=bucket)

            def applied() -> bool:
                regulations.refresh()
                current = next(r for r in regulations.all() if r.id == regulation.id)
                return current.finished

            wait_for(applied, f"the regulation was not applied after the bucket came back: {said}")
        finally:
            director.stop()
            runner.join(60)
        assert not runner.is_alive()
    assert any("jobs and archive cleared" in line for line in said), said
    waits = [line.rsplit("again in ", 1)[1] for line in said if "trying again in" in line]
    assert waits[:3] == ["1 s", "2 s", "4 s"][: len(waits[:3])], waits  # doubling
    assert set(receiver.successes("/ok")) == wanted  # Alice's jobs never sent
