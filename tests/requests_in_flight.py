"""Where a director crash test's kill landed: with requests in flight, or none.

A request is in flight at a kill when the receiver had received it before the kill and the
director had not recorded its outcome: read once the director is dead, its job (or batch) is
still ``executing`` in the JobDB. Only requests received since the killed run started count, so
a job an earlier kill left ``executing`` says nothing of where this one landed.

The director records ``executing`` before it sends and the outcome after (DESIGN.md, boundary
7), so the only requests a receiver may answer twice are those out at a kill: a key (a
destination and a message id, or a batch's id) may succeed once more for each kill it was
``executing`` at, never for a kill that left it alone (:meth:`RequestKills.check_duplicates`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exactly.delivery import packs
from exactly.delivery.jobdb import JobDB
from exactly.delivery.jobdb.base import EXECUTING
from tests.batches_in_flight import INSIDE_SHARE
from tests.receiver import Receiver

Key = tuple[str, str]  # (destination, webhook-id): a message id, or a batch's id

# The request timeout of the crash tests' destinations. A timed-out request is a duplicate
# window of its own (its answer is never read, so it is sent again), and the receivers, threads
# of the test process, count a 2xx as their handler returns, before the answer's bytes are
# written: on a loaded CI machine a 1 s timeout expired so, and the check below, which allows
# copies only for kills, failed. No request of these tests is meant to time out.
TIMEOUT = "10s"


def executing(db: JobDB) -> set[Key]:
    """The (destination, message id) of every job whose last recorded state is ``executing``."""
    found: set[Key] = set()
    for bucket in db.buckets():
        after = 0
        while jobs := db.pending(bucket, after=after):
            found.update(
                (job.destination, job.message_id) for job in jobs if job.state == EXECUTING
            )
            after = jobs[-1].id
    return found


def executing_batches(db: JobDB) -> dict[Key, list[str]]:
    """The batches ``executing`` now, by (destination, batch id), with their members' message
    ids: those the director formed, and packs (a pack's id is its key)."""
    found: dict[Key, list[str]] = {}
    for bucket in db.buckets():
        for batch in db.open_batches(bucket):
            if batch.state == EXECUTING:
                members = [job.message_id for job in batch.jobs]
                found[batch.batch.destination, batch.batch.id] = members
        for job in db.pending(bucket):  # packs, the batches the route query made
            if job.packed and job.state == EXECUTING:
                found[job.destination, job.message_id] = packs.message_ids(job.payload)
    return found


def received(receivers: Mapping[str, Receiver], since: float, until: float) -> set[Key]:
    """The (destination, webhook-id) of the requests each destination's receiver got between
    ``since`` and ``until`` (``time.monotonic()``)."""
    return {
        (destination, request.headers["webhook-id"])
        for destination, receiver in receivers.items()
        for request in list(receiver.requests)
        if since <= request.at <= until
    }


@dataclass
class RequestKills:
    """A test's director kills: the requests each found in flight and what each left
    ``executing``, for the printed share, its assertion and the per-key duplicate bound."""

    name: str
    in_flight: list[frozenset[Key]] = field(default_factory=list)  # per kill
    left_executing: Counter[Key] = field(default_factory=Counter)  # kills each key was out at

    def add(self, received: Iterable[Key], executing: Iterable[Key]) -> frozenset[Key]:
        """One kill: the requests received since its run started, and the keys the JobDB shows
        ``executing`` now that the director is dead. Returns those in flight at the kill."""
        out = set(executing)
        self.left_executing.update(out)
        found = frozenset(out.intersection(received))
        self.in_flight.append(found)
        return found

    @property
    def kills(self) -> int:
        return len(self.in_flight)

    @property
    def inside(self) -> int:
        return sum(bool(found) for found in self.in_flight)

    @property
    def share(self) -> float:
        return self.inside / self.kills if self.kills else 0.0

    def __str__(self) -> str:
        requests = sum(len(found) for found in self.in_flight)
        return (
            f"{self.name}: {self.inside} of {self.kills} kills with requests in flight "
            f"({self.share:.0%}, {requests} requests in all)"
        )

    def check(self, least: float = INSIDE_SHARE) -> None:
        """Print the share, and fail below ``least``."""
        print(self, flush=True)
        assert self.kills, f"{self.name}: no kill recorded"
        assert self.share >= least, f"{self} is below {least:.0%}"

    def check_duplicates(self, successes: Mapping[str, Counter[str]]) -> int:
        """Each key's 2xx answers beyond the first within the kills it was ``executing`` at
        (``successes``: per destination, the 2xx answers per webhook-id). Returns the total."""
        over = {
            (destination, key): count - 1
            for destination, counted in successes.items()
            for key, count in counted.items()
            if count - 1 > self.left_executing[destination, key]
        }
        assert not over, (
            f"{self.name}: answered 2xx again with no request out at a kill "
            f"(extra copies, kills it was executing at): "
            + ", ".join(
                f"{key}: {extra}, {self.left_executing[key]}"
                for key, extra in list(over.items())[:5]
            )
        )
        return sum(count - 1 for counted in successes.values() for count in counted.values())
