"""``exactly trace`` finds jobs whose dataset was archived and dropped, in the archive."""

from __future__ import annotations

import time
from pathlib import Path

from exactly.config import Settings
from exactly.delivery.archive import archive_name, open_archive
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import EXECUTING, SUCCEEDED, NewJob, Transition
from exactly.events import partition_for
from exactly.log import Record, open_log
from exactly.trace import trace


def test_a_job_of_an_archived_dataset_is_traced_from_the_archive(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    with open_log(settings.log_url) as log:
        log.create_topic("raw", 2)
        log.append("raw", partition_for("m-1", 2), [Record(b'{"sourceId": "web"}', b"m-1")])
    now = time.time()
    with open_jobdb(settings.jobdb_url, dataset_rows=1) as jobdb:
        jobdb.add([NewJob("web", "hook", b"{}", "m-1")], query_id="q", batch_id=0)
        jobdb.add([NewJob("web", "hook", b"{}", "m-2")], query_id="q", batch_id=1)
        ((job, _),) = jobdb.jobs_with("m-1")
        jobdb.record(
            [
                Transition(job.id, EXECUTING, 1, now),
                Transition(job.id, SUCCEEDED, 1, now + 0.02, None, 204),
            ]
        )
        (number,) = jobdb.archivable()
        dataset = next(d for d in jobdb.datasets() if d.number == number)
        archive = open_archive(settings.archive_url)
        jobdb.archive(number, lambda records: archive.write(archive_name(dataset), records))
        assert jobdb.jobs_with("m-1") == []  # dropped from the JobDB
    (delivery,) = trace(settings, "m-1").deliveries
    assert delivery.archived and delivery.destination == "hook"
    assert delivery.state == SUCCEEDED
    assert [(a.state, a.status_code) for a in delivery.attempts] == [(SUCCEEDED, 204)]
