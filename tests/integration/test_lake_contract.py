"""The lake table contract, the same assertions on every backend (tests/lake_tables.py)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from exactly.errors import EnvironmentProblem, LakeError
from exactly.lake import LakeTable, Marker, open_table
from exactly.lake.base import DataFile
from exactly.lake.columns import (
    BASE_SCHEMA,
    Promoted,
    event_rows,
    promoted_columns,
    target_schema,
)
from exactly.lake.files import FILE_NAME
from exactly.lake.sql import query
from tests.lake_tables import CASES, FILE_CASES, S3_CASES, exists, lake_url, plant_uncommitted

REVENUE = promoted_columns({"revenue": "properties.revenue double"})


@pytest.fixture(params=CASES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    s3 = request.getfixturevalue("moto_s3") if request.param in S3_CASES else None
    with lake_url(request.param, tmp_path, s3) as found:
        yield found


@pytest.fixture
def table(url: str) -> Iterator[LakeTable]:
    with open_table(url) as opened:
        yield opened


@pytest.fixture(params=FILE_CASES)
def file_table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LakeTable]:
    """A table whose batches executors write as files."""
    s3 = request.getfixturevalue("moto_s3") if request.param in S3_CASES else None
    with lake_url(request.param, tmp_path, s3) as found, open_table(found) as opened:
        yield opened


def events(start: int, count: int, day: int = 1) -> list[bytes]:
    return [
        json.dumps(
            {
                "messageId": f"m{n:05d}",
                "type": "track",
                "event": "Order Completed" if n % 2 else "Signed Up",
                "userId": f"u{n % 7}",
                "sourceId": "web",
                "timestamp": f"2026-01-{day + n % 2:02d}T10:00:{n % 60:02d}.123Z",
                "receivedAt": f"2026-01-{day + n % 2:02d}T10:00:{n % 60:02d}.456+00:00",
                "properties": {"revenue": n / 4, "currency": "EUR"},
                "context": {"library": {"name": "test"}},
            }
        ).encode()
        for n in range(start, start + count)
    ]


def batch(start: int, count: int, promoted: tuple[Promoted, ...] = ()) -> pa.Table:
    return event_rows(events(start, count), promoted)


def rows(table: LakeTable, columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The table's rows as Python values, by messageId; base columns and ``columns``."""
    read = table.read()
    names = [*BASE_SCHEMA.names, *columns]
    found = [{name: row[name] for name in names} for row in read.select(names).to_pylist()]
    for row in found:
        for name, value in row.items():
            if isinstance(value, datetime):
                row[name] = value.astimezone(UTC)
    return sorted(found, key=lambda row: row["messageId"])


def rows_of(data: pa.Table) -> list[dict[str, Any]]:
    """``data``'s rows as :func:`rows` gives a table's."""
    found = data.select(BASE_SCHEMA.names).to_pylist()
    return sorted(found, key=lambda row: row["messageId"])


def message_ids(table: LakeTable) -> list[str]:
    return sorted(table.read().column("messageId").to_pylist())


