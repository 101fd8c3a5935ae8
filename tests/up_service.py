"""``exactly up`` for the tests: the service in its own process group, clients that retry, checks.

:class:`UpService` runs ``exactly up`` (no live view) in a session of its own so that a test can
SIGKILL the whole group, as a crash does, or SIGTERM it, as a stop does. :class:`Clients` send
Segment batches through ``/v1/batch`` as an SDK does: a batch that gets no 200 (the collector is
down, restarting, or answered 503) is sent again, with the same messageIds, until it is accepted.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.batches_in_flight import BATCH_WAIT, Checkpoints, Landing, Landings, find
from tests.job_child import FAST_JVM
from tests.receiver import Receiver
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
WRITE_KEY = "wk_up_test"


@dataclass(frozen=True)
class Stack:
    """The backends of a pipeline by URL: the log, the dedupe store, the aggregate database and
    the JobDB (None: the aggregate database)."""

    log: str
    store: str
    database: str
    jobdb: str | None = None

    @property
    def jobdb_url(self) -> str:
        return self.jobdb or self.database


def write_config(
    directory: Path,
    receiver_url: str,
    *,
    port: int | None = None,
    console_port: int = 0,
    scale_out: Stack | None = None,
) -> Path:
    """An exactly.toml: one source, two destinations (every event; orders only, failing once);
    the web console on ``console_port`` (0: none); the embedded backends unless ``scale_out``."""
    port = port or free_port()
    config = directory / "exactly.toml"
    backends = ""
    if scale_out is not None:
        backends = (
            f'[log]\nurl = "{scale_out.log}"\n[dedupe]\nstore = "{scale_out.store}"\n'
            f'[aggregate]\nurl = "{scale_out.database}"\n'
        )
    jobdb = "" if scale_out is None else f'jobdb = "{scale_out.jobdb_url}"'
    config.write_text(
        f"""
data_dir = "{directory / "data"}"
{backends}
[console]
port = {console_port}

[collector]
port = {port}
partitions = 2

[collector.sources]
web = "{WRITE_KEY}"

[delivery]
dataset_rows = 2000
{jobdb}

[[destinations]]
name = "all"
url = "{receiver_url}/ok"
[destinations.backoff]
min = "200ms"
max = "1s"

[[destinations]]
name = "orders"
url = "{receiver_url}/flaky/1"
events = ["Order Completed"]
[destinations.backoff]
min = "200ms"
max = "1s"
"""
    )
    return config


class UpService:
    """``exactly up`` as a process group; its stderr in ``DIR/up-N.err``."""

    def __init__(self, config: Path, directory: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.directory = directory
        self.env = env or {}  # more environment for every run
        self.runs = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The collector's port."""
        text = self.config.read_text().split("[collector]", 1)[1]
        return int(text.split("port = ", 1)[1].split("\n", 1)[0])

    @property
    def console_url(self) -> str:
        text = self.config.read_text().split("[console]", 1)[1]
        return f"http://127.0.0.1:{int(text.split('port = ', 1)[1].split(chr(10), 1)[0])}"

    def start(self) -> None:
        self.runs += 1
        env = {
            **os.environ,
            "EXACTLY_CONFIG": str(self.config),
            "JDK_JAVA_OPTIONS": FAST_JVM,
            "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        env.update(self.env)
        with (self.directory / f"up-{self.runs}.err").open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "exactly", "up", "--no-live", "--every", "2"],
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return (self.directory / f"up-{self.runs}.err").read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash of the machine's session would."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        wait_until_gone(self.process.pid)

    def terminate(self, timeout: float = 60.0) -> tuple[int, float]:
        """SIGTERM ``up`` alone; (exit status, seconds until it exited)."""
        assert self.process is not None
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        return code, time.monotonic() - began

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def part_pid(self, name: str) -> int | None:
        """The pid of a part (a child of ``up`` running ``exactly NAME``), if running."""
        assert self.process is not None
        for child in _children(self.process.pid):
            command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if name.encode() in command:
                return child
        return None

    def close(self) -> None:
        self.kill()


