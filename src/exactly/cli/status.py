"""``exactly status``: what each job of the pipeline has done, from durable sources.

Each job leaves a status file under ``DATA_DIR/status`` when it runs; this command finds them and
recomputes the figures live (log end offsets, checkpoints, stores). Sections so far: dedupe.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from exactly.cli.context import context


def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Print per-partition progress of the jobs that ran in this data dir (dedupe so far)."""
    from exactly.dedupe import status as dedupe_status

    found = context(ctx)
    settings = found.settings
    directory = settings.data_dir.resolve() / "status"
    files = sorted(directory.glob("dedupe-*.json"))
    if not files:
        print(f"nothing has run in {settings.data_dir} yet (no status files in {directory})")
        return
    reports = []
    with found.open_log() as log:
        defaults = {"log_url": settings.log_url, "data_dir": settings.data_dir}
        for path in files:
            plan, saved = dedupe_status.load(path, defaults)
            live = dedupe_status.collect(log, plan, saved.late, saved.last_batch)
            reports.append(live)
    if as_json:
        print(json.dumps([{"job": "dedupe", **asdict(r)} for r in reports], indent=1))
        return
    print("\n\n".join(dedupe_status.render(report) for report in reports))