def write_files(table: LakeTable, data: pa.Table, marker: Marker, tasks: int = 2) -> list[DataFile]:
    """``data`` written as the lake query's executors write it: the table's writer, pickled,
    run by ``tasks`` tasks on their share of the rows."""
    writer = table.file_writer(target_schema(data.schema, table.schema()), marker)
    assert writer is not None
    shipped = pickle.loads(pickle.dumps(writer))
    share = -(-data.num_rows // tasks)
    return [
        file
        for task in range(tasks)
        for file in shipped.write(data.slice(task * share, share).to_batches())
    ]


def append_files(table: LakeTable, data: pa.Table, marker: Marker) -> bool:
    files = write_files(table, data, marker)
    return table.append_files(files, target_schema(data.schema, table.schema()), marker)


def test_append_commits_the_rows_with_their_marker(table: LakeTable) -> None:
    assert table.committed("q1") is None
    assert table.read().num_rows == 0
    assert table.append(batch(0, 30), Marker("q1", 0))
    assert table.append(batch(30, 20), Marker("q1", 1))
    assert table.committed("q1") == 1
    assert table.committed("q2") is None
    assert message_ids(table) == [f"m{n:05d}" for n in range(50)]
    first = rows(table)[1]
    assert first["timestamp"] == datetime(2026, 1, 2, 10, 0, 1, 123000, tzinfo=UTC)
    assert first["receivedAt"] == datetime(2026, 1, 2, 10, 0, 1, 456000, tzinfo=UTC)
    assert first["date"].isoformat() == "2026-01-02"
    assert json.loads(first["properties"]) == {"revenue": 0.25, "currency": "EUR"}
    assert first["traits"] is None and first["anonymousId"] is None


def test_markers_are_per_query(table: LakeTable) -> None:
    assert table.append(batch(0, 5), Marker("q1", 0))
    assert table.append(batch(5, 5), Marker("q2", 0))
    assert table.append(batch(10, 5), Marker("q2", 1))
    assert (table.committed("q1"), table.committed("q2")) == (0, 1)
    assert len(message_ids(table)) == 15


def test_a_replayed_batch_commits_nothing(table: LakeTable) -> None:
    assert table.append(batch(0, 10), Marker("q1", 0))
    assert table.append(batch(10, 10), Marker("q1", 1))
    version = table.version()
    assert not table.append(batch(10, 10), Marker("q1", 1))  # the last batch, replayed
    assert not table.append(batch(0, 10), Marker("q1", 0))  # an older one
    assert table.version() == version
    assert message_ids(table) == [f"m{n:05d}" for n in range(20)]
    assert table.committed("q1") == 1


def test_the_newest_end_offsets_are_where_a_new_query_starts(table: LakeTable) -> None:
    assert table.end_offsets() is None
    assert table.append(batch(0, 5), Marker("q1", 0, {0: 3, 1: 2}))
    assert table.append(batch(5, 5), Marker("q1", 1, {1: 9, 0: 4}))
    assert table.end_offsets() == {0: 4, 1: 9}
    assert not table.append(batch(5, 5), Marker("q1", 1, {0: 1, 1: 1}))  # a replay: unchanged
    table.optimize()
    assert table.end_offsets() == {0: 4, 1: 9}
    assert table.append(batch(10, 5), Marker("q2", 0, {0: 6, 1: 9}))  # a new query goes on
    assert table.end_offsets() == {0: 6, 1: 9}


def test_the_marker_survives_reopening(url: str) -> None:
    with open_table(url) as first:
        assert first.append(batch(0, 10), Marker("q1", 3))
    with open_table(url) as second:
        assert second.committed("q1") == 3
        assert not second.append(batch(0, 10), Marker("q1", 3))
        assert len(message_ids(second)) == 10


def test_a_promoted_column_evolves_the_schema(table: LakeTable) -> None:
    assert table.append(batch(0, 4), Marker("q1", 0))
    assert table.append(batch(4, 4, REVENUE), Marker("q1", 1))
    assert table.append(batch(8, 4), Marker("q1", 2))  # the column no longer configured
    schema = table.schema()
    assert schema is not None and schema.field("revenue").type == pa.float64()
    revenue = {row["messageId"]: row["revenue"] for row in rows(table, ("revenue",))}
    assert revenue == {f"m{n:05d}": (n / 4 if 4 <= n < 8 else None) for n in range(12)}


def test_a_promoted_column_keeps_its_kind(table: LakeTable) -> None:
    assert table.append(batch(0, 4, REVENUE), Marker("q1", 0))
    text = promoted_columns({"revenue": "properties.revenue string"})
    with pytest.raises(LakeError, match="revenue"):
        table.append(batch(4, 4, text), Marker("q1", 1))
    assert table.committed("q1") == 0


def test_optimize_keeps_the_content(table: LakeTable) -> None:
    for n in range(6):
        assert table.append(batch(n * 5, 5, REVENUE), Marker("q1", n))
    before = rows(table, ("revenue",))
    compaction = table.optimize()
    assert rows(table, ("revenue",)) == before
    assert table.committed("q1") == 5
    assert not table.append(batch(25, 5, REVENUE), Marker("q1", 5))
    if table.optimize is not None and not table.url.startswith("postgresql"):
        assert compaction.files_removed > compaction.files_added > 0
    assert table.optimize().files_removed == 0  # nothing left to compact
    assert table.append(batch(30, 5, REVENUE), Marker("q1", 6))
    assert len(message_ids(table)) == 35


def test_vacuum_removes_only_uncommitted_files(table: LakeTable) -> None:
    assert table.append(batch(0, 10), Marker("q1", 0))
    assert table.optimize() is not None
    assert table.append(batch(10, 10), Marker("q1", 1))
    planted = plant_uncommitted(table, events(100, 5))
    before = rows(table)
    assert len(before) == 20  # the planted file is in no version: no reader sees it
    assert table.vacuum(timedelta(hours=1)) == []  # too young to be a killed batch's
    removed = table.vacuum(timedelta(0))
    assert removed == ([] if planted is None else [planted])
    if planted is not None:
        assert not exists(table, planted)
    assert rows(table) == before
    assert table.vacuum(timedelta(0)) == []


def test_only_tables_of_files_give_a_file_writer(table: LakeTable) -> None:
    writer = table.file_writer(BASE_SCHEMA, Marker("q1", 0))
    assert (writer is None) == table.url.startswith("postgresql")


def test_files_written_then_committed_read_back_with_their_marker(file_table: LakeTable) -> None:
    data = batch(0, 30)
    files = write_files(file_table, data, Marker("q1", 0, {0: 30}))
    assert len(files) == 4  # two tasks, two days each
    assert all(FILE_NAME.match(file.path.rsplit("/", 1)[1]) for file in files)
    assert {dict(file.partition)["date"] for file in files} == {"2026-01-01", "2026-01-02"}
    assert sum(file.records for file in files) == 30
    assert file_table.read().num_rows == 0  # written, not committed: no reader sees them
    schema = target_schema(data.schema, file_table.schema())
    assert file_table.append_files(files, schema, Marker("q1", 0, {0: 30}))
    assert file_table.committed("q1") == 0 and file_table.end_offsets() == {0: 30}
    assert append_files(file_table, batch(30, 20), Marker("q1", 1))
    assert rows(file_table) == rows_of(batch(0, 50))
    assert file_table.vacuum(timedelta(0)) == []  # every file written is committed


def test_replayed_files_commit_nothing(file_table: LakeTable) -> None:
    assert append_files(file_table, batch(0, 10), Marker("q1", 0))
    version = file_table.version()
    replayed = write_files(file_table, batch(0, 10), Marker("q1", 0))
    schema = target_schema(batch(0, 10).schema, file_table.schema())
    assert not file_table.append_files(replayed, schema, Marker("q1", 0))
    assert file_table.version() == version
    assert message_ids(file_table) == [f"m{n:05d}" for n in range(10)]
    assert sorted(file_table.vacuum(timedelta(0))) == sorted(file.path for file in replayed)


def test_files_never_committed_are_invisible_and_vacuumed(file_table: LakeTable) -> None:
    assert append_files(file_table, batch(0, 10), Marker("q1", 0))
    killed = write_files(file_table, batch(10, 10), Marker("q1", 1))  # killed before its commit
    before = rows(file_table)
    assert len(before) == 10
    assert file_table.vacuum(timedelta(hours=1)) == []  # too young to be a killed batch's
    assert sorted(file_table.vacuum(timedelta(0))) == sorted(file.path for file in killed)
    assert not any(exists(file_table, file.path) for file in killed)
    assert rows(file_table) == before
    assert append_files(file_table, batch(10, 10), Marker("q1", 1))  # the batch run again
    assert len(message_ids(file_table)) == 20


def test_a_promoted_column_evolves_the_schema_of_files(file_table: LakeTable) -> None:
    assert append_files(file_table, batch(0, 4), Marker("q1", 0))
    assert append_files(file_table, batch(4, 4, REVENUE), Marker("q1", 1))
    assert append_files(file_table, batch(8, 4), Marker("q1", 2))  # no longer configured
    schema = file_table.schema()
    assert schema is not None and schema.field("revenue").type == pa.float64()
    revenue = {row["messageId"]: row["revenue"] for row in rows(file_table, ("revenue",))}
    assert revenue == {f"m{n:05d}": (n / 4 if 4 <= n < 8 else None) for n in range(12)}
    assert file_table.committed("q1") == 2


def test_expire_keeps_the_current_version(table: LakeTable) -> None:
    for n in range(3):
        assert table.append(batch(n * 5, 5), Marker("q1", n))
    table.optimize()
    before = rows(table)
    table.expire(timedelta(0))
    table.vacuum(timedelta(0))
    assert rows(table) == before
    assert table.committed("q1") == 2


def test_sql_sees_the_current_version(table: LakeTable) -> None:
    assert query(table, "select count(*) as n from events").to_pylist() == [{"n": 0}]
    for n in range(2):
        assert table.append(batch(n * 5, 5), Marker("q1", n))
    counted = query(table, "select event, count(*) as n from events group by 1 order by 1")
    assert counted.to_pylist() == [
        {"event": "Order Completed", "n": 5},
        {"event": "Signed Up", "n": 5},
    ]
    revenue = "select sum(cast(json_extract(properties, '$.revenue') as double)) as r from events"
    assert query(table, revenue).to_pylist() == [{"r": sum(n / 4 for n in range(10))}]
    with pytest.raises(LakeError, match='column "nope" not found'):
        query(table, "select nope from events")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://x/y", "not understood"),
        ("events", "not understood"),
        ("iceberg+postgresql://u@h/db", "warehouse"),
        ("iceberg:///tmp/x?colour=red", "unknown options colour"),
        ("delta://", "names no table"),
    ],
)
def test_a_bad_url_says_how_to_write_one(url: str, message: str) -> None:
    with pytest.raises(LakeError, match=message):
        open_table(url)


