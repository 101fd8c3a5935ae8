"""Recovery after one kill: seconds from a SIGKILL until an event sent at that moment is delivered.

    .venv/bin/python bench/recovery.py [--stack embedded|scale-out|both] [--rounds 3]
                                       [--kinds up,pipeline,collector,director,shard]

``exactly up`` runs on a stack (the config of ``tests/up_service.write_config``: one source, a
destination taking every event and one taking orders, on a loopback receiver) with a lake
table, while clients send 100 events/s through the collector as SDKs do (a refused batch is
sent again). Each round kills each kind once, in turn:

* ``up``: the whole process group (the machine's session dies); ``up`` is started again;
* ``pipeline``, ``collector``, ``director``: that part's process group (``up`` restarts it);
* ``shard`` (scale-out): one of the two Redis servers of the dedupe store, restarted empty.

At the kill's instant a probe event (its own messageId) is sent, again until accepted; its
recovery is the time from the kill until the receiver gets it. Before each round a probe with no
kill gives the baseline (the pipeline's own latency at this load). Prints each recovery, then a
markdown table of median and worst per kind, and copies the parts' logs (``DATA_DIR/up``) and
Spark's (``DATA_DIR/logs``) to ``--keep`` for where the time went.

Stacks: ``embedded`` is the defaults (sqlite log, rocksdb store, SQLite aggregates and JobDB)
with a Delta lake; ``scale-out`` is Tansu (Kafka protocol), the redis store over two servers,
PostgreSQL aggregates, a MariaDB JobDB and Iceberg with its catalog in PostgreSQL.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.receiver import Receiver
from tests.servers import RedisServer, TansuBroker
from tests.up_service import WRITE_KEY, Stack, UpService, wait_until_gone, write_config

KINDS = ("up", "pipeline", "collector", "director", "shard")
RATE = 100  # events/s of background traffic
COMMANDS = {"pipeline": "pipeline", "collector": "collect", "director": "deliver"}  # parts' argv
DEADLINE = 300.0  # a probe not delivered by then counts as this (and is reported)


class Phases:
    """What the pipeline part says each starting query waits on (``DATA_DIR/up/queries.json``),
    sampled every 0.25 s from a thread while a probe is under way: where a recovery's time goes."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "up" / "queries.json"
        self.seen: list[tuple[float, str, str]] = []  # (seconds since began, query, waits on)
        self.stopping = threading.Event()

    def watch(self, began: float) -> threading.Thread:
        self.seen, self.began = [], began
        self.stopping.clear()
        thread = threading.Thread(target=self._sample, daemon=True)
        thread.start()
        return thread

    def _sample(self) -> None:
        last: dict[str, str] = {}
        while not self.stopping.is_set():
            with contextlib.suppress(OSError, ValueError):
                document = json.loads(self.path.read_text())
                now = time.monotonic() - self.began
                waiting = {**document.get("waiting", {})}
                for query in document.get("first", {}):
                    waiting[query] = "running"
                for query, text in waiting.items():
                    if last.get(query) != text:
                        last[query] = text
                        self.seen.append((now, query, text))
            time.sleep(0.25)

    def story(self) -> str:
        """Each query's steps with the second each was first seen, one query per line."""
        lines = []
        for query in dict.fromkeys(query for _, query, _ in self.seen):
            steps = [f"{at:.0f}s {text}" for at, q, text in self.seen if q == query]
            lines.append(f"      {query}: " + "; ".join(steps))
        return "\n".join(lines)


