"""``./dev`` answers ``help`` before installing anything, and an install shows its steps.

The script runs on a copy of itself beside ``pyproject.toml``, with a stand-in Python whose ``pip``
only records its arguments: what is checked is the script's own flow, not pip.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_PYTHON = """#!/usr/bin/env bash
# a stand-in python: makes a "venv" of itself, records pip calls, runs nothing
here=$(dirname "$0")
case "$1" in
  -c) exit 0 ;;
  --version) echo "Python 3.11.9" ;;
  -m)
    if [ "$2" = venv ]; then
      mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
      printf '#!/usr/bin/env bash\\necho "exactly $*"\\n' >"$3/bin/exactly"
      chmod +x "$3/bin/exactly"
    else
      shift 2 && echo "$*" >>"$here/../pip-calls"
    fi
    ;;
esac
"""


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "dev", tmp_path / "dev")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def dev(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": str(clone / "python3")}
    return subprocess.run(
        [str(clone / "dev"), *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize(("args", "code"), [(["help"], 0), (["--help"], 0), ([], 2)])
def test_help_answers_before_installing_anything(clone: Path, args: list[str], code: int) -> None:
    done = dev(clone, *args)
    assert done.returncode == code
    said = done.stdout + done.stderr
    for command in ("demo [OPTIONS]", "test [PYTEST ARGS]", "help"):
        assert f"\n  {command}" in said
    assert not (clone / ".venv").exists()


def test_an_install_says_each_step_with_its_time_and_happens_once(clone: Path) -> None:
    first = dev(clone, "demo", "--events", "10")
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    for done in ("venv created", "pip upgraded", "exactly installed", "extras and test tools"):
        assert any(re.fullmatch(rf"  {done}.* +\d+ s", line) for line in lines), first.stdout
    assert re.search(r"\.venv ready in \d+ s", first.stdout)
    assert lines[-1] == "exactly demo --events 10"
    calls = (clone / ".venv" / "pip-calls").read_text().splitlines()
    assert calls[-1] == "install --quiet -e .[dev]"

    again = dev(clone, "demo")
    assert again.stdout == "exactly demo\n"  # installed: straight to the command