def test_a_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "deltalake", None)
    for name in [m for m in sys.modules if m.startswith("exactly.lake.delta")]:
        monkeypatch.delitem(sys.modules, name)  # the package and its modules, imported again
    with pytest.raises(EnvironmentProblem, match=r"exactly\[lake\]"):
        open_table("delta:///tmp/nowhere")


def test_an_iceberg_table_reads_back_in_a_fresh_process(tmp_path: Path) -> None:
    """pyiceberg's own scan, in another process, from the SQLite catalog file alone."""
    import subprocess
    import sys

    with open_table(f"iceberg://{tmp_path / 'lake'}") as table:
        assert table.append(batch(0, 30, REVENUE), Marker("q1", 0))
        assert table.append(batch(30, 20), Marker("q1", 1))
    script = (
        "import sys\n"
        "from pyiceberg.catalog.sql import SqlCatalog\n"
        "catalog = SqlCatalog('exactly', uri=sys.argv[1], warehouse=sys.argv[2])\n"
        "table = catalog.load_table(('exactly', 'events'))\n"
        "rows = table.scan().to_arrow()\n"
        "ids = rows.column('messageId').to_pylist()\n"
        "print(len(ids), len(set(ids)), sum(1 for v in rows.column('revenue').to_pylist() if v))\n"
    )
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            f"sqlite:///{tmp_path / 'lake' / 'catalog.db'}",
            (tmp_path / "lake" / "warehouse").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert found.stdout.split() == ["50", "50", "29"]  # revenue 0 reads as no revenue


