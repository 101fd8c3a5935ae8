"""``exactly replay``: send a destination's finished jobs again, with the same message ids."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer

from exactly.cli.context import with_flags
from exactly.cli.deliver import JOBDB
from exactly.errors import ConfigError
from exactly.text import message


def replay(
    ctx: typer.Context,
    destination: Annotated[
        list[str],
        typer.Option(
            "--destination",
            "-d",
            metavar="NAME[,NAME]",
            help="Destination to replay (repeat it, or separate names with commas).",
        ),
    ],
    since: Annotated[
        str | None,
        typer.Option(
            help="Only events routed at or after this time: 2026-11-23T10:00:00Z (UTC when no "
            "zone is given), a date, or a duration back from now (6h, 2d).",
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Only events routed before this time (same forms as --since)."),
    ] = None,
    state: Annotated[
        str,
        typer.Option(
            help="Replay messages whose latest job ended in these states: succeeded, "
            "discarded, expired (comma-separated).",
        ),
    ] = "discarded,expired",
    jobdb: Annotated[str | None, JOBDB] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list, one object per destination.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Show what would be re-enqueued; enqueue nothing.")
    ] = False,
    chunk: Annotated[
        int, typer.Option(help="Jobs enqueued per JobDB transaction.", min=1, max=100_000)
    ] = 1000,
) -> None:
    """Re-enqueue finished jobs of a destination, from the archive and the live JobDB.

    Each message whose latest job ended in one of --state, and whose first job was routed in
    [--since, --until), gets a new job: the same payload and message id (so the same
    Idempotency-Key and webhook-id), the destination's current URL and headers, a fresh expiry.
    A replay that is interrupted (even by SIGKILL) is resumed by running the same command again;
    no message is enqueued twice. `exactly deliver` then sends them.
    """
    from exactly.delivery.archive import open_archive
    from exactly.delivery.jobdb import opened_jobdb
    from exactly.delivery.replay import parse_states, parse_time
    from exactly.delivery.replay import replay as run_replay

    settings = with_flags(ctx, {"delivery.jobdb": jobdb}).settings
    known = {target.name: target for target in settings.destinations}
    names = [name.strip() for value in destination for name in value.split(",") if name.strip()]
    if not names:
        raise ConfigError("--destination names no destination")
    for name in names:
        if name not in known:
            raise ConfigError(
                f"--destination {name!r} is not in [[destinations]] "
                f"(configured: {', '.join(sorted(known)) or 'none'})"
            )
    states = parse_states(state)
    parse_time(since, time.time(), "--since")  # refused here, before anything is opened
    parse_time(until, time.time(), "--until")
    options = settings.delivery
    archive = open_archive(settings.archive_url)
    archive.check()

    def say(line: str) -> None:
        print(message(f"replay: {line}"), file=sys.stderr, flush=True)

    with opened_jobdb(
        settings.jobdb_url,
        dataset_rows=options.dataset_rows,
        dataset_minutes=options.dataset_minutes,
    ) as database:
        results = []
        for name in dict.fromkeys(names):
            result = run_replay(
                database,
                archive,
                known[name],
                states=states,
                since=since,
                until=until,
                chunk=chunk,
                dry_run=dry_run,
                report=say,
            )
            results.append(result)
            if not as_json:
                print(result.line(), flush=True)
    if as_json:
        print(json.dumps([result.as_dict() for result in results], indent=1))
