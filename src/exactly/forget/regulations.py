"""Regulations: who is forgotten, as keyed hashes, and how far each store has got.

A regulation is recorded as one record of the log topic ``exactly.regulations`` (one partition):
the keyed hashes of the ids it forgets, never the ids, and the stores it must clear. Each store
that finishes appends a ``done`` record. The topic is the one place every part can read,
wherever it runs: the collector, the dedupe tasks on the executors, the lake query, the
director and the command itself. The key is ``DATA_DIR/forget/key`` (made on first use, mode
0600), shipped to the executors in the dedupe task's plan.

:class:`Regulations` folds the topic; :class:`Forgotten` is what a suppressor checks an event
against.
"""

from __future__ import annotations

import hmac
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from exactly.errors import ConfigError, UnknownTopic

if TYPE_CHECKING:
    from exactly.log import Log

TOPIC = "exactly.regulations"
KEY_BYTES = 32
USER, ANONYMOUS = "user", "anonymous"  # what an id names: an event's userId or anonymousId
PENDING, DONE = "pending", "done"
REFRESH_SECONDS = 1.0  # a suppressor reads new regulations at most this long after they land
SEEN_IDS = 100_000  # ids whose answer a Forgotten remembers (each its hash computed once)


def key_path(data_dir: Path) -> Path:
    return data_dir.resolve() / "forget" / "key"


def load_key(data_dir: Path) -> bytes:
    """The data dir's forget key, made (32 random bytes, mode 0600) if there is none yet."""
    return read_key(key_path(data_dir))


def read_key(path: Path) -> bytes:
    """The forget key at ``path``, made (32 random bytes, mode 0600) if there is none yet."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".key.{os.getpid()}")
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(os.urandom(KEY_BYTES))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(staged, path)  # the first process to make one wins; the others read it
        except FileExistsError:
            pass
        finally:
            staged.unlink()
        key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{path} is not a forget key ({len(key)} bytes, not {KEY_BYTES})")
    return key


def digest(key: bytes, kind: str, value: str) -> str:
    """The keyed hash of one id of ``kind`` (hex)."""
    return hmac.digest(key, f"{kind}:{value}".encode(), "sha256").hex()


@dataclass(frozen=True)
class Regulation:
    """One forget: when, the hashes it forgets, the stores it must clear and those done."""

    id: str
    at: float
    hashes: Mapping[str, frozenset[str]]  # kind -> hex digests
    stores: tuple[str, ...]
    done: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # store -> its report

    def state(self, store: str) -> str:
        return DONE if store in self.done else PENDING

    @property
    def finished(self) -> bool:
        return all(store in self.done for store in self.stores)


@dataclass(frozen=True)
class Forgotten:
    """The hashes every regulation forgets, with the key to hash an event's ids."""

    key: bytes
    hashes: Mapping[str, frozenset[str]]
    _seen: dict[tuple[str, str], bool] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __bool__(self) -> bool:
        return any(self.hashes.values())

    def holds(self, kind: str, value: str) -> bool:
        """Whether ``value``, an id of ``kind``, is a forgotten person's."""
        found = self.hashes.get(kind)
        return bool(found) and digest(self.key, kind, value) in found  # type: ignore[operator]

    def ids(self, user_id: object, anonymous_id: object) -> bool:
        """Whether an event with these ``userId`` and ``anonymousId`` is a forgotten person's."""
        return self._holds(USER, user_id) or self._holds(ANONYMOUS, anonymous_id)

    def _holds(self, kind: str, value: object) -> bool:
        """:meth:`holds` for any value, each id hashed once per :class:`Forgotten`: a person
        sends many events, and the hash costs more than the rest of the check."""
        if not isinstance(value, str) or not value or not self.hashes.get(kind):
            return False
        seen = self._seen
        found = seen.get((kind, value))
        if found is None:
            found = digest(self.key, kind, value) in self.hashes[kind]
            if len(seen) >= SEEN_IDS:
                seen.clear()
            seen[(kind, value)] = found
        return found

    def event(self, event: Mapping[str, Any]) -> bool:
        return self.ids(event.get("userId"), event.get("anonymousId"))

    def value(self, value: bytes | None) -> bool:
        """Whether a stored event (JSON) is a forgotten person's; not JSON: no."""
        if not self or not value:
            return False
        try:
            event = orjson.loads(value)
        except orjson.JSONDecodeError:
            return False
        return isinstance(event, dict) and self.event(event)


