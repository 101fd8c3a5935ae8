"""Routing and delivery killed together: ``exactly route`` and ``exactly deliver`` SIGKILLed 20
times each at random points, at the same time, while events keep arriving and receivers flap.

The route runs are real Spark job processes (``tests/route_job_child.py``, the shared harness of
``tests/job_child.py``); four more runs kill themselves right after a JobDB commit and before
Spark's, so the next run replays a batch the JobDB already holds. Meanwhile a thread starts
``exactly deliver`` and SIGKILLs it once it is sending (0 to 0.3 s after the receivers got a
request of its own), twenty times, while two of the three receivers flip between 503 and 200.
Two destinations choose and shape: ``filtered`` has a Spark SQL ``filter``, ``shaped`` a
Python ``transform`` beside the config (it drops some events and fails on others); ``batched``
takes batches of 7, which the route query makes as packs (each event in one pack, each pack's
key always the same members and body, whatever the replays); and some
events carry a Segment ``integrations`` object that leaves destinations out. Afterwards one route
run catches up and one director drains:

* the JobDB holds exactly one job per (event, destination that takes it), all succeeded but the
  events the transform failed on (``failed``, never sent); the counts of events filtered,
  skipped and dropped are each counted once, whatever the replays;
* every receiver got 2xx for exactly the events its destination takes, ``shaped`` the body the
  transform makes of each;
* a message succeeds twice at a destination only if it was ``executing`` there at a director's
  kill, once more per such kill (``tests/requests_in_flight.py``), and at most kills x requests
  it may have out in all;
* each route kill is recorded as inside a micro-batch or between two, each director kill with
  the requests in flight at it, and at least three quarters of each land inside;
* every copy of a message carries the same Idempotency-Key, webhook-id and body, and every
  signature verifies with the ``standardwebhooks`` package.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from standardwebhooks.webhooks import Webhook

from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import FAILED, SUCCEEDED, RouteCounts
from exactly.log import Log, open_log
from tests.aggregate_stream import EventStream, append
from tests.batches_in_flight import Checkpoints
from tests.job_child import kill_at_random_points
from tests.receiver import Receiver
from tests.requests_in_flight import TIMEOUT, RequestKills, executing, received
from tests.route_job_child import KILL_AFTER_COMMIT
from tests.seeds import crash_seed

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KILLS = 20
SELF_KILLS = 4
MAX_IN_FLIGHT = 4
PARTITIONS = 2
LISTS = {  # destination: (sources, events), as in the config below
    "all": (None, None),
    "orders": (None, ["Order Completed"]),
    "ios": (["ios"], None),
}
FILTERS = {**LISTS, "filtered": (None, None), "shaped": (None, None), "batched": (None, None)}
CHOOSING = {  # the two that choose and shape, and the one that batches, as in the config below
    "batched": "[destinations.batch]\nmax_events = 7\n",  # packs, made by the route query
    "filtered": "filter = \"properties.plan = 'pro' or properties.revenue > 100\"\n",
    "shaped": 'filter = "type = \'track\'"\ntransform = "shapes:to_crm"\n',
}
SHAPES = """
def to_crm(event):
    properties = event.get("properties") or {}
    if properties.get("plan") == "free":
        return None
    if event["messageId"].endswith(("7", "b")):
        raise ValueError("no crm id for " + event["messageId"])
    return {"messageId": event["messageId"], "plan": properties.get("plan"), "kind": event["type"]}