class WorkInFlight:
    """What one run of ``up`` has in flight: micro-batches it planned and has not committed (the
    checkpoints in ``DATA_DIR/checkpoints``), and requests a receiver got from it whose outcome
    the JobDB does not hold (``tests/requests_in_flight.py``). ``paths``: each destination's
    path on ``receiver``."""

    def __init__(
        self, data_dir: Path, jobdb: str, receiver: Receiver, paths: Mapping[str, str]
    ) -> None:
        self.checkpoints = Checkpoints(lambda: find(data_dir / "checkpoints"))
        self.jobdb = jobdb
        self.receiver = receiver
        self.paths = paths
        self.began = time.monotonic()

    def run_starts(self) -> None:
        self.began = time.monotonic()
        self.checkpoints.run_starts()

    def wait_for_batch(self, timeout: float, alive: Callable[[], bool]) -> bool:
        return self.checkpoints.wait_for_batch(timeout, alive)

    def landing(self, killed_at: float) -> Landing:
        """Where the kill at ``killed_at`` (``time.monotonic()``) landed, read once the whole
        process group is gone."""
        from exactly.delivery.jobdb import open_jobdb
        from tests.requests_in_flight import executing

        with open_jobdb(self.jobdb) as db:
            out = executing(db)
        got = {
            (destination, request.headers.get("webhook-id", ""))
            for destination, path in self.paths.items()
            for request in list(self.receiver.requests)
            if request.path == path and self.began <= request.at <= killed_at
        }
        requests = len(out & got)
        return Landing(
            self.checkpoints.own_in_flight()
            + ((f"{requests} requests of its own",) if requests else ())
        )


