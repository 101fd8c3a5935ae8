"""How long ``exactly forget`` takes against the data dir's size, and where the time goes.

    .venv/bin/python bench/forget.py [--events 100000] [--hers 20]

Builds a data dir on the embedded defaults as the pipeline leaves it, without Spark: ``raw``
and ``events`` in the sqlite log (the demo's events, 4 partitions, ``--hers`` of them a
person's), a sqlite JobDB with a job per event for one destination, an archive file of 10,000
of those jobs, and a Delta lake table of every event. Then forgets the person with nothing
running (the command's own path, :class:`exactly.forget.apply.Applying`) and prints each step's
seconds: finding the person in the log, the data dir's logs, the JobDB and the archive, the
lake, and the log's rewrite.

The baselines, measured in the same run just before the forget, on the same data dir: reading
every byte of the data dir's files (what any forget that must look everywhere cannot beat), and
reading every record of ``raw`` and ``events`` through the log (what finding the person starts
from). The forget's time is printed as a ratio of each.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from exactly.config import load_settings
from exactly.delivery.archive import open_archive
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import NewJob
from exactly.forget.apply import Applying, stores_of
from exactly.forget.found import Person
from exactly.forget.regulations import USER, Regulations, load_key
from exactly.lake import Marker, open_table
from exactly.lake.columns import event_rows
from exactly.log import Record, open_log

PARTITIONS = 4
PERSON = "bench-person-7f3a91"


def event(n: int, hers: bool) -> dict[str, object]:
    return {
        "messageId": str(uuid.UUID(int=n + 1, version=4)),
        "type": "track",
        "event": "Order Completed" if n % 3 == 0 else "Product Viewed",
        "userId": PERSON if hers else f"user-{n % 5000}",
        "sourceId": "web",
        "timestamp": "2026-11-28T10:00:00.000Z",
        "receivedAt": "2026-11-28T10:00:00.123Z",
        "properties": {"revenue": n % 7, "sku": f"sku-{n % 977}"},
        "context": {"ip": f"10.0.{n % 250}.{n % 199}", "library": {"name": "bench"}},
    }


def build(home: Path, count: int, hers: int) -> None:
    settings = load_settings(home / "exactly.toml")
    every = max(1, count // hers)
    events = [event(n, n % every == 0) for n in range(count)]
    values = [json.dumps(found).encode() for found in events]
    keys = [str(found["messageId"]).encode() for found in events]
    with open_log(settings.log_url) as log:
        for topic in ("raw", "events"):
            log.create_topic(topic, PARTITIONS)
            for partition in range(PARTITIONS):
                for start in range(partition, count, PARTITIONS * 5000):
                    stop = start + PARTITIONS * 5000
                    pairs = zip(
                        values[start:stop:PARTITIONS], keys[start:stop:PARTITIONS], strict=True
                    )
                    log.append(topic, partition, [Record(v, k) for v, k in pairs])
    with open_jobdb(settings.jobdb_url, dataset_rows=100_000) as jobdb:
        for batch, start in enumerate(range(0, count, 10_000)):
            jobs = [
                NewJob("web", "hook", value, key.decode(), None)
                for value, key in zip(
                    values[start : start + 10_000], keys[start : start + 10_000], strict=True
                )
            ]
            jobdb.add(jobs, query_id="bench", batch_id=batch)
    archive = open_archive(settings.archive_url)
    archive.write(
        "jobs-20261128T100000Z-1-1.jsonl.gz",
        [
            {"id": n, "payload": values[n].decode(), "message_id": str(n), "user_id": None}
            for n in range(min(count, 10_000))
        ],
    )
    with open_table(settings.lake_url) as table:
        for batch, start in enumerate(range(0, count, 50_000)):
            table.append(event_rows(values[start : start + 50_000]), Marker("bench", batch))


def read_files(data_dir: Path) -> float:
    """Seconds to read every byte of every file under ``data_dir``."""
    began = time.monotonic()
    for path in data_dir.rglob("*"):
        if path.is_file():
            with path.open("rb") as found:
                while found.read(1 << 20):
                    pass
    return time.monotonic() - began


def read_topics(log_url: str) -> float:
    """Seconds to read every record of ``raw`` and ``events`` through the log."""
    began = time.monotonic()
    with open_log(log_url) as log:
        for topic in ("raw", "events"):
            for partition in log.end_offsets(topic):
                for _ in log.read_range(topic, partition, 0, max_records=10_000, headers=False):
                    pass
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--hers", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exactly-forget-") as work:
        home = Path(work)
        (home / "exactly.toml").write_text(
            f'data_dir = "{home / "data"}"\n[lake]\nurl = "delta://{home / "data/lake/events"}"\n'
            '[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/in"\n'
        )
        began = time.monotonic()
        build(home, args.events, args.hers)
        built = time.monotonic() - began
        settings = load_settings(home / "exactly.toml")
        size = sum(p.stat().st_size for p in (home / "data").rglob("*") if p.is_file())
        lines: list[str] = []
        key = load_key(settings.data_dir)
        files, topics = read_files(home / "data"), read_topics(settings.log_url)
        with open_log(settings.log_url) as log:
            regulations = Regulations(log)
            ids = {USER: (PERSON,)}
            regulation = regulations.record(key, ids, stores_of(settings))
            began = time.monotonic()
            applying = Applying(settings, log, regulations, lines.append, settle_seconds=0)
            left = applying.run(regulation, key, Person(ids))
            took = time.monotonic() - began
    assert not left, left
    print(f"{args.events:,} events ({size / 1e6:,.0f} MB data dir, built in {built:.0f} s)")
    for line in lines:
        print(f"  {line}")
    print(f"forget ({args.events:,} events): {took:.1f} s")
    print(f"baseline: every file read {files:.1f} s (forget {took / files:.1f}x), every record of")
    print(f"  raw and events read {topics:.1f} s (forget {took / topics:.1f}x)")


if __name__ == "__main__":
    sys.exit(main())
