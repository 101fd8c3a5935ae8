"""``exactly copy`` and ``exactly sink`` as a user runs them: real processes, one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.log import open_log
from exactly.spark.copy import default_checkpoint
from exactly.spark.streaming import checkpoint_lock
from tests.cli_text import messages
from tests.job_child import FAST_JVM
from tests.spark_helpers import assert_copied, fill, jvm_lines

EXACTLY = [sys.executable, "-m", "exactly"]


def run(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXACTLY, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={
            **os.environ,
            "JDK_JAVA_OPTIONS": FAST_JVM,
            "EXACTLY_SPARK__MASTER": "local[2]",
            **(env or {}),
        },
        timeout=600,
        check=False,
    )


_LATE_SOURCE = """
import os, sys, time
from pathlib import Path

# Spark's Python source of a query, started the first time only: late past Spark's fixed 10 s
if "python_streaming_source_runner" in " ".join(sys.orig_argv):
    marker = Path(os.environ["EXACTLY_TEST_LATE_ONCE"])
    if not marker.exists():
        marker.touch()
        time.sleep(12)
"""


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    lines = messages(result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.spark
def test_copy_until_caught_up_and_the_topic_owner(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / '.exactly' / 'log'}"
    with open_log(url) as log:
        log.create_topic("src", 2)
        fill(log, "src", 2, 50)
    checkpoint = default_checkpoint(tmp_path / ".exactly", url, "src", "dst")
    # What a copy killed while Spark wrote its first offsets leaves: Spark alone refuses to start.
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / ".0.5f1d3c2a-tmp.tmp").write_text("v1\n")
    # And the query's Python source late past Spark's fixed 10 s, as on a loaded machine: the
    # first one is held 12 s (a sitecustomize); the query starts again.
    late = tmp_path / "late"
    late.mkdir()
    (late / "sitecustomize.py").write_text(_LATE_SOURCE)
    held = {
        "PYTHONPATH": os.pathsep.join([str(late), os.environ.get("PYTHONPATH", "")]),
        "EXACTLY_TEST_LATE_ONCE": str(tmp_path / "late-once"),
    }
    copied = run("copy", "src", "dst", "--until-caught-up", cwd=tmp_path, env=held)
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "late-once").exists()  # the first source was held
    started_again = [line for line in messages(copied.stderr) if line.startswith("warning:")]
    assert started_again == [
        "warning: query copy src to dst: its Python source did not connect back within "
        "Spark's fixed 10 s (a loaded machine); starting it again (2 of 5)"
    ], copied.stderr
    # JDK_JAVA_OPTIONS' note, the incubator warning, Spark's WARNs: all in files, none here
    assert jvm_lines(copied.stdout + copied.stderr) == [], copied.stderr
    assert copied.stdout.strip() == "caught up: 100 records copied in 1 micro-batches"
    with open_log(url) as log:
        assert_copied(log, "src", "dst")
    assert (checkpoint / "commits" / "0").exists()

    refused = one_error_line(run("copy", "src", "dst", "--checkpoint", "other", cwd=tmp_path))
    assert f"checkpoint {checkpoint}" in refused and "exactly sink release dst" in refused
    owner = run("sink", "owner", "dst", cwd=tmp_path)
    assert owner.stdout.startswith("topic dst: owned by sink ") and str(checkpoint) in owner.stdout
    released = run("sink", "release", "dst", cwd=tmp_path)
    assert released.stdout.startswith("topic dst: released from sink ")
    assert run("sink", "owner", "dst", cwd=tmp_path).stdout == "topic dst: no sink owns it\n"


def test_copy_refuses_bad_input_before_starting_spark(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / '.exactly' / 'log'}"
    with open_log(url) as log:
        log.create_topic("src", 2)
        log.create_topic("three", 3)
    assert "topic 'nope' does not exist" in one_error_line(run("copy", "nope", "x", cwd=tmp_path))
    mismatch = one_error_line(run("copy", "src", "three", cwd=tmp_path))
    assert "exactly copy keeps partitions: 'three' has 3 partitions, 'src' has 2" in mismatch
    bad = one_error_line(run("copy", "src", "x", "--starting-offsets", "soon", cwd=tmp_path))
    assert "--starting-offsets is 'soon'" in bad
    with checkpoint_lock(default_checkpoint(tmp_path / ".exactly", url, "src", "dst"), "copy"):
        busy = one_error_line(run("copy", "src", "dst", cwd=tmp_path))
    assert "another exactly copy is running with checkpoint" in busy
