"""``exactly up`` and each stage's own command run the same plan from the same settings (issue 32).

Each stage is declared once, in :data:`exactly.stages.STAGES`, with the one function that builds
its plan; its command and :func:`exactly.up.pipeline.queries` both go through it. Here each
stage's command runs as a user would start it, the entry's ``open`` and ``drive`` replaced by
ones that keep the plan and stop, so no Spark query starts; the plan must equal the one ``up``
builds, for every stage of the registry. The config sets what defaults would hide: a JobDB
patience of 5 s (under ``up`` the route query once used 60 s whatever the config said), a
dedupe window, a user table, another aggregate database and JobDB, a lake table with a promoted
column.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import exactly.spark.session
from exactly.cli import app
from exactly.config import load_settings
from exactly.stages import DEDUPE, ROUTE, STAGES, Stage, enabled
from exactly.up.pipeline import queries

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

[lake]
url = "delta://{tmp}/table"
retention = "3d"
columns = {{ plan = "properties.plan string" }}
max_tables = 40
max_columns = 200
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


def command_plan(
    monkeypatch: pytest.MonkeyPatch, stage: Stage[Any, Any, Any], config: Path, *flags: str
) -> Any:
    """The plan ``exactly STAGE FLAGS`` hands to its registry entry's ``drive``."""
    kept: list[Any] = []

    def drive(_spark: object, plan: Any, _target: object, **_: Any) -> None:
        kept.append(plan)
        raise Stop

    monkeypatch.setattr(stage, "open", lambda *_: contextlib.nullcontext())
    monkeypatch.setattr(stage, "drive", drive)
    result = CliRunner().invoke(app, ["--config", str(config), stage.name, *flags])
    assert isinstance(result.exception, Stop), result.output
    return kept[0]


def test_up_runs_every_stage_of_the_registry_with_this_config(config: Path) -> None:
    settings = load_settings(config)
    assert enabled(settings) == list(STAGES)
    assert [query.stage for query in queries(settings)] == list(STAGES)


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.name)
def test_up_and_the_stage_command_build_equal_plans(
    config: Path, monkeypatch: pytest.MonkeyPatch, stage: Stage[Any, Any, Any]
) -> None:
    up = {query.name: query.plan for query in queries(load_settings(config))}
    assert command_plan(monkeypatch, stage, config) == up[stage.name]
    assert up[stage.name].checkpoint == stage.checkpoint(load_settings(config))


def test_the_plans_hold_what_the_config_says(config: Path) -> None:
    up = {query.name: query.plan for query in queries(load_settings(config))}
    dedupe, aggregate, route, lake = (up[stage.name] for stage in STAGES)
    assert dedupe.bounds.window == 2 * 3_600_000 and dedupe.scope == "workspace"
    assert aggregate.db_url.endswith("counts.db") and aggregate.retry_seconds == 7
    assert [table.name for table in aggregate.tables] == ["event_counts", "by_source"]
    assert route.jobdb_patience == 5.0
    assert route.jobdb_url.endswith("jobs") and route.dataset_rows == 10
    assert lake.table_url.endswith("table") and lake.retention.days == 3
    assert [column.name for column in lake.columns] == ["plan"]
    assert lake.layout == "segment"  # the default
    assert (lake.limits.tables, lake.limits.columns) == (40, 200)
    for stage in STAGES:  # the trigger bound when none is given, declared once per stage
        assert up[stage.name].max_records_per_trigger == stage.max_records_per_trigger


def test_a_stage_the_settings_leave_out_is_not_run(config: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text('[dedupe]\nwindow = "2h"\n')
    assert [stage.name for stage in enabled(load_settings(bare))] == ["dedupe", "aggregate"]


def test_a_flag_changes_the_plan_as_its_setting_does(
    config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--jobdb`` is ``[delivery] jobdb``; ``--window`` is ``[dedupe] window``."""
    route = command_plan(monkeypatch, ROUTE, config, "--jobdb", f"sqlite://{tmp_path}/j2")
    assert route.jobdb_url == f"sqlite://{tmp_path}/j2" and route.jobdb_patience == 5.0
    dedupe = command_plan(monkeypatch, DEDUPE, config, "--window", "3h")
    assert dedupe.bounds.window == 3 * 3_600_000 and dedupe.scope == "workspace"
