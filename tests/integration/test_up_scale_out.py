"""``exactly up`` on the scale-out stack, SIGKILLed as a whole and its Redis shard restarted empty.

The backends an operator scales out to: the log on a Kafka-protocol broker (Tansu), the redis
dedupe store over two servers, the aggregates and the JobDB in PostgreSQL. Clients send through
the collector and retry as SDKs do. Meanwhile:

* ``up``'s whole process group is SIGKILLed 10 times; most kills come once this run has been
  seen to work (events counted or delivered since it started), the others at a random moment of
  its start (Spark starting, queries planning);
* one of the two Redis servers is SIGKILLed and started again empty 3 times while ``up`` runs,
  so dedupe must rebuild that server from ``events`` and go on (it once refused every later
  start: issue 30);
* a fifth of the log's fetches, in every part, come back short at random
  (``tests/short_reads.py``), as Tansu once cut one and 11 counted events were never delivered.

At the end every event is counted once (and ``exactly audit`` agrees) and has reached every
destination that takes it, with copies only within the bound of the requests in flight at the
kills.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import short_reads
from tests.aggregate_db import postgres_missing, postgres_schema
from tests.conftest import redis_namespace, require
from tests.dedupe_stores import redis_store_url
from tests.integration.test_up import check_exact, wait_for_everything
from tests.receiver import Receiver
from tests.servers import RedisServer, TansuBroker, redis_available, tansu_available
from tests.up_service import Clients, ScaleOut, UpService, counted, write_config

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.kafka]
KILLS = 10
SHARD_KILLS = 3
MAX_IN_FLIGHT = 8  # the destinations' default


@pytest.fixture
def stack(tmp_path: Path, redis_servers: list[str]) -> Iterator[tuple[ScaleOut, RedisServer]]:
    """A broker, a Redis server of the test's own beside the shared one, a PostgreSQL schema."""
    require(tansu_available())
    require(redis_available())
    require(postgres_missing())
    with contextlib.ExitStack() as servers:
        broker = servers.enter_context(TansuBroker())
        shard = servers.enter_context(RedisServer())
        database = servers.enter_context(postgres_schema())
        store = redis_store_url([redis_servers[0], shard.url], redis_namespace())
        yield ScaleOut(broker.url, store, database), shard


def delivered(receiver: Receiver) -> int:
    return len(receiver.successes("/ok")) + len(receiver.successes("/flaky/1"))


def test_up_on_the_scale_out_stack_killed_stays_exact(
    tmp_path: Path, stack: tuple[ScaleOut, RedisServer]
) -> None:
    seed = int(os.environ.get("EXACTLY_TEST_SEED", "30"))
    print(f"seed {seed} (EXACTLY_TEST_SEED)")
    rng = random.Random(seed)
    backends, shard = stack
    cuts = tmp_path / "short-reads.txt"
    with Receiver() as receiver:
        config = write_config(tmp_path, receiver.url, scale_out=backends)
        service = UpService(config, tmp_path, env=short_reads.environment(0.2, cuts))
        try:
            clients = Clients(service.port, batches=150, size=20, pause=1.0)
            service.start()
            clients.start()
            after_work = 0
            shard_kills_at = set(rng.sample(range(1, KILLS), SHARD_KILLS))
            for kill in range(KILLS):
                began = time.monotonic()
                before = (counted(backends.database), delivered(receiver))
                if rng.random() < 0.3:
                    time.sleep(rng.uniform(1.0, 12.0))  # start-up: Spark, the queries' plans
                else:
                    while (counted(backends.database), delivered(receiver)) <= before:
                        assert time.monotonic() - began < 180, "no progress\n" + service.stderr()
                        assert service.process is not None and service.process.poll() is None, (
                            service.stderr()
                        )
                        time.sleep(0.2)
                    after_work += 1
                    if kill in shard_kills_at:  # while the pipeline claims ids on it
                        shard.restart()
                        time.sleep(rng.uniform(2.0, 6.0))
                    time.sleep(rng.uniform(0.0, 2.0))
                assert service.process is not None and service.process.poll() is None, (
                    service.stderr()
                )
                service.kill()
                print(
                    f"kill {kill + 1} after {time.monotonic() - began:.1f} s: "
                    f"{counted(backends.database)} counted, {delivered(receiver)} delivered"
                )
                service.start()
            assert clients.wait(600), "the clients could not send everything"
            wait_for_everything(service, receiver, clients, 400, backends.database)
            bound = KILLS * MAX_IN_FLIGHT
            check_exact(service, receiver, clients, bound, backends.database)
        finally:
            service.close()
    cut = short_reads.cuts(cuts)
    print(f"kills after work {after_work} of {KILLS}; shard restarts {SHARD_KILLS}; cuts {cut}")
    assert after_work >= KILLS // 2 + 1, "most kills must interrupt work"
    assert cut["raw"] + cut["events"] >= 20, cut  # the fault fired in the pipeline's readers