class Regulations:
    """The regulations topic, folded: read again from where it was on :meth:`refresh`."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self._next = 0
        self._found: dict[str, Regulation] = {}
        self._done: dict[str, dict[str, Mapping[str, Any]]] = {}
        self._read_at = 0.0
        self._lock = threading.Lock()
        self._suppressing: Forgotten | None = None  # kept until a record is folded

    def refresh(self, *, at_most_every: float = 0.0, settle: bool = False) -> None:
        """Read the records appended since the last read (not before ``at_most_every`` s).

        ``settle``: first make readable what a killed writer stored without acknowledging it
        (:meth:`Log.settle`), for a command that decides from this read whether to record a
        regulation: run again after a kill, it goes on with the one its killed try recorded.
        """
        with self._lock:
            now = time.monotonic()
            if at_most_every and now - self._read_at < at_most_every:
                return
            self._read_at = now
            try:
                if settle:
                    self.log.settle(TOPIC)
                end = self.log.end_offsets(TOPIC)[0]
            except UnknownTopic:  # nothing was ever forgotten here
                return
            if end <= self._next:
                return
            for batch in self.log.read_range(TOPIC, 0, self._next, end, headers=False):
                for record in batch:
                    self._fold(orjson.loads(record.value))
            self._next = end

    def _fold(self, found: dict[str, Any]) -> None:
        self._suppressing = None
        if found.get("kind") == "regulation":
            hashes = {kind: frozenset(found["hashes"].get(kind, ())) for kind in (USER, ANONYMOUS)}
            self._found[found["id"]] = Regulation(
                found["id"], found["at"], hashes, tuple(found["stores"])
            )
        elif found.get("kind") == DONE:
            self._done.setdefault(found["id"], {})[found["store"]] = found.get("report", {})

    def all(self) -> list[Regulation]:
        """Every regulation, oldest first, with the stores done so far."""
        with self._lock:
            return [
                Regulation(r.id, r.at, r.hashes, r.stores, dict(self._done.get(r.id, {})))
                for r in sorted(self._found.values(), key=lambda r: (r.at, r.id))
            ]

    def pending(self, store: str) -> list[Regulation]:
        """The regulations that name ``store`` and whose ``store`` is not done."""
        return [r for r in self.all() if store in r.stores and store not in r.done]

    def forgotten(self, key: bytes) -> Forgotten:
        """Every regulation's hashes (kept until a new record is read)."""
        with self._lock:
            kept = self._suppressing
            if kept is not None and kept.key == key:
                return kept
            hashes: dict[str, set[str]] = {USER: set(), ANONYMOUS: set()}
            for regulation in self._found.values():
                for kind, found in regulation.hashes.items():
                    hashes[kind] |= found
            made = Forgotten(key, {kind: frozenset(found) for kind, found in hashes.items()})
            self._suppressing = made
            return made

    def record(
        self, key: bytes, ids: Mapping[str, Sequence[str]], stores: Iterable[str]
    ) -> Regulation:
        """Append a new regulation (durable on return) and fold it."""
        hashes = {kind: sorted({digest(key, kind, value) for value in ids.get(kind, ())})
                  for kind in (USER, ANONYMOUS)}  # fmt: skip
        document = {
            "kind": "regulation",
            "id": uuid.uuid4().hex,
            "at": time.time(),
            "hashes": hashes,
            "stores": sorted(set(stores)),
        }
        self._append(document)
        self.refresh()
        return next(r for r in self.all() if r.id == document["id"])

    def mark_done(self, regulation: Regulation, store: str, report: Mapping[str, Any]) -> None:
        """Say ``store`` holds nothing of ``regulation``'s people (durable on return)."""
        self._append({"kind": DONE, "id": regulation.id, "store": store, "report": dict(report)})
        self.refresh()

    def _append(self, document: dict[str, Any]) -> None:
        from exactly.log import Record

        self.log.create_topic(TOPIC, 1, exist_ok=True)
        self.log.append(TOPIC, 0, [Record(orjson.dumps(document))])


_shared: dict[tuple[str, int], Regulations] = {}
_shared_lock = threading.Lock()


def suppressing(log: Log, log_url: str, key: bytes) -> Forgotten:
    """What a suppressor in this process checks events against now: the regulations of the log
    at ``log_url``, read again at most every :data:`REFRESH_SECONDS`."""
    with _shared_lock:
        regulations = _shared.get((log_url, os.getpid()))
        if regulations is None:
            regulations = _shared[(log_url, os.getpid())] = Regulations(log)
    regulations.refresh(at_most_every=REFRESH_SECONDS)
    return regulations.forgotten(key)