def test_forget_removes_a_person_from_every_version_and_file(
    table: LakeTable, tmp_path: Path
) -> None:
    """``exactly forget`` on the table: the person's rows go, and with them every old version,
    file and log entry that held them (column statistics included, after an optimize)."""
    import gzip

    import pyarrow.parquet as pq

    from exactly.forget.regulations import USER, Forgotten, digest

    def person_events(start: int, count: int) -> list[bytes]:
        found = []
        for value in events(start, count):
            event = json.loads(value)
            if int(event["messageId"][1:]) % 5 == 0:
                event["userId"] = "carol-zz-91c"
                event["context"] = {"traits": {"email": "carol@example.net"}}
            found.append(json.dumps(event).encode())
        return found

    for n in range(4):
        assert table.append(event_rows(person_events(n * 10, 10)), Marker("q1", n))
    table.optimize()  # delta-rs then keeps min and max of every column in its log
    key = b"k" * 32
    forgotten = Forgotten(key, {USER: frozenset({digest(key, USER, "carol-zz-91c")})})
    assert table.forget(forgotten, set()) == 8
    assert len(message_ids(table)) == 32 and "carol-zz-91c" not in str(table.read().to_pylist())
    assert table.forget(forgotten, set()) == 0  # nothing left
    assert table.append(batch(40, 5), Marker("q1", 4))  # the table goes on
    assert len(message_ids(table)) == 37
    for path in tmp_path.rglob("*"):
        if not path.is_file():
            continue
        contents = [path.read_bytes()]
        if path.suffix == ".parquet":
            contents.append(json.dumps(pq.read_table(path).to_pylist(), default=str).encode())
        if path.suffix == ".gz":
            contents.append(gzip.decompress(contents[0]))
        for secret in (b"carol-zz-91c", b"carol@example.net", b"carol-zz-91", b"carol@exam"):
            assert not any(secret in content for content in contents), (path, secret)
