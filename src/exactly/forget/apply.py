"""Applying a regulation, store by store, in the order docs/forget.md gives.

1. read the person's events in the log (:func:`~exactly.forget.found.gather`);
2. ``files``: the logs under the data dir;
3. ``jobdb``: their jobs expired and emptied (while no director runs: every partition held);
4. ``archive``: the archive's files rewritten without their jobs;
5. ``lake``: every lake table's rows and old versions (while no lake query runs: its
   checkpoint's lock held);
6. ``log``: their records replaced by stubs (:mod:`.stub`), in place.

Each store, once clear, is marked done in the regulations topic; a store a running part owns is
left pending for that part, and said so. Every step is idempotent, so a forget killed anywhere
is finished by running it again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.errors import DirectorLockHeld, LogError, StreamError
from exactly.forget.found import Found, Person, event_topics, gather, whose
from exactly.forget.lake import forget_lake
from exactly.forget.regulations import Forgotten, Regulation, Regulations
from exactly.forget.stub import stub

if TYPE_CHECKING:
    from exactly.config import Settings
    from exactly.delivery.archive import Archive
    from exactly.log import Log, LogRecord

Say = Callable[[str], None]
Reports = dict[str, dict[str, int]]  # per store done, what it removed
SUPPRESSORS_SECONDS = 2.0  # suppressors read new regulations within a second: wait twice that


def stores_of(settings: Settings) -> list[str]:
    """The stores a regulation recorded now must clear."""
    from exactly.stages import LAKE

    stores = ["files", "log"]
    if settings.destinations:
        stores += ["jobdb", "archive"]
    if LAKE.enabled(settings) or settings.default_lake.exists():
        stores.append("lake")
    return stores


class Held(Exception):
    """A running part owns the store: it is left pending for that part."""


@dataclass
class Applying:
    """One regulation applied by this process."""

    settings: Settings
    log: Log
    regulations: Regulations
    say: Say
    settle_seconds: float = SUPPRESSORS_SECONDS  # a regulation's age before the log is read

    def run(
        self, regulation: Regulation, key: bytes, person: Person | None, *, again: bool = False
    ) -> list[str]:
        """Apply ``regulation``'s pending stores in order (``again``: every store, done or not);
        the stores left to running parts."""
        forgotten = Forgotten(key, regulation.hashes)
        waited = time.time() - regulation.at
        if waited < self.settle_seconds:  # so no suppressor still lets the person through
            time.sleep(self.settle_seconds - waited)
        started = time.monotonic()
        found = gather(self.log, event_topics(self.log), forgotten, person)
        self.say(
            f"forget: {found.records:,} events of theirs found in the log "
            f"({time.monotonic() - started:.1f} s)"
        )
        left = []
        for stores, step in (
            (("files",), self._files),
            (("jobdb", "archive"), self._deliveries),
            (("lake",), self._lake),
            (("log",), self._log),
        ):
            todo = [store for store in stores if store in regulation.stores]
            if not todo or (not again and all(store in regulation.done for store in todo)):
                continue
            started = time.monotonic()
            try:
                reports = step(forgotten, found, person)
            except Held as held:
                self.say(f"forget: {', '.join(todo)}: {held}")
                left += todo
                continue
            for store in todo:
                self.regulations.mark_done(regulation, store, reports[store])
                said = ", ".join(f"{value:,} {name}" for name, value in reports[store].items())
                took = time.monotonic() - started
                self.say(f"forget: {store}: done, {said} ({took:.1f} s)")
        return left

    def _files(self, forgotten: Forgotten, found: Found, person: Person | None) -> Reports:
        from exactly.forget.files import scrub

        texts = set(found.traces)
        if person is not None:
            texts.update(value for values in person.ids.values() for value in values)
        files, places = scrub(self.settings.data_dir.resolve(), texts)
        return {"files": {"files changed": files, "places overwritten": places}}

    def _deliveries(self, forgotten: Forgotten, found: Found, person: Person | None) -> Reports:
        """The JobDB and the archive together, every partition held: a director that starts
        meanwhile waits, and none archives a dataset between the two."""
        from exactly.delivery.archive import open_archive
        from exactly.delivery.jobdb import opened_jobdb

        settings = self.settings
        self._unless_up("its director applies it between its sends")

        def matches(message_id: str, user_id: str | None, payload: bytes) -> bool:
            return (
                message_id in found.message_ids
                or (user_id is not None and forgotten.ids(user_id, user_id))
                or forgotten.value(payload)
            )

        with opened_jobdb(settings.jobdb_url) as jobdb:
            try:
                with jobdb.all_partitions(settings.delivery.partitions, wait=False):
                    expired, emptied = jobdb.forget_jobs(matches)
                    archived = rewrite_archive(open_archive(settings.archive_url), forgotten, found)
            except DirectorLockHeld:
                raise Held("a director is running: it applies it between its sends") from None
        return {
            "jobdb": {"queued jobs expired": expired, "jobs emptied": emptied},
            "archive": archived,
        }

    def _lake(self, forgotten: Forgotten, found: Found, person: Person | None) -> Reports:
        from exactly.lake import open_table
        from exactly.spark.streaming import checkpoint_lock
        from exactly.stages import LAKE

        if LAKE.enabled(self.settings):
            self._unless_up("its lake query applies it between micro-batches")

        with (
            _lake_lock(checkpoint_lock, LAKE.checkpoint(self.settings)),
            open_table(self.settings.lake_url) as table,
        ):
            return {"lake": forget_lake(table, forgotten, found.message_ids)}

    def _unless_up(self, then: str) -> None:
        """Leave a part's store to ``exactly up``'s part while ``up`` runs: a part restarting
        after a crash must find its lock free."""
        from exactly.up.supervisor import running

        if running(self.settings.data_dir.resolve() / "up"):
            raise Held(f"exactly up is running: {then}")

    def _log(self, forgotten: Forgotten, found: Found, person: Person | None) -> Reports:
        def change(record: LogRecord) -> bytes | None:
            event = whose(forgotten, record)
            return None if event is None else stub(event)

        changed = 0
        topics = event_topics(self.log)
        try:
            for topic in topics:
                hint = None if person is None else person.hint
                changed += self.log.rewrite(topic, change, hint)
        except LogError as error:
            if "cannot rewrite" not in str(error):
                raise
            return {"log": {"records kept by the broker until retention": found.records}}
        return {"log": {"records replaced by stubs": changed, "topics": len(topics)}}


def rewrite_archive(archive: Archive, forgotten: Forgotten, found: Found) -> dict[str, int]:
    """Each archive file holding a forgotten person's jobs, written again without them."""
    files = removed = 0
    for name in archive.names():
        records = list(archive.records(name))
        kept = [record for record in records if not _archived(record, forgotten, found)]
        if len(kept) < len(records):
            archive.write(name, kept)
            files += 1
            removed += len(records) - len(kept)
    return {"files rewritten": files, "jobs removed": removed}


@contextlib.contextmanager
def _lake_lock(lock: Callable[[Path, str], Any], checkpoint: Path) -> Iterator[None]:
    try:
        with lock(checkpoint, "lake query"):
            yield
    except StreamError as held:
        if "another lake query is running" not in str(held):
            raise
        raise Held("the lake query is running: it applies it between micro-batches") from None


def _archived(record: Mapping[str, Any], forgotten: Forgotten, found: Found) -> bool:
    """Whether an archived job is a forgotten person's."""
    if record.get("message_id") in found.message_ids:
        return True
    user_id = record.get("user_id")
    if isinstance(user_id, str) and forgotten.ids(user_id, user_id):
        return True
    payload = record.get("payload")
    return isinstance(payload, str) and forgotten.value(payload.encode())
