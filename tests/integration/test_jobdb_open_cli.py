"""``exactly deliver`` and ``exactly deliveries`` with a JobDB that cannot be opened (a database
that does not exist, a wrong password, a port nothing listens on): one line naming the JobDB with
its password masked and the driver's reason, exit code 1, no traceback (issue 31, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.aggregate_db import postgres_missing
from tests.cli_text import messages
from tests.conftest import require
from tests.jobdb import mysql_missing
from tests.servers import free_port

PASSWORD = "s3cret-pw"
COMMANDS = [("deliver", "--until-drained"), ("deliveries",)]


def run(tmp_path: Path, jobdb: str, *command: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "exactly.toml"
    config.write_text('[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/hook"\n')
    base = [sys.executable, "-m", "exactly", "--config", str(config), "--data-dir", str(tmp_path)]
    return subprocess.run(
        [*base, *command, "--jobdb", jobdb],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )


def assert_one_line(done: subprocess.CompletedProcess[str], shown: str, reason: str) -> None:
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = messages(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot open the JobDB {shown}: "), lines[0]
    assert reason in lines[0]
    assert PASSWORD not in done.stderr + done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_a_postgresql_database_that_does_not_exist(tmp_path: Path, command: tuple[str]) -> None:
    require(postgres_missing())
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:5432/exactly_no_such_db"
    done = run(tmp_path, url, *command)
    shown = "postgresql://postgres:***@127.0.0.1:5432/exactly_no_such_db"
    assert_one_line(done, shown, 'database "exactly_no_such_db" does not exist')


@pytest.mark.parametrize("command", COMMANDS)
def test_a_wrong_mariadb_password(tmp_path: Path, command: tuple[str]) -> None:
    require(mysql_missing())
    done = run(tmp_path, f"mysql://root:{PASSWORD}@127.0.0.1:3306/test", *command)
    assert_one_line(done, "mysql://root:***@127.0.0.1:3306/test", "Access denied")


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_port_nothing_listens_on(tmp_path: Path, command: tuple[str], scheme: str) -> None:
    port = free_port()
    done = run(tmp_path, f"{scheme}://root:{PASSWORD}@127.0.0.1:{port}/db", *command)
    assert_one_line(done, f"{scheme}://root:***@127.0.0.1:{port}/db", "refused")
