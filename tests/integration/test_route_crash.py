"""Routing and delivery killed together: ``exactly route`` and ``exactly deliver`` SIGKILLed 20
times each at random points, at the same time, while events keep arriving and receivers flap.

The route runs are real Spark job processes (``tests/route_job_child.py``, the shared harness of
``tests/job_child.py``); four more runs kill themselves right after a JobDB commit and before
Spark's, so the next run replays a batch the JobDB already holds. Meanwhile a thread starts
``exactly deliver`` and SIGKILLs it once it is sending (0 to 0.3 s after the receivers got a
request of its own), twenty times, while two of the three receivers flip between 503 and 200.
Afterwards one route run catches up and one director drains:

* the JobDB holds exactly one job per (event, matching destination), all succeeded;
* every receiver got 2xx for exactly the events its destination's filters match;
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

import pytest
from standardwebhooks.webhooks import Webhook

from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import SUCCEEDED
from exactly.log import Log, open_log
from tests.aggregate_stream import EventStream, append
from tests.batches_in_flight import Checkpoints
from tests.job_child import kill_at_random_points
from tests.receiver import Receiver
from tests.requests_in_flight import RequestKills, executing, received
from tests.route_job_child import KILL_AFTER_COMMIT
from tests.seeds import crash_seed

pytestmark = [pytest.mark.spark, pytest.mark.slow]
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KILLS = 20
SELF_KILLS = 4
MAX_IN_FLIGHT = 4
PARTITIONS = 2
FILTERS = {  # destination: (sources, events), as in the config below
    "all": (None, None),
    "orders": (None, ["Order Completed"]),
    "ios": (["ios"], None),
}


def config(path: Path, urls: dict[str, str]) -> Path:
    text = f'data_dir = "{path.parent / "data"}"\n[log]\nurl = "sqlite://{path.parent / "log"}"\n'
    for name, (sources, events) in FILTERS.items():
        text += (
            f'[[destinations]]\nname = "{name}"\nurl = "{urls[name]}"\nsecret = "{SECRET}"\n'
            f'timeout = "1s"\nmax_in_flight = {MAX_IN_FLIGHT}\n'
            + (f"sources = {json.dumps(sources)}\n" if sources else "")
            + (f"events = {json.dumps(events)}\n" if events else "")
            + '[destinations.backoff]\nmin = "50ms"\nmax = "300ms"\n'
        )
    path.write_text(text)
    return path


def expected(values: list[bytes]) -> dict[str, set[str]]:
    """Per destination, the message ids its filters take (plain Python, not the route code)."""
    out: dict[str, set[str]] = {name: set() for name in FILTERS}
    for value in values:
        event = json.loads(value)
        for name, (sources, events) in FILTERS.items():
            if (sources is None or event["sourceId"] in sources) and (
                events is None or event.get("event") in events
            ):
                out[name].add(event["messageId"])
    return out


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
            message_id = request.headers["webhook-id"]
            try:
                assert request.headers["Idempotency-Key"] == message_id
                assert self.webhook.verify(request.body, request.headers)["messageId"] == message_id
                assert self.bodies.setdefault(message_id, request.body) == request.body
            except Exception as error:  # noqa: BLE001 (reported at the end)
                self.failures.append(f"{message_id}: {error!r}")
            self.checked += 1

    def duplicates(self, ids: set[str]) -> int:
        """After the run: every 2xx id expected, and the duplicate 2xx answered."""
        self.check()
        assert not self.failures, self.failures[:5]
        assert self.checked == len(self.receiver.requests)
        successes = self.receiver.successes()
        assert set(successes) == ids
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
        records = list(stream.chunk(4))
        values.extend(value for _, value in records)
        append(log, "events", PARTITIONS, records)

    with (
        Receiver(delay=0.02) as steady,
        Receiver(delay=0.02) as orders,
        Receiver(delay=0.02) as ios,
    ):
        receivers = {"all": steady, "orders": orders, "ios": ios}
        urls = {"all": steady.url + "/ok", "orders": orders.url + "/flap", "ios": ios.url + "/flap"}
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
                orders.down = not orders.down
                ios.down = not orders.down

        verifiers = {name: Verifier(receiver) for name, receiver in receivers.items()}

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
        orders.down = ios.down = False
        final = subprocess.run(
            [*directors.command, "--until-drained"], capture_output=True, timeout=300
        )
        assert final.returncode == 0, final.stderr.decode()[-2000:]
        for verifier in verifiers.values():
            verifier.check()
        took = time.monotonic() - began

        truth = expected(values)
        with open_jobdb(jobdb) as db:
            assert db.states() == {name: {SUCCEEDED: len(ids)} for name, ids in truth.items()}
        duplicates = {name: verifiers[name].duplicates(truth[name]) for name in FILTERS}
        # per message: a copy only for each kill that found it executing
        directors.requests.check_duplicates({n: r.successes() for n, r in receivers.items()})
    total = sum(duplicates.values())
    print(
        f"{len(values)} events, jobs { ({n: len(i) for n, i in truth.items()}) }; route SIGKILLed "
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