def kill_on_progress(
    service: UpService,
    rng: random.Random,
    *,
    kills: int,
    at_start: int,
    progress: Callable[[], tuple[int, ...]],
    work: WorkInFlight,
    on_work: Callable[[int], None] | None = None,
) -> Landings:
    """SIGKILL the running service's whole group ``kills`` times, starting it again after each.

    ``at_start`` kills, chosen at random, come at a random moment 1 to 12 s after a start
    (Spark starting, the queries planning); the others once ``progress()`` (events counted,
    delivered...) has grown since that start and a micro-batch of the run's own is in flight
    (``work``), after ``on_work(kill)`` and 0 to 0.5 s more, so that they interrupt work (when
    that batch has ended by then, as soon as the next is seen in flight).
    Returns where those kills after work landed (``work``: a batch or a request in flight).
    """
    landings = Landings("up, kills after start-up", inside_what="with work in flight")
    early = set(rng.sample(range(kills), at_start))
    for kill in range(kills):
        began = time.monotonic()
        work.run_starts()
        before = progress()
        alive = service.alive
        if kill in early:
            time.sleep(rng.uniform(1.0, 12.0))
        else:
            while progress() <= before:
                assert time.monotonic() - began < 180, "no progress\n" + service.stderr()
                assert alive(), service.stderr()
                time.sleep(0.2)
            if on_work is not None:
                on_work(kill)
            assert work.wait_for_batch(BATCH_WAIT, alive), "no micro-batch\n" + service.stderr()
            time.sleep(rng.uniform(0.0, 0.5))
            for _ in range(20):  # that batch ended meanwhile: kill as soon as the next is seen
                if work.checkpoints.own_in_flight():  # (short ones on a loaded machine: at once)
                    break
                assert work.wait_for_batch(BATCH_WAIT, alive), "no micro-batch\n" + service.stderr()
        assert alive(), service.stderr()
        killed_at = time.monotonic()
        service.kill()
        if kill in early:  # (its JobDB may not even exist yet)
            landing = Landing(work.checkpoints.own_in_flight())
        else:
            landing = landings.add(work.landing(killed_at))
        print(
            f"kill {kill + 1} after {time.monotonic() - began:.1f} s"
            f"{' (start-up)' if kill in early else ''}: {landing}; progress {progress()}"
        )
        service.start()
    return landings


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def wait_until_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until no process of group ``pgid`` is left (a part's children die with it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    alive = alive or (int(fields[2]) == pgid and fields[0] != "Z")
        if not alive:
            return
        time.sleep(0.1)


MORE_PAUSE = 2.0  # seconds between the events Clients(more=True) sends after its batches


class Clients:
    """Send ``batches`` batches of ``size`` events, each until accepted, from a thread.

    ``more``: then go on sending one event every :data:`MORE_PAUSE` seconds until
    :meth:`enough` (a crash test whose kills must each find new work, however long a loaded
    machine makes them take, with little more data to check). :attr:`sent` holds every batch
    sent or being sent.
    """

    def __init__(
        self,
        port: int,
        batches: int,
        size: int = 50,
        *,
        pause: float = 0.05,
        prefix: str = "",
        more: bool = False,
    ) -> None:
        self.port = port
        self.pause = pause
        self.size = size
        self.prefix = prefix
        self.sent: list[list[dict[str, object]]] = [self._batch(b) for b in range(batches)]
        self.accepted = 0
        self.refused = 0
        self._enough = threading.Event()
        if not more:
            self._enough.set()
        self.thread = threading.Thread(target=self._send_all, daemon=True)

    def _batch(self, number: int, count: int | None = None) -> list[dict[str, object]]:
        count = self.size if count is None else count
        return [_event(number * self.size + i, self.prefix) for i in range(count)]

    def enough(self) -> None:
        """Send no batch past the one being sent (``more``)."""
        self._enough.set()

    @property
    def ids(self) -> set[str]:
        return {str(event["messageId"]) for batch in self.sent for event in batch}

    @property
    def orders(self) -> set[str]:
        return {
            str(event["messageId"])
            for batch in self.sent
            for event in batch
            if event.get("event") == "Order Completed"
        }

    def start(self) -> Clients:
        self.thread.start()
        return self

    def wait(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _send_all(self) -> None:
        auth = base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
        number, fixed = 0, len(self.sent)
        while number < len(self.sent) or not self._enough.is_set():
            if number == len(self.sent):
                self.sent.append(self._batch(number, 1))
            batch = self.sent[number]
            number += 1
            body = json.dumps({"batch": batch}).encode()
            while True:
                if self._post(body, auth):
                    self.accepted += 1
                    break
                self.refused += 1
                time.sleep(0.3)
            time.sleep(self.pause if number < fixed else MORE_PAUSE)

    def _post(self, body: bytes, auth: str) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request(
                "POST",
                "/v1/batch",
                body,
                {"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
            )
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()


def _event(number: int, prefix: str) -> dict[str, object]:
    event: dict[str, object] = {
        "type": "track",
        "event": "Order Completed" if number % 3 == 0 else "Product Viewed",
        "messageId": f"{prefix}{uuid.UUID(int=number + 1, version=4)}",
        "userId": f"user-{number % 17}",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
    }
    if number % 3 == 0:
        event["properties"] = {"revenue": 1.5}
    return event


def counted(where: Path | str) -> int:
    """Events counted in ``event_counts`` so far (0 before the table exists): in the data dir's
    ``aggregates.db``, or in the aggregate database at a URL."""
    if isinstance(where, str):  # postgresql://
        import psycopg

        with contextlib.closing(psycopg.connect(where, autocommit=True)) as connection:
            try:
                found = connection.execute("SELECT COALESCE(SUM(count), 0) FROM event_counts")
            except psycopg.errors.UndefinedTable:
                return 0
            row = found.fetchone()
        return int(row[0]) if row else 0
    path = where / "aggregates.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
        try:
            row = db.execute("SELECT COALESCE(SUM(count), 0) FROM event_counts").fetchone()
        except sqlite3.OperationalError:
            return 0
    return int(row[0])


def spark_failures(data_dir: Path, name: str = "exactly-up") -> list[str]:
    """Lines of the Spark application's log (``DATA_DIR/logs``) naming a failure that no kill
    explains: a task binary written torn (java.io.OptionalDataException, Spark 4.3's race on a
    data source's environment, worked around in ``exactly.spark.datasource``)."""
    log = data_dir / "logs" / f"spark-{name}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line for line in text.splitlines() if "OptionalDataException" in line]
