"""Options every streaming command (copy, dedupe, aggregate) takes, spelled once."""

from __future__ import annotations

from typing import Annotated

import typer

UntilCaughtUp = Annotated[
    bool,
    typer.Option(
        "--until-caught-up",
        help="Process what is there now (Trigger.AvailableNow), then exit 0.",
        envvar="EXACTLY_UNTIL_CAUGHT_UP",
    ),
]
MaxRecordsPerTrigger = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="At most N records per micro-batch.",
        envvar="EXACTLY_MAX_RECORDS_PER_TRIGGER",
    ),
]
TriggerSeconds = Annotated[
    float,
    typer.Option(min=0.0, help="Seconds between micro-batches.", envvar="EXACTLY_TRIGGER_SECONDS"),
]
Master = Annotated[
    str | None,
    typer.Option(
        help="Spark master URL (spark://HOST:7077, yarn, k8s://..., local[N]); default "
        "[spark] master. Not local: exactly is shipped to the executors (docs/cluster.md).",
        show_default=False,
    ),
]
