"""``exactly forget``: erase people from every store, and suppress what they send later."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from exactly.cli.context import with_flags
from exactly.errors import ConfigError
from exactly.text import message

if TYPE_CHECKING:
    from exactly.forget.regulations import Regulations

FOLLOW_SECONDS = 1.0


def forget(
    ctx: typer.Context,
    user_ids: Annotated[
        list[str] | None, typer.Argument(metavar="[USER_ID]...", help="userIds to forget.")
    ] = None,
    anonymous_id: Annotated[
        list[str] | None,
        typer.Option("--anonymous-id", metavar="ID", help="An anonymousId to forget (repeat it)."),
    ] = None,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="Record the regulation and return; the parts apply it."),
    ] = False,
    status: Annotated[
        bool, typer.Option("--status", help="List each regulation and each store's state.")
    ] = False,
) -> None:
    """Forget people: their events, rows, jobs and archived jobs are removed from every store
    of the data dir, and what they send later is dropped before `events`.

    The regulation keeps a keyed hash of each id, never the id (the key is
    DATA_DIR/forget/key). One progress line per store; it returns once every store holds
    nothing of them. Aggregates keep their counts (they hold no person). A Kafka topic keeps
    the records until its retention removes them; every reader skips them meanwhile
    (docs/forget.md).
    """
    from exactly.forget.apply import Applying, stores_of
    from exactly.forget.found import Person
    from exactly.forget.regulations import ANONYMOUS, USER, Regulations, digest, load_key
    from exactly.log import open_log

    settings = with_flags(ctx, {}).settings
    ids = {
        USER: tuple(dict.fromkeys(user_ids or ())),
        ANONYMOUS: tuple(dict.fromkeys(anonymous_id or ())),
    }
    if status:
        if any(ids.values()):
            raise ConfigError("--status lists the regulations: give it no id")
        with open_log(settings.log_url) as log:
            regulations = Regulations(log)
            regulations.refresh()
            for line in _status(regulations):
                print(line)
        return
    if not any(ids.values()):
        raise ConfigError("name someone to forget: USER_ID... or --anonymous-id ID (or --status)")
    if any(not value.strip() for values in ids.values() for value in values):
        raise ConfigError("an id to forget is empty")
    key = load_key(settings.data_dir)

    def say(line: str) -> None:
        print(message(line), file=sys.stderr, flush=True)

    with open_log(settings.log_url) as log:
        regulations = Regulations(log)
        regulations.refresh(settle=True)  # with what a killed try of this command recorded
        hashes = {kind: frozenset(digest(key, kind, value) for value in found)
                  for kind, found in ids.items()}  # fmt: skip
        same = [r for r in regulations.all() if dict(r.hashes) == hashes]
        again = False
        if same and not same[-1].finished:
            regulation = same[-1]
            say(f"forget: regulation {regulation.id[:8]} for these ids is under way: going on")
        elif same:
            regulation, again = same[-1], True
            say(
                f"forget: regulation {regulation.id[:8]} forgot these ids already: every "
                "store is cleared again"
            )
        else:
            regulation = regulations.record(key, ids, stores_of(settings))
            count = sum(len(found) for found in ids.values())
            say(
                f"forget: regulation {regulation.id[:8]} recorded for {count} "
                f"id{'s' if count > 1 else ''} (keyed hashes only); their events are "
                "suppressed from now on"
            )
        if no_wait:
            say(
                "forget: the running parts apply it, or `exactly forget` again; "
                "`exactly forget --status` shows each store"
            )
            return
        applying = Applying(settings, log, regulations, say)
        left = applying.run(regulation, key, Person(ids), again=again)
        told = time.monotonic()
        while left:
            time.sleep(FOLLOW_SECONDS)
            regulations.refresh()
            current = next(r for r in regulations.all() if r.id == regulation.id)
            now = [store for store in left if store not in current.done]
            for store in set(left) - set(now):
                say(f"forget: {store}: done by its running part")
            left = now
            if left and time.monotonic() - told > 30:
                say(f"forget: still waiting for {', '.join(left)}")
                told = time.monotonic()
    print(f"forgotten: regulation {regulation.id[:8]}, every store done")


def _status(regulations: Regulations) -> list[str]:
    found = regulations.all()
    if not found:
        return ["no regulation: nobody was forgotten here"]
    lines = []
    for regulation in found:
        when = datetime.fromtimestamp(regulation.at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        count = sum(len(hashes) for hashes in regulation.hashes.values())
        state = "done" if regulation.finished else "under way"
        lines.append(f"regulation {regulation.id[:8]}  {when}  {count} ids  {state}")
        for store in regulation.stores:
            report = regulation.done.get(store)
            if report is None:
                lines.append(f"  {store:<8} pending")
            else:
                said = ", ".join(f"{value:,} {name}" for name, value in report.items())
                lines.append(message(f"  {store:<8} done: {said}", indent="    "))
    return lines
