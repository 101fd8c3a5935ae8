"""``exactly up``: the pipeline as one supervised service; ``exactly pipeline``: its Spark part."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from exactly.cli.context import Context, with_master
from exactly.cli.options import Master, TriggerSeconds
from exactly.errors import ConfigError

if TYPE_CHECKING:
    from exactly.config import Settings
    from exactly.up.supervisor import Supervisor


def up(
    ctx: typer.Context,
    master: Master = None,
    trigger_seconds: TriggerSeconds = 1.0,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live",
            help="A live table of each stage's rate and lag (default: when on a terminal); "
            "without it a summary line per stage every --every seconds.",
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        float, typer.Option(help="Seconds between two status summaries without --live.", min=1)
    ] = 10.0,
    patience: Annotated[
        int,
        typer.Option(
            help="Stop when a part dies this many times in a row, each within a minute of "
            "starting.",
            min=1,
        ),
    ] = 5,
) -> None:
    """Run the whole pipeline of exactly.toml as one service until SIGTERM or Ctrl-C.

    Parts: the collector ([collector]), one Spark application running the dedupe, aggregate and
    route queries ([dedupe], [aggregate], [[destinations]]), and the director when there are
    destinations. A part that dies is restarted with backoff; one that keeps dying stops `up`
    with one line. SIGTERM or Ctrl-C stops it within 30 s: the collector first (it finishes its
    durable appends), then each query after its micro-batch and the director after its requests
    in flight. Each part's output: DATA_DIR/up/PART.log. A web console of every stage, with its
    numbers as JSON at /api/state: [console] port (default http://127.0.0.1:8089; 0: none).
    """
    from exactly.up.supervisor import Part, Supervisor
    from exactly.up.view import View

    state = with_master(ctx, master)
    settings = state.settings
    if not settings.collector.sources:
        raise ConfigError(
            "no source: add write keys under [collector.sources] in exactly.toml "
            '(web = "KEY") or set EXACTLY_COLLECTOR__SOURCES=web=KEY'
        )
    from exactly.dedupe.driver import refuse_local_store
    from exactly.dedupe.job import store_kind

    refuse_local_store(store_kind(settings.dedupe.store), settings.spark.master)
    with state.open_log() as log:
        log.create_topic("raw", settings.collector.partitions, exist_ok=True)
    command = [sys.executable, "-m", "exactly"]
    parts = [
        Part("collector", [*command, "collect"], stops_first=True),
        Part("pipeline", [*command, "pipeline", "--trigger-seconds", str(trigger_seconds)]),
    ]
    if settings.destinations:  # [delivery] directors: "director", "director-2", ...
        for number in range(1, settings.delivery.directors + 1):
            name = "director" if number == 1 else f"director-{number}"
            parts.append(Part(name, [*command, "deliver"]))
    log_dir = settings.data_dir.resolve() / "up"

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    supervisor = Supervisor(parts, log_dir, env=_environment(state), say=say, patience=patience)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.stop())
    say(
        f"up: {', '.join(part.name for part in parts)} (logs in {log_dir}); "
        f"collecting on http://{settings.collector.host}:{settings.collector.port}"
    )
    with state.open_log() as log, _console(settings, supervisor, say):
        on_terminal = sys.stdout.isatty() if live is None else live
        with View(
            settings, log, supervisor, live=on_terminal, every=1.0 if on_terminal else every
        ) as view:
            supervisor.run(on_tick=view.tick)
    say("stopped")


def pipeline(
    ctx: typer.Context, master: Master = None, trigger_seconds: TriggerSeconds = 1.0
) -> None:
    """The Spark part of `exactly up`: every stage the config enables (dedupe, aggregate, and
    route and the lake when configured) as queries of one application."""
    from exactly.errors import CONFIG_REFUSED, ConfigError
    from exactly.text import message
    from exactly.up.pipeline import run

    try:
        run(with_master(ctx, master).settings, trigger_seconds)
    except ConfigError as error:  # a filter or transform refused: restarting cannot help
        print(message(f"error: {error}"), file=sys.stderr)
        sys.exit(CONFIG_REFUSED)


def _console(
    settings: Settings, supervisor: Supervisor, say: Callable[[str], None]
) -> contextlib.AbstractContextManager[object]:
    """The web console ([console]) while the supervisor runs, or nothing when it is off."""
    if not settings.console.on:
        return contextlib.nullcontext()
    from exactly.console.server import Console

    return Console(settings, supervisor, say=say)


def _environment(state: Context) -> dict[str, str]:
    """The environment of the parts: this one, with the global options as variables."""
    env = dict(os.environ)
    if state.config is not None:
        env["EXACTLY_CONFIG"] = str(state.config.resolve())
    if state.data_dir is not None:
        env["EXACTLY_DATA_DIR"] = str(state.data_dir.resolve())
    if state.log_url is not None:
        env["EXACTLY_LOG__URL"] = state.log_url
    if state.master is not None:
        env["EXACTLY_SPARK__MASTER"] = state.master  # the pipeline part's --master
    env["PYTHONUNBUFFERED"] = "1"
    return env
