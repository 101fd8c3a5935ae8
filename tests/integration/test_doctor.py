"""``exactly doctor`` as a user runs it: every configured backend checked, one line each.

Against the real PostgreSQL, MariaDB and Redis services (a schema and a database of the test's
own), then against closed ports and a host that cannot resolve: ✗ lines, exit 1, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.aggregate_db import postgres_missing, postgres_schema
from tests.conftest import require
from tests.jobdb import mysql_database, mysql_missing
from tests.servers import free_port
from tests.spark_helpers import jvm_lines

EXACTLY = [sys.executable, "-m", "exactly"]


def doctor(*args: str, cwd: Path, config: str = "") -> subprocess.CompletedProcess[str]:
    (cwd / "exactly.toml").write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXACTLY_")}
    return subprocess.run(
        [*EXACTLY, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
    )


def lines_of(result: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    """The report's findings by check name, a finding's lines joined; every line fits in 80
    columns, and a finding starts with ✓ or ✗ (its further lines are indented)."""
    found: dict[str, list[str]] = {}
    last: list[str] = []
    for line in result.stdout.splitlines():
        assert len(line) <= 80 or len(line.split()) == 1, line  # a path longer than a line
        if line.startswith("    ") and last:
            last[-1] += " " + line.strip()
            continue
        assert line[:2] in ("✓ ", "✗ "), line
        last = found.setdefault(line[2:].split()[0], [])
        last.append(line)
    return found


def test_every_backend_answers(tmp_path: Path, redis_servers: list[str]) -> None:
    require(postgres_missing())
    require(mysql_missing())
    with postgres_schema() as aggregate, mysql_database() as jobdb:
        config = f"""
[aggregate]
url = "{aggregate}"
[dedupe]
store = "{redis_servers[0]}"
[delivery]
jobdb = "{jobdb}"
[[destinations]]
name = "hook"
url = "http://localhost:9/events"
"""
        result = doctor("doctor", "--no-spark", cwd=tmp_path, config=config)
    assert result.returncode == 0, result.stdout + result.stderr
    found = lines_of(result)
    assert all(line.startswith("✓") for lines in found.values() for line in lines)
    assert found["aggregate"] == ["✓ aggregate postgresql://127.0.0.1:5432/test reachable"]
    assert found["dedupe"][0].startswith("✓ dedupe    redis://127.0.0.1:6379")
    assert "answers" in found["dedupe"][0]
    assert found["jobdb"][0].startswith("✓ jobdb     mysql://127.0.0.1:3306/exac")
    assert found["jobdb"][0].endswith("reachable (no tables yet)")  # and doctor made none
    assert found["archive"][0].startswith("✓ archive   file archive")  # in the data dir
    assert found["archive"][0].endswith(" not made yet (exactly deliver makes it)")
    assert not (tmp_path / ".exactly" / "archive").exists()
    assert found["dest"] == ["✓ dest      localhost (hook) resolves to 127.0.0.1"]
    assert found["log"][0].startswith("✓ log       sqlite log reachable")  # in the data dir
    assert result.stderr == ""


def test_each_bad_backend_is_a_line_and_exit_1(tmp_path: Path) -> None:
    closed = free_port()
    config = f"""
[log]
url = "kafka://127.0.0.1:{closed}"
[aggregate]
url = "postgresql://postgres:secret@127.0.0.1:{closed}/test"
[dedupe]
store = "redis://127.0.0.1:{closed}/0"
[delivery]
jobdb = "mysql://root@127.0.0.1:{closed}/test"
archive = "{tmp_path / "exactly.toml" / "archive"}"
[[destinations]]
name = "orders-hook"
url = "https://nothing.invalid/hook"
"""
    began = time.monotonic()
    result = doctor("doctor", "--no-spark", cwd=tmp_path, config=config)
    assert time.monotonic() - began < 30  # the probes run at once, 2 s each
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "secret" not in result.stdout + result.stderr
    found = lines_of(result)
    for name, fix in (
        ("log", "start it or fix [log] url"),
        ("aggregate", "start it or fix [aggregate] url"),
        ("dedupe", "start it or fix [dedupe] store"),
        ("jobdb", "start it or fix [delivery] jobdb"),
        ("archive", "fix [delivery] archive"),
    ):
        assert len(found[name]) == 1 and found[name][0].startswith("✗"), found[name]
        assert found[name][0].endswith(f"; {fix}"), found[name]
    for name in ("aggregate", "dedupe", "jobdb"):
        assert str(closed)[-3:] in found[name][0] and ": refused;" in found[name][0]
    assert "cannot be made" in found["archive"][0]
    assert found["dest"] == ["✗ dest      nothing.invalid (orders-hook): no such host; fix its url"]
    assert result.stderr == "doctor: 6 check(s) failed\n"


def test_a_bad_setting_is_one_line(tmp_path: Path) -> None:
    result = doctor("doctor", "--no-spark", cwd=tmp_path, config="[spark]\nmaster = 3\n")
    assert result.returncode == 1
    assert lines_of(result)["config"][0].startswith("✗ config    setting spark.master")
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: setting spark.master")


@pytest.mark.slow
@pytest.mark.spark
def test_nothing_from_the_jvm_unless_verbose(tmp_path: Path) -> None:
    quiet = doctor("doctor", cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "✓ spark" in quiet.stdout
    assert jvm_lines(quiet.stdout + quiet.stderr) == []
    logs = tmp_path / ".exactly" / "logs"
    assert "Using incubator modules" in (logs / "spark-exactly-doctor.stderr.log").read_text()

    verbose = doctor("doctor", "--verbose", cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    # Spark adds jdk.incubator.vector to every JVM it starts, and the JDK says so on stderr
    assert "WARNING: Using incubator modules" in jvm_lines(verbose.stderr)[0]
