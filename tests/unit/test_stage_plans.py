"""``exactly up`` and each stage's own command run the same plan from the same settings (issue 32).

Each stage's plan is built by one function beside the stage; the commands and
:func:`exactly.up.pipeline.plans` both call it. Here each command runs as a user would start it,
its ``drive`` replaced by one that keeps the plan and stops, so no Spark query starts; the plan
must equal the one ``up`` builds. The config sets what defaults would hide: a JobDB patience of
5 s (under ``up`` the route query once used 60 s whatever the config said), a dedupe window, a
user table, another aggregate database and JobDB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import exactly.spark.session
from exactly.cli import app
from exactly.config import load_settings
from exactly.up.pipeline import plans

CONFIG = """
[dedupe]
window = "2h"
max_keys = 1000
scope = "workspace"

[aggregate]
url = "sqlite:///{tmp}/counts.db"
retry_seconds = 7

[[aggregate.tables]]
name = "by_source"
group_by = {{ source = "sourceId" }}
measures = {{ n = "count(*)" }}

[delivery]
jobdb = "sqlite://{tmp}/jobs"
jobdb_patience = "5s"
dataset_rows = 10

[[destinations]]
name = "hook"
url = "http://127.0.0.1:9/hook"
"""


class Stop(Exception):
    """Raised by a stage's stand-in ``drive`` once it has the plan."""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "exactly.toml"
    path.write_text(CONFIG.format(tmp=tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("EXACTLY_CONFIG", "EXACTLY_DATA_DIR", "EXACTLY_LOG__URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(exactly.spark.session, "build_session", lambda *_, **__: None)
    return path


def command_plan(monkeypatch: pytest.MonkeyPatch, module: str, config: Path, *args: str) -> Any:
    """The plan ``exactly ARGS`` hands to ``module``'s ``drive``."""
    kept: list[Any] = []

    def drive(*given: Any, **_: Any) -> None:
        kept.append(next(a for a in given if type(a).__name__.endswith("Plan")))
        raise Stop

    monkeypatch.setattr(f"{module}.drive", drive)
    result = CliRunner().invoke(app, ["--config", str(config), *args])
    assert isinstance(result.exception, Stop), result.output
    return kept[0]


def test_up_and_each_command_build_equal_plans(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = plans(load_settings(config))
    assert up.route is not None and up.route.jobdb_patience == 5.0

    dedupe = command_plan(monkeypatch, "exactly.dedupe.driver", config, "dedupe")
    aggregate = command_plan(monkeypatch, "exactly.aggregate.driver", config, "aggregate")
    route = command_plan(monkeypatch, "exactly.delivery.route", config, "route")

    assert dedupe == up.dedupe
    assert aggregate == up.aggregate
    assert route == up.route
    assert aggregate.db_url.endswith("counts.db") and aggregate.retry_seconds == 7
    assert [table.name for table in aggregate.tables] == ["event_counts", "by_source"]
    assert route.jobdb_url.endswith("jobs") and route.dataset_rows == 10


def test_a_flag_changes_the_plan_as_its_setting_does(
    config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--jobdb`` is ``[delivery] jobdb``; ``--window`` is ``[dedupe] window``."""
    route = command_plan(
        monkeypatch, "exactly.delivery.route", config, "route", "--jobdb", f"sqlite://{tmp_path}/j2"
    )
    assert route.jobdb_url == f"sqlite://{tmp_path}/j2" and route.jobdb_patience == 5.0
    dedupe = command_plan(monkeypatch, "exactly.dedupe.driver", config, "dedupe", "--window", "3h")
    assert dedupe.bounds.window == 3 * 3_600_000 and dedupe.scope == "workspace"
