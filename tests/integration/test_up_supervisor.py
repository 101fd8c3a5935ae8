"""``exactly up``'s supervision with real child processes: a part that dies is restarted after
1 s, then 2 s, 4 s...; one that keeps dying stops everything with one line; one that ran long
enough starts counting again; ``--patience`` from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from exactly.errors import PartKeepsDying
from exactly.up.supervisor import Part, Supervisor
from tests.cli_text import messages
from tests.servers import free_port


def part(name: str, starts: Path, code: str) -> Part:
    """A Python part that notes the moment of each start in ``starts``, then runs ``code``."""
    note = f"open({str(starts)!r}, 'a').write(repr(__import__('time').monotonic()) + '\\n')"
    return Part(name, [sys.executable, "-c", f"{note}\n{code}"])


def started(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def test_a_part_that_keeps_dying_is_restarted_with_backoff_then_stops_up(tmp_path: Path) -> None:
    dying = part("dying", tmp_path / "dying", "print('error: the port is taken'); exit(3)")
    steady = part("steady", tmp_path / "steady", "import time; time.sleep(600)")
    said: list[str] = []
    supervisor = Supervisor([dying, steady], tmp_path / "logs", say=said.append, patience=4)
    began = time.monotonic()
    with pytest.raises(PartKeepsDying) as stopped:
        supervisor.run(tick=0.05)
    took = time.monotonic() - began
    message = str(stopped.value)
    assert message.startswith("the dying part died 4 times in a row, each within 60 s")
    assert "(exit status 3: error: the port is taken)" in message and "\n" not in message
    starts = started(tmp_path / "dying")
    gaps = [later - earlier for earlier, later in pairwise(starts)]
    assert len(gaps) == 3, gaps
    for gap, wanted in zip(gaps, (1, 2, 4), strict=True):  # the start itself takes some time
        assert wanted <= gap < wanted + 1.5, gaps
    assert said[0] == "dying died (exit status 3: error: the port is taken); restarting in 1 s"
    assert took < 15
    assert len(started(tmp_path / "steady")) == 1  # never restarted, and stopped at the end
    assert not any(running.alive for running in supervisor.parts)


def test_a_part_that_ran_long_enough_starts_counting_again(tmp_path: Path) -> None:
    flaky = part("flaky", tmp_path / "flaky", "import time; time.sleep(0.6); exit(1)")
    said: list[str] = []
    supervisor = Supervisor(
        [flaky], tmp_path / "logs", say=said.append, patience=2, healthy_after=0.5
    )
    deadline = time.monotonic() + 8
    supervisor.run(on_tick=lambda: time.monotonic() > deadline and supervisor.stop(), tick=0.05)
    assert len(started(tmp_path / "flaky")) >= 4  # it died each time, never twice "quickly"
    assert all(line.endswith("restarting in 1 s") for line in said), said


def test_patience_from_the_command_line(tmp_path: Path) -> None:
    """``exactly up --patience 2`` with a collector whose port is taken: two deaths, one line."""
    import socket

    port = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    config = tmp_path / "exactly.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n[console]\nport = 0\n[collector]\nport = {port}\n'
        '[collector.sources]\nweb = "wk"\n'
    )
    try:
        result = subprocess.run(
            [sys.executable, "-m", "exactly", "up", "--no-live", "--patience", "2"],
            cwd=tmp_path,
            env={**os.environ, "EXACTLY_CONFIG": str(config)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        holder.close()
    assert result.returncode == 1, result.stderr
    last = messages(result.stderr)[-1]  # the error, wrapped to 80 columns, as one line
    assert last.startswith("error: the collector part died 2 times in a row"), result.stderr
    assert "Traceback" not in result.stderr
