"""No credentials at rest (issue 31, items 3 and 4): a destination's URL user info, ``?token=``
and configured headers reach the receiver, but never a JobDB row, an archive file (a directory, S3
on moto's server), ``exactly deliveries`` or ``exactly trace``: on every JobDB, every byte is
searched for marked values."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from exactly.cli import app
from exactly.config import load_settings
from exactly.delivery.archive import BACKENDS as ARCHIVES
from exactly.delivery.archive import Archive, open_archive
from exactly.delivery.director import Director
from exactly.delivery.jobdb import BACKENDS, open_jobdb
from exactly.delivery.route import Event, EventColumns, jobs_for
from exactly.delivery.settings import DestinationSettings
from exactly.log import open_log
from tests.archives import archive_url
from tests.jobdb import jobdb_url
from tests.receiver import Receiver

HEADER = "MARK-header-123"
PASSWORD = "MARK-pw-456"
TOKEN = "MARK-token-789"
KEY = "MARK-key-321"
MARKS = (HEADER, PASSWORD, TOKEN, KEY)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with jobdb_url(request.param, tmp_path) as found:
        yield found


@pytest.fixture(params=ARCHIVES)
def archive(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Archive]:
    s3 = request.getfixturevalue("moto_s3") if request.param == "s3" else None
    with archive_url(request.param, tmp_path, s3) as found:
        yield open_archive(found)


def destinations(port: int) -> list[dict[str, Any]]:
    """A bearer token and an API key in headers, a password in user info (aiohttp refuses it
    beside an Authorization header, so on a destination of its own), a token in every query."""
    here = f"127.0.0.1:{port}"
    return [
        {
            "name": "bearer",
            "url": f"http://{here}/ok?token={TOKEN}",
            "headers": {"Authorization": f"Bearer {HEADER}", "X-Api-Key": KEY},
        },
        {"name": "userinfo", "url": f"http://user:{PASSWORD}@{here}/ok?token={TOKEN}"},
        {
            "name": "refusing",
            "url": f"http://{here}/status/404?token={TOKEN}",
            "headers": {"X-Api-Key": KEY},
        },
    ]


def config(path: Path, jobdb: str, archive: Archive, entries: list[dict[str, Any]]) -> Path:
    text = f'data_dir = "{path / "data"}"\n[delivery]\njobdb = "{jobdb}"\n'
    text += f'archive = "{archive.url}"\n'
    for entry in entries:
        text += f'[[destinations]]\nname = "{entry["name"]}"\nurl = "{entry["url"]}"\n'
        headers = ", ".join(f'"{k}" = "{v}"' for k, v in entry.get("headers", {}).items())
        text += f"headers = {{ {headers} }}\n"
    (path / "exactly.toml").write_text(text)
    return path / "exactly.toml"


def events(first: int, count: int) -> list[Event]:
    return [
        Event("web", "Signed Up", f"m{n}", f"u{n}", b'{"messageId":"m%d"}' % n, 0, n)
        for n in range(first, first + count)
    ]


def jobdb_bytes(url: str) -> bytes:
    """Every file of a SQLite JobDB, or every value of every table of a server's JobDB."""
    if url.startswith("sqlite://"):
        files = sorted(Path(url.removeprefix("sqlite://")).iterdir())
        return b"".join(path.read_bytes() for path in files if path.is_file())
    from exactly.delivery.jobdb.sql import SQLJobDB

    dump: list[bytes] = []
    with open_jobdb(url) as db:
        assert isinstance(db, SQLJobDB)
        with db._mutex:
            cursor = db._execute(db._cursor(), db._list_tables())
            tables = [str(row[0]) for row in cursor.fetchall()]
            assert "jobs_1" not in tables and "jobs_3" in tables  # archived and live datasets
            for table in tables:
                for row in db._execute(cursor, f"SELECT * FROM {table}").fetchall():
                    for value in row:
                        raw = isinstance(value, bytes | bytearray | memoryview)
                        dump.append(bytes(value) if raw else str(value).encode())
            db._connection.commit()
    return b"\n".join(dump)


def archive_bytes(archive: Archive) -> bytes:
    """Every file the archive lists, as stored and unpacked."""
    found: list[bytes] = []
    for name in archive._list():
        with archive._open(name) as stored:
            packed = stored.read()
        found += [packed, gzip.decompress(packed)]
    return b"\n".join(found)


def test_no_destination_credential_is_stored_archived_or_shown(
    url: str, archive: Archive, tmp_path: Path
) -> None:
    with Receiver() as receiver:
        entries = destinations(receiver.port)
        targets = [DestinationSettings.model_validate(entry) for entry in entries]
        with open_jobdb(url, dataset_rows=6) as db:
            for batch in range(3):  # datasets 1 to 3, each 2 events x 3 destinations
                routed = jobs_for(EventColumns.of(events(2 * batch, 2)), targets, time.time())
                assert db.add(routed, query_id="route", batch_id=batch) == 6
            director = Director(
                db, targets, poll_seconds=0.05, report=lambda _: None, archive=archive,
                archive_seconds=0.1,
            )  # fmt: skip
            director.run(until_drained=True)
            assert director.archived == 2  # datasets 1 and 2; the newest stays
            assert director.tallies["bearer"].succeeded == 6
            assert director.tallies["userinfo"].succeeded == 6
            assert director.tallies["refusing"].discarded == 6
            last = jobs_for(EventColumns.of(events(6, 2)), targets, time.time())
            db.add(last, query_id="route", batch_id=3)
    # the receiver got them, resolved from the settings at send time
    sent = {r.headers.get("Authorization") for r in receiver.requests if r.path == "/ok"}
    assert f"Bearer {HEADER}" in sent and any(a and a.startswith("Basic ") for a in sent)
    assert any(r.headers.get("X-Api-Key") == KEY for r in receiver.requests)

    stored = jobdb_bytes(url)
    archived = archive_bytes(archive)
    assert len(archive.names()) == 2 and b'"message_id":"m0"' in archived
    runner = CliRunner()
    path = config(tmp_path, url, archive, entries)
    with open_log(load_settings(path).log_url):  # trace reads the JobDB once a log exists
        pass
    shown = []
    for args in (["deliveries"], ["deliveries", "--json"], ["trace", "m4"], ["trace", "m7"]):
        for json_or_not in ([], ["--json"]) if args[0] == "trace" else ([],):
            result = runner.invoke(app, ["--config", str(path), *args, *json_or_not])
            assert result.exit_code == 0, result.output
            shown.append(result.output)
    rows = {row["destination"]: row for row in json.loads(shown[1])}
    assert rows["refusing"]["last_error"].startswith("404")
    traced = json.loads(shown[3])["deliveries"]  # m4: delivered, in the live dataset 3
    assert {delivery["destination"] for delivery in traced} == {"bearer", "userinfo", "refusing"}
    places = {"the JobDB": stored, "the archive": archived}
    places |= {f"output {i} of the CLI": output.encode() for i, output in enumerate(shown)}
    leaks = [
        f"{mark} in {where}"
        for mark in MARKS
        for where, text in places.items()
        if mark.encode() in text
    ]
    assert leaks == []
