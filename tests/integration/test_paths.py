"""Where a command looks: relative paths in a config file follow the file, not the working
directory; flags, ``EXACTLY_*`` variables and no file at all follow the working directory; and a
read-only command creates nothing, saying in one line that nothing ran there (issue 32, item 2).

Every command runs as a subprocess from another directory than the config file's, as a user
does with ``exactly --config /x/exactly.toml ...``; none starts Spark.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.text import message
from tests.cli_text import said

EXACTLY = [sys.executable, "-m", "exactly"]
# the five that only look: each reads a store that an earlier stage makes
READ_ONLY = [("status",), ("stats",), ("trace", "m-1"), ("deliveries",), ("audit",)]


def run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EXACTLY_")}
    return subprocess.run(
        [*EXACTLY, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, **env},
        timeout=120,
        check=False,
    )


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """A (the config file's directory, ``data_dir = ".exactly"``) and B (where commands run)."""
    home, elsewhere = tmp_path.resolve() / "a", tmp_path.resolve() / "b"
    home.mkdir()
    elsewhere.mkdir()
    (home / "exactly.toml").write_text('data_dir = ".exactly"\n')
    return home, elsewhere


def test_a_relative_data_dir_is_beside_the_config_file(places: tuple[Path, Path]) -> None:
    home, elsewhere = places
    config = str(home / "exactly.toml")
    assert run("--config", config, "log", "create", "raw", cwd=elsewhere).returncode == 0
    appended = subprocess.run(
        [*EXACTLY, "--config", config, "log", "append", "raw"],
        input='{"key": "m-1", "value": {"messageId": "m-1", "type": "track"}}\n',
        capture_output=True,
        text=True,
        cwd=elsewhere,
        check=True,
    )
    assert appended.returncode == 0
    assert (home / ".exactly" / "log" / "raw.sqlite").exists()
    from exactly.delivery.jobdb import open_jobdb

    with open_jobdb(f"sqlite://{home / '.exactly' / 'jobdb'}") as jobdb:
        jobdb.datasets()  # made, with its tables
    assert tree(elsewhere) == []

    shown = run("--config", config, "status", cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    words = " ".join(shown.stdout.split())  # a long path is on a line of its own
    assert f"data dir {home / '.exactly'}" in words  # the paths below relative to it
    assert "log sqlite log\n" in shown.stdout
    traced = run("--config", config, "trace", "m-1", cwd=elsewhere)
    assert traced.returncode == 0, traced.stdout + traced.stderr
    assert "accepted 1 time" in traced.stdout
    listed = run("--config", config, "deliveries", "--json", cwd=elsewhere)
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    assert tree(elsewhere) == []  # nothing made where the commands ran


def test_without_data_dir_in_the_file_the_default_is_beside_it(
    places: tuple[Path, Path],
) -> None:
    home, elsewhere = places
    (home / "exactly.toml").write_text("[spark]\nmaster = 'local[1]'\n")
    done = run("--config", "../a/exactly.toml", "log", "create", "raw", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert f"sqlite://{home / '.exactly' / 'log'}" in done.stdout
    assert tree(elsewhere) == []


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda command: command[0])
def test_a_read_only_command_creates_nothing_and_says_so(
    places: tuple[Path, Path], command: tuple[str, ...]
) -> None:
    home, elsewhere = places
    before = tree(home.parent)
    done = run("--config", str(home / "exactly.toml"), *command, cwd=elsewhere)
    assert (done.returncode, done.stdout) == (1, ""), done.stdout + done.stderr
    assert done.stderr == message(f"nothing has run in {home / '.exactly'} yet") + "\n"
    assert tree(home.parent) == before

    (home / ".exactly").mkdir()  # a data dir where this stage never ran: still one line
    before = tree(home.parent)
    done = run("--config", str(home / "exactly.toml"), *command, cwd=elsewhere)
    assert (done.returncode, done.stdout) == (1, ""), done.stdout + done.stderr
    assert said(done.stderr).startswith(f"nothing has run in {home / '.exactly'} yet")
    assert done.stderr == message(said(done.stderr)) + "\n"  # one message
    assert tree(home.parent) == before


@pytest.mark.parametrize("command", READ_ONLY, ids=lambda command: command[0])
def test_without_a_config_file_paths_follow_the_working_directory(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    here = tmp_path.resolve()
    done = run(*command, cwd=here)
    assert done.returncode == 1
    assert done.stderr == message(f"nothing has run in {here / '.exactly'} yet") + "\n"
    assert tree(here) == []


def test_flags_and_variables_follow_the_working_directory(places: tuple[Path, Path]) -> None:
    home, elsewhere = places
    config = str(home / "exactly.toml")
    done = run("--config", config, "--data-dir", "flag", "status", cwd=elsewhere)
    assert done.stderr == message(f"nothing has run in {elsewhere / 'flag'} yet") + "\n"
    done = run("--config", config, "status", cwd=elsewhere, EXACTLY_DATA_DIR="variable")
    assert done.stderr == message(f"nothing has run in {elsewhere / 'variable'} yet") + "\n"
    done = run(
        "--config", config, "stats", cwd=elsewhere, EXACTLY_AGGREGATE__URL="sqlite://counts.db"
    )
    assert said(done.stderr).startswith(f"nothing has run in {elsewhere / 'counts.db'} yet")
    assert tree(home.parent) == ["a", "a/exactly.toml", "b"]
