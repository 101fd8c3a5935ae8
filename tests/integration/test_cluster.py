"""The pipeline on a standalone Spark cluster: a worker lost and the driver killed mid-stream.

Real parts throughout: a Spark master and two workers (1 core, 1 GB, a work dir each) from the
installed PySpark, whose executors run a Python without ``exactly`` (the driver ships it); the
Kafka-protocol log on Tansu; the redis dedupe store over two Redis servers; aggregates and the
JobDB in a PostgreSQL database of the test's own; ``exactly up`` (collector, the Spark
application, the director) with ``--master spark://...``; a real HTTP receiver; ``exactly audit``.
A third destination has a filter and a transform whose module sits only beside the config, so
its arriving shaped proves the module was shipped to the workers. Then a fourth destination is
added, and ``exactly backfill`` routes it the history on the cluster. Then the rocksdb store on
the same cluster: ``exactly dedupe`` and ``exactly up`` refuse it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aggregate_db import postgres_missing
from tests.cli_text import messages
from tests.conftest import require
from tests.receiver import Receiver
from tests.servers import RedisServer, TansuBroker, free_port, redis_available, tansu_available
from tests.spark_cluster import SparkCluster, plain_python
from tests.up_service import ROOT, WRITE_KEY, Clients, UpService

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN, autocommit=True) as connection:
        connection.execute(sql)


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database of the test's own (aggregates and JobDB), dropped at the end."""
    require(postgres_missing())
    name = f"exactly_cluster_{uuid.uuid4().hex[:12]}"
    admin(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def counted(url: str) -> int:
    import psycopg

    with contextlib.closing(psycopg.connect(url, autocommit=True)) as connection:
        try:
            row = connection.execute("SELECT COALESCE(SUM(count), 0) FROM event_counts").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return int(row[0]) if row else 0


def write_config(directory: Path, *, log: str, store: str, database: str, receiver: str) -> Path:
    config = directory / "exactly.toml"
    config.write_text(
        f"""
data_dir = "{directory / "data"}"

[log]
url = "{log}"

[console]
port = 0

[collector]
port = {free_port()}
partitions = 2

[collector.sources]
web = "{WRITE_KEY}"

[dedupe]
store = "{store}"

[aggregate]
url = "{database}"

[delivery]
jobdb = "{database}"

[[destinations]]
name = "all"
url = "{receiver}/ok"
[destinations.backoff]
min = "200ms"
max = "1s"

[[destinations]]
name = "orders"
url = "{receiver}/flaky/1"
events = ["Order Completed"]
[destinations.backoff]
min = "200ms"
max = "1s"

[[destinations]]
name = "shaped"
url = "{receiver}/shaped"
filter = "type = 'track' and event = 'Order Completed'"
transform = "shapes:to_crm"
[destinations.backoff]
min = "200ms"
max = "1s"
"""
    )
    # beside the config only: the executors' Python has neither it nor exactly (both shipped)
    (directory / "shapes.py").write_text(SHAPES)
    return config


SHAPES = """
import platform

def to_crm(event):
    return {"messageId": event["messageId"], "crm": True, "python": platform.python_version()}
"""


class ClusterUp(UpService):
    """``exactly up --master URL`` with executors on ``python``."""

    def __init__(self, config: Path, directory: Path, master: str, python: Path) -> None:
        super().__init__(config, directory)
        self.master = master
        self.python = python

    def start(self) -> None:
        self.runs += 1
        env = {
            **os.environ,
            "EXACTLY_CONFIG": str(self.config),
            "PYTHONPATH": str(ROOT / "src"),
            "PYSPARK_PYTHON": str(self.python),  # the executors' Python: no exactly there
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        command = [sys.executable, "-m", "exactly", "up", "--no-live", "--every", "2"]
        with (self.directory / f"up-{self.runs}.err").open("wb") as err:
            self.process = subprocess.Popen(
                [*command, "--master", self.master],
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )


def wait_for(
    service: UpService,
    receiver: Receiver,
    ids: set[str],
    orders: set[str],
    database: str,
    timeout: float,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivered = set(receiver.successes("/ok")) >= ids
        ordered = set(receiver.successes("/flaky/1")) >= orders
        shaped = set(receiver.successes("/shaped")) >= orders
        if delivered and ordered and shaped and counted(database) >= len(ids):
            return
        assert service.process is not None and service.process.poll() is None, service.stderr()
        time.sleep(1)
    raise AssertionError(
        f"not everything arrived: counted {counted(database)} of {len(ids)}, "
        f"{len(set(receiver.successes('/ok')) & ids)} delivered to 'all'\n"
        + service.stderr()[-3000:]
    )


def backfilled(
    config: Path, directory: Path, master: str, python: Path, receiver: Receiver, orders: set[str]
) -> None:
    with config.open("a") as text:
        text.write(
            f'\n[[destinations]]\nname = "late"\nurl = "{receiver.url}/late"\n'
            "filter = \"type = 'track' and event = 'Order Completed'\"\n"
            'transform = "shapes:to_crm"\n'
        )
    env = {
        **os.environ,
        "EXACTLY_CONFIG": str(config),
        "PYTHONPATH": str(ROOT / "src"),
        "PYSPARK_PYTHON": str(python),  # the executors' Python: no exactly there
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    for command in (
        ["route", "--until-caught-up", "--master", master],
        ["backfill", "late", "--master", master],
        ["deliver", "--until-drained"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "exactly", *command],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr[-3000:]}"
        if command[0] == "backfill":
            assert done.stdout.startswith(f"backfill late: {len(orders):,} jobs for "), done.stdout
    late = receiver.successes("/late")
    assert set(late) == orders and max(late.values()) == 1
    bodies = [json.loads(r.body) for r in receiver.requests if r.path == "/late"]
    assert all(body["crm"] is True and body["messageId"] in orders for body in bodies)


def test_pipeline_on_a_cluster_survives_a_lost_worker_and_a_killed_driver(
    tmp_path: Path, database: str
) -> None:
    require(tansu_available())
    require(redis_available())
    python = plain_python(tmp_path / "plain")
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(TansuBroker())
        shards = [stack.enter_context(RedisServer()) for _ in range(2)]
        receiver = stack.enter_context(Receiver())
        cluster = stack.enter_context(SparkCluster(tmp_path / "cluster", workers=2))
        store = "redis://" + ",".join(f"127.0.0.1:{shard.port}" for shard in shards) + "/0"
        config = write_config(
            tmp_path, log=broker.url, store=store, database=database, receiver=receiver.url
        )
        service = ClusterUp(config, tmp_path, cluster.url, python)
        stack.callback(service.close)
        service.start()
        clients = Clients(service.port, batches=60, size=20, pause=0.5).start()

        # A worker lost mid-stream: once both workers have run tasks and events are counted.
        deadline = time.monotonic() + 300
        while not (cluster.tasks_run(0) and cluster.tasks_run(1) and counted(database)):
            assert time.monotonic() < deadline, (
                "no micro-batch ran on both workers\n" + (service.stderr()[-3000:])
            )
            assert service.process is not None and service.process.poll() is None, service.stderr()
            time.sleep(1)
        before = counted(database)
        cluster.kill_worker(1)
        print(f"worker 1 killed at {before} counted; {cluster.tasks_run(0)} tasks on worker 0")
        # a second wave sent after the loss: on a slow machine the first may be counted by now
        after = Clients(service.port, batches=20, size=20, pause=0.5, prefix="after-").start()
        deadline = time.monotonic() + 180
        while counted(database) <= before:  # the other worker goes on
            assert time.monotonic() < deadline, (
                "nothing counted after the worker was lost\n" + service.stderr()[-3000:]
            )
            time.sleep(1)
        cluster.start_worker(1)

        # The driver killed: up restarts the Spark application, which resumes from its checkpoints.
        pipeline = service.part_pid("pipeline")
        assert pipeline is not None
        os.kill(pipeline, 9)
        assert clients.wait(300) and after.wait(300), "the clients could not send"
        ids, orders = clients.ids | after.ids, clients.orders | after.orders
        wait_for(service, receiver, ids, orders, database, timeout=300)
        deadline = time.monotonic() + 60  # the work may be done before up has seen the death
        while "pipeline died (signal 9)" not in service.stderr():
            assert time.monotonic() < deadline, service.stderr()
            time.sleep(0.5)

        assert counted(database) == len(ids), "an event counted twice or not at all"
        audit = subprocess.run(
            [sys.executable, "-m", "exactly", "audit"],
            cwd=tmp_path,
            env={**os.environ, "EXACTLY_CONFIG": str(config), "PYTHONPATH": str(ROOT / "src")},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert audit.returncode == 0, audit.stdout + audit.stderr
        for path, wanted in (("/ok", ids), ("/flaky/1", orders)):
            got = receiver.successes(path)
            assert set(got) == wanted, f"{path}: not every event"
            # the director never died: a job once in the JobDB (exactly once, whatever the
            # driver's crash replayed) is sent until its first 2xx, and never after it
            assert max(got.values()) == 1, f"{path}: {sum(got.values()) - len(got)} copies"
        shaped = [json.loads(r.body) for r in receiver.requests if r.path == "/shaped"]
        assert {body["messageId"] for body in shaped} == orders
        assert all(
            body["crm"] is True and set(body) == {"messageId", "crm", "python"} for body in shaped
        )
        service.kill()

        # A destination added later gets the history on the cluster: the route starts with it,
        # then `exactly backfill` routes it every order before, its transform on the workers.
        backfilled(config, tmp_path, cluster.url, python, receiver, orders)

        # The rocksdb store on this cluster (two workers, two work dirs): refused with one line.
        env = {
            **os.environ,
            "EXACTLY_CONFIG": str(config),
            "EXACTLY_DEDUPE__STORE": "rocksdb",
            "PYTHONPATH": str(ROOT / "src"),
        }
        for command in (["dedupe", "--until-caught-up"], ["up", "--no-live"]):
            refused = subprocess.run(
                [sys.executable, "-m", "exactly", *command, "--master", cluster.url],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert refused.stderr.startswith("error: the rocksdb dedupe store keeps its files"), (
                refused.stderr
            )
            assert len(messages(refused.stderr)) == 1, refused.stderr