class Traffic:
    """Clients sending batches of 20 events every 0.2 s until stopped, each batch again until
    accepted; and probes, one event each."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.auth = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)

    def _run(self) -> None:
        while not self.stopping.is_set():
            batch = [self.event(f"bg-{uuid.uuid4()}") for _ in range(RATE // 5)]
            while not self.stopping.is_set() and not self.post(batch):
                time.sleep(0.3)
            self.sent += len(batch)
            time.sleep(0.2)

    def event(self, message_id: str) -> dict[str, object]:
        return {
            "type": "track",
            "event": "Product Viewed",
            "messageId": message_id,
            "userId": "user-1",
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        }

    def post(self, batch: list[dict[str, object]]) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request(
                "POST",
                "/v1/batch",
                json.dumps({"batch": batch}).encode(),
                {"Authorization": self.auth, "Content-Type": "application/json"},
            )
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def probe(self, receiver: Receiver, began: float) -> float:
        """Send one probe event until accepted; seconds from ``began`` until it is delivered."""
        probe = f"probe-{uuid.uuid4()}"
        while not self.post([self.event(probe)]):
            if time.monotonic() - began > DEADLINE:
                return DEADLINE
            time.sleep(0.1)
        needle = probe.encode()
        seen = 0
        while time.monotonic() - began < DEADLINE:
            requests = receiver.requests
            for request in requests[seen:]:
                if request.path == "/ok" and needle in request.body:
                    return request.at - began
            seen = max(0, len(requests) - 1)
            time.sleep(0.05)
        return DEADLINE


@contextlib.contextmanager
def scale_out_stack(directory: Path) -> Iterator[tuple[Stack, str, RedisServer]]:
    from tests.aggregate_db import postgres_schema
    from tests.dedupe_stores import redis_store_url
    from tests.jobdb import mysql_database

    with contextlib.ExitStack() as servers:
        broker = servers.enter_context(TansuBroker())
        shards = [servers.enter_context(RedisServer()) for _ in range(2)]
        database = servers.enter_context(postgres_schema())
        catalog = servers.enter_context(postgres_schema())
        jobdb = servers.enter_context(mysql_database())
        store = redis_store_url([shard.url for shard in shards], f"bench{uuid.uuid4().hex[:8]}")
        base = catalog.removeprefix("postgresql://")
        lake = f"iceberg+postgresql://{base}&warehouse={directory / 'warehouse'}"
        yield Stack(broker.url, store, database, jobdb), lake, shards[1]


@contextlib.contextmanager
def embedded_stack(directory: Path) -> Iterator[tuple[None, str, None]]:
    yield None, f"delta://{directory / 'lake' / 'events'}", None


def kill_group(pid: int | None) -> None:
    if pid is None:
        raise RuntimeError("the part is not running")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    wait_until_gone(pid)


def run_stack(name: str, rounds: int, kinds: list[str], keep: Path | None) -> dict[str, list]:
    rng = random.Random(f"recovery-{name}")
    directory = Path(tempfile.mkdtemp(prefix=f"recovery-{name}-"))
    stack_of = scale_out_stack if name == "scale-out" else embedded_stack
    results: dict[str, list[float]] = {"no kill": []}
    with stack_of(directory) as (stack, lake, shard), Receiver() as receiver:
        config = write_config(directory, receiver.url, scale_out=stack)
        config.write_text(config.read_text() + f'\n[lake]\nurl = "{lake}"\n')
        service = UpService(config, directory)
        traffic = Traffic(service.port)
        phases = Phases(directory / "data")
        try:
            service.start()
            traffic.start()
            first = traffic.probe(receiver, time.monotonic())
            print(f"{name}: first probe delivered {first:.1f} s after the traffic began")
            for round_ in range(rounds):
                time.sleep(5)
                results["no kill"].append(traffic.probe(receiver, time.monotonic()))
                print(f"  round {round_ + 1}: no kill {results['no kill'][-1]:.1f} s", flush=True)
                for kind in kinds:
                    if kind == "shard" and shard is None:
                        continue
                    time.sleep(rng.uniform(3.0, 8.0))  # steady work, batches in flight
                    began = time.monotonic()
                    watcher = phases.watch(began)
                    if kind == "up":
                        service.kill()
                        service.start()
                    elif kind == "shard":
                        assert shard is not None
                        shard.restart()
                    else:
                        kill_group(service.part_pid(COMMANDS[kind]))
                    took = traffic.probe(receiver, began)
                    phases.stopping.set()
                    watcher.join()
                    results.setdefault(kind, []).append(took)
                    late = " (not delivered)" if took >= DEADLINE else ""
                    print(f"  round {round_ + 1}: {kind} {took:.1f} s{late}", flush=True)
                    if kind in ("up", "pipeline"):
                        print(phases.story(), flush=True)
        finally:
            traffic.stop()
            service.kill()
            if keep is not None:
                target = keep / name
                target.mkdir(parents=True, exist_ok=True)
                for folder in ("up", "logs"):
                    with contextlib.suppress(FileNotFoundError):
                        shutil.copytree(
                            directory / "data" / folder, target / folder, dirs_exist_ok=True
                        )
                for err in directory.glob("up-*.err"):
                    shutil.copy(err, target / err.name)
            shutil.rmtree(directory, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--stack", choices=("embedded", "scale-out", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--keep", type=Path, help="copy the parts' and Spark's logs here")
    args = parser.parse_args()
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}: choose from {', '.join(KINDS)}")
    stacks = ["embedded", "scale-out"] if args.stack == "both" else [args.stack]
    print(f"# {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    table = []
    for stack in stacks:
        for kind, times in run_stack(stack, args.rounds, kinds, args.keep).items():
            table.append((stack, kind, times))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}\n")
    print("| stack | kill | runs | median s | worst s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for stack, kind, times in table:
        print(
            f"| {stack} | {kind} | {len(times)} | {statistics.median(times):.1f} | "
            f"{max(times):.1f} |"
        )


if __name__ == "__main__":
    main()