"""
INTEGRATIONS = ({"All": False, "filtered": True}, {"shaped": False}, {"orders": False})


def config(path: Path, urls: dict[str, str]) -> Path:
    text = f'data_dir = "{path.parent / "data"}"\n[log]\nurl = "sqlite://{path.parent / "log"}"\n'
    for name, (sources, events) in FILTERS.items():
        text += (
            f'[[destinations]]\nname = "{name}"\nurl = "{urls[name]}"\nsecret = "{SECRET}"\n'
            f'timeout = "{TIMEOUT}"\nmax_in_flight = {MAX_IN_FLIGHT}\n'
            + (f"sources = {json.dumps(sources)}\n" if sources else "")
            + (f"events = {json.dumps(events)}\n" if events else "")
            + CHOOSING.get(name, "")
            + '[destinations.backoff]\nmin = "50ms"\nmax = "300ms"\n'
        )
    path.write_text(text)
    (path.parent / "shapes.py").write_text(SHAPES)
    return path


def expected(values: list[bytes]) -> dict[str, set[str]]:
    """Per destination of :data:`LISTS`, the message ids its lists take (plain Python, not the
    route code; the pipeline crash test's destinations)."""
    out: dict[str, set[str]] = {name: set() for name in LISTS}
    for value in values:
        event = json.loads(value)
        for name, (sources, events) in LISTS.items():
            if (sources is None or event["sourceId"] in sources) and (
                events is None or event.get("event") in events
            ):
                out[name].add(event["messageId"])
    return out


def with_integrations(records: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Every fifth event with an integrations object that leaves some destinations out."""
    out = []
    for message_id, value in records:
        number = int(message_id.encode().hex(), 16)
        if number % 5 == 0:
            event = json.loads(value)
            event["integrations"] = INTEGRATIONS[number // 5 % len(INTEGRATIONS)]
            value = json.dumps(event).encode()
        out.append((message_id, value))
    return out


def takes(integrations: dict[str, Any] | None, name: str) -> bool:
    """Segment's rule, written again (a key false, or no key and All false, leaves it out)."""
    if integrations is None:
        return True
    if integrations.get(name) is not None:
        return integrations[name] is not False
    return integrations.get("All") is not False


def chooses(name: str, event: dict[str, Any]) -> bool:
    sources, events = FILTERS[name]
    if sources is not None and event["sourceId"] not in sources:
        return False
    if events is not None and event.get("event") not in events:
        return False
    if name == "filtered":
        revenue = event["properties"].get("revenue")
        if isinstance(revenue, str):
            try:
                revenue = float(revenue)
            except ValueError:
                revenue = None
        number = isinstance(revenue, int | float) and not isinstance(revenue, bool)
        return event["properties"]["plan"] == "pro" or (number and revenue > 100)
    return name != "shaped" or event["type"] == "track"


class Truth:
    """What each destination must get, worked out in plain Python (not the route's code)."""

    def __init__(self, values: list[bytes]) -> None:
        namespace: dict[str, Any] = {}
        exec(SHAPES, namespace)  # the test's own transform, as the route imports it
        to_crm = namespace["to_crm"]
        self.ids: dict[str, set[str]] = {name: set() for name in FILTERS}
        self.failed: set[str] = set()
        self.bodies: dict[str, bytes] = {}
        self.counts: dict[str, RouteCounts] = {}
        for name in FILTERS:
            filtered = skipped = dropped = 0
            for value in values:
                event = json.loads(value)
                message_id = event["messageId"]
                if not chooses(name, event):
                    filtered += 1
                elif not takes(event.get("integrations"), name):
                    skipped += 1
                elif name != "shaped":
                    self.ids[name].add(message_id)
                else:
                    try:
                        body = to_crm(event)
                    except ValueError:
                        self.failed.add(message_id)
                        continue
                    if body is None:
                        dropped += 1
                    else:
                        self.ids[name].add(message_id)
                        self.bodies[message_id] = orjson.dumps(body)
            if filtered or skipped or dropped:
                self.counts[name] = RouteCounts(filtered, skipped, dropped)

    def states(self) -> dict[str, dict[str, int]]:
        found = {name: {SUCCEEDED: len(ids)} for name, ids in self.ids.items() if ids}
        found["shaped"][FAILED] = len(self.failed)
        return found


class Verifier:
    """Checks each request a receiver got within seconds of its arrival, as the receiver would
    (``standardwebhooks`` refuses a timestamp older than 5 minutes, and the test runs longer)."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.webhook = Webhook(SECRET)
        self.bodies: dict[str, bytes] = {}
        self.checked = 0
        self.failures: list[str] = []

    def check(self) -> None:
        for request in self.receiver.requests[self.checked :]:
            key = request.headers["webhook-id"]
            try:
                assert request.headers["Idempotency-Key"] == key
                assert self.bodies.setdefault(key, request.body) == request.body
                self.verify(key, request.body, request.headers)
            except Exception as error:  # noqa: BLE001 (reported at the end)
                self.failures.append(f"{key}: {error!r}")
            self.checked += 1

    def verify(self, key: str, body: bytes, headers: dict[str, str]) -> None:
        """One request's signature, and its body's event under its key."""
        assert self.webhook.verify(body, headers)["messageId"] == key

    def duplicates(self, ids: set[str]) -> int:
        """After the run: every 2xx id expected, and the duplicate 2xx answered."""
        self.check()
        assert not self.failures, self.failures[:5]
        assert self.checked == len(self.receiver.requests)
        successes = self.receiver.successes()
        assert set(successes) == ids
        return sum(n - 1 for n in successes.values())


class BatchVerifier(Verifier):
    """The same for a batching destination: a request is a pack (the route query's batch), its
    id the pack's key, which always carries the same members and body; each event is in one
    pack, whatever the route's replays."""

    def __init__(self, receiver: Receiver) -> None:
        super().__init__(receiver)
        self.members: dict[str, list[str]] = {}

    def verify(self, key: str, body: bytes, headers: dict[str, str]) -> None:
        assert key.startswith("pack_")
        assert self.webhook.verify(body, headers) is not None
        self.members[key] = [event["messageId"] for event in json.loads(body)]

    def duplicates(self, ids: set[str]) -> int:
        self.check()
        assert not self.failures, self.failures[:5]
        assert self.checked == len(self.receiver.requests)
        successes = self.receiver.successes()
        assert set(successes) == set(self.members)
        every = Counter(message for members in self.members.values() for message in members)
        assert set(every) == ids and set(every.values()) == {1}  # each event in one pack
        return sum(n - 1 for n in successes.values())


class Directors:
    """``exactly deliver`` started and SIGKILLed ``KILLS`` times in a thread, each run once the
    receivers got a request of its own and a moment later (0 to 0.3 s): most kills find
    requests in flight, which :attr:`requests` records per kill."""

    def __init__(
        self, config_path: Path, jobdb: str, rng: random.Random, receivers: dict[str, Receiver]
    ) -> None:
        self.command = [
            sys.executable, "-m", "exactly", "--config", str(config_path), "deliver",
            "--jobdb", jobdb,
        ]  # fmt: skip
        self.jobdb = jobdb
        self.rng = rng
        self.receivers = receivers
        self.requests = RequestKills("deliver beside route")
        self.failure: str | None = None
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def kills(self) -> int:
        return self.requests.kills

    def _received(self) -> int:
        return sum(len(receiver.requests) for receiver in self.receivers.values())

    def _loop(self) -> None:
        while self.kills < KILLS:
            seen = self._received()
            began = time.monotonic()
            process = subprocess.Popen(
                self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            deadline = time.monotonic() + 120  # the route may not have written jobs yet
            while self._received() == seen and process.poll() is None:
                if time.monotonic() > deadline:
                    self.failure = "no request from a director in 120 s"
                    return
                time.sleep(0.01)
            time.sleep(self.rng.uniform(0.0, 0.3))
            if process.poll() is not None:
                self.failure = f"deliver exited early: {process.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
                return
            killed_at = time.monotonic()
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            with open_jobdb(self.jobdb) as db:
                out = executing(db)
            found = self.requests.add(received(self.receivers, began, killed_at), out)
            print(f"deliver kill {self.kills}: {len(found)} requests in flight", flush=True)


@pytest.mark.timeout(1200)
def test_route_and_deliver_killed_20_times_each_deliver_every_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = crash_seed("13")
    rng, director_rng = random.Random(f"route-{seed}"), random.Random(f"deliver-{seed}")
    monkeypatch.delenv(KILL_AFTER_COMMIT, raising=False)  # only the runs told to kill themselves
    stream = EventStream(seed=21, duplicate_rate=0.0)
    values: list[bytes] = []
    log_url = f"sqlite://{tmp_path / 'log'}"
    jobdb = f"sqlite://{tmp_path / 'jobdb'}"
    starts = 0

    def self_kill(_: random.Random) -> dict[str, str]:
        """Runs 3, 8, 13 and 18 kill themselves between the JobDB's and Spark's commits."""
        nonlocal starts
        starts += 1
        return {KILL_AFTER_COMMIT: str(starts % 3 + 1)} if starts in (3, 8, 13, 18) else {}

    def grow(log: Log) -> None:
        records = with_integrations(list(stream.chunk(4)))
        values.extend(value for _, value in records)
        append(log, "events", PARTITIONS, records)

    with (
        Receiver(delay=0.02) as steady,
        Receiver(delay=0.02) as orders,
        Receiver(delay=0.02) as ios,
        Receiver(delay=0.02) as filtered,
        Receiver(delay=0.02) as shaped,
        Receiver(delay=0.02) as batched,
    ):
        receivers = {
            "all": steady,
            "orders": orders,
            "ios": ios,
            "filtered": filtered,
            "shaped": shaped,
            "batched": batched,
        }
        urls = {
            "all": steady.url + "/ok",
            "orders": orders.url + "/flap",
            "ios": ios.url + "/flap",
            "filtered": filtered.url + "/ok",
            "shaped": shaped.url + "/flap",
            "batched": batched.url + "/flap",
        }
        config_path = config(tmp_path / "exactly.toml", urls)
        with open_log(log_url) as log:
            log.create_topic("events", PARTITIONS)
            grow(log)
        directors = Directors(config_path, jobdb, director_rng, receivers)
        flapping = threading.Event()
        flapping.set()

        def flap() -> None:
            while flapping.is_set():
                time.sleep(director_rng.uniform(0.1, 0.5))
                orders.down = batched.down = not orders.down
                ios.down = shaped.down = not orders.down

        verifiers = {
            name: (BatchVerifier if name == "batched" else Verifier)(receiver)
            for name, receiver in receivers.items()
        }

        def verify() -> None:
            while flapping.is_set():
                time.sleep(2)
                for verifier in verifiers.values():
                    verifier.check()

        checking = threading.Thread(target=verify, daemon=True)
        checking.start()
        flapper = threading.Thread(target=flap, daemon=True)
        flapper.start()
        directors.thread.start()
        began = time.monotonic()
        try:
            kills = kill_at_random_points(
                "tests.route_job_child",
                [str(config_path), jobdb, str(tmp_path / "checkpoint")],
                log_url=log_url,
                grow=grow,
                rng=rng,
                kills=KILLS + SELF_KILLS,
                checkpoints=Checkpoints({"route": tmp_path / "checkpoint"}),
                self_kill=self_kill,
            )
            self_kills = kills.self_kills
            directors.thread.join(300)
        finally:
            flapping.clear()
            flapper.join(5)
            checking.join(30)
        assert directors.failure is None, directors.failure
        assert not directors.thread.is_alive()
        orders.down = ios.down = shaped.down = batched.down = False
        final = subprocess.run(
            [*directors.command, "--until-drained"], capture_output=True, timeout=300
        )
        assert final.returncode == 0, final.stderr.decode()[-2000:]
        for verifier in verifiers.values():
            verifier.check()
        took = time.monotonic() - began

        truth = Truth(values)
        with open_jobdb(jobdb) as db:
            assert db.states() == truth.states()
            assert db.route_counts() == truth.counts  # each counted once, replays and all
        assert truth.ids["filtered"] and truth.ids["shaped"] and truth.failed
        duplicates = {name: verifiers[name].duplicates(truth.ids[name]) for name in FILTERS}
        assert verifiers["shaped"].bodies == truth.bodies  # the transform's body, once made
        # per message: a copy only for each kill that found it executing
        directors.requests.check_duplicates({n: r.successes() for n, r in receivers.items()})
    total = sum(duplicates.values())
    print(
        f"{len(values)} events, jobs { ({n: len(i) for n, i in truth.ids.items()}) }, "
        f"{len(truth.failed)} failed, not sent {truth.counts}; route SIGKILLed "
        f"{KILLS + SELF_KILLS - self_kills} times + {self_kills} self-kills after a JobDB commit, "
        f"deliver {directors.kills} times, in {took:.0f} s; executing at the director's kills "
        f"{sum(directors.requests.left_executing.values())}, duplicates {duplicates}"
    )
    assert self_kills == SELF_KILLS and directors.kills == KILLS
    kills.landings.check()  # the route's kills inside micro-batches
    directors.requests.check()  # the director's kills with requests in flight
    # a duplicate is a request out when a director died: at most max_in_flight per destination
    # per kill in all (per message: check_duplicates above)
    assert total <= KILLS * len(FILTERS) * MAX_IN_FLIGHT
    assert Counter(json.loads(v)["messageId"] for v in values).most_common(1)[0][1] == 1
