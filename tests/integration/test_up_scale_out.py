"""``exactly up`` on the scale-out stack, SIGKILLed as a whole and its Redis shard restarted empty.

The backends an operator scales out to: the log on a Kafka-protocol broker (Tansu), the redis
dedupe store over two servers, the aggregates and the JobDB in PostgreSQL. Clients send through
the collector and retry as SDKs do. Meanwhile:

* ``up``'s whole process group is SIGKILLed 10 times: 7 kills come once this run has been seen
  to work (events counted or delivered since it started) and a micro-batch of its own is in
  flight, 0 to 0.5 s later, the other 3 at a random moment of its start (Spark starting,
  queries planning); each of the 7 must find work in flight (a micro-batch of the run's own
  not committed, or a request the receiver got from it whose outcome the JobDB does not hold);
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

import time
from pathlib import Path

import pytest

from tests import short_reads
from tests.integration.test_up import check_exact, wait_for_everything
from tests.receiver import Receiver
from tests.seeds import crash_rng
from tests.servers import RedisServer
from tests.up_service import (
    Clients,
    Stack,
    UpService,
    WorkInFlight,
    counted,
    kill_on_progress,
    spark_failures,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.kafka]
KILLS = 10
STARTUP_KILLS = 3  # at a random moment of the start; the others once this run has worked
SHARD_RESTARTS = (1, 3, 5)  # before these kills after work
MAX_IN_FLIGHT = 8  # the destinations' default


def delivered(receiver: Receiver) -> int:
    return len(receiver.successes("/ok")) + len(receiver.successes("/flaky/1"))


@pytest.mark.timeout(1200)  # 10 kills, each a restart of up: 6 minutes in CI, 10 on a slow machine
def test_up_on_the_scale_out_stack_killed_stays_exact(
    tmp_path: Path, scale_out: tuple[Stack, RedisServer]
) -> None:
    rng = crash_rng("up-scale-out", "30")
    backends, shard = scale_out
    cuts = tmp_path / "short-reads.txt"
    with Receiver() as receiver:
        config = write_config(tmp_path, receiver.url, scale_out=backends)
        service = UpService(config, tmp_path, env=short_reads.environment(0.2, cuts))
        try:
            clients = Clients(service.port, batches=60, size=20, pause=1.0, more=True)
            service.start()
            clients.start()
            works = 0

            def restart_shard(_: int) -> None:
                nonlocal works
                works += 1
                if works in SHARD_RESTARTS:  # while the pipeline claims ids on it
                    shard.restart()
                    time.sleep(rng.uniform(2.0, 6.0))

            paths = {"all": "/ok", "orders": "/flaky/1"}
            work = WorkInFlight(tmp_path / "data", backends.jobdb_url, receiver, paths)
            landings = kill_on_progress(
                service,
                rng,
                kills=KILLS,
                at_start=STARTUP_KILLS,
                progress=lambda: (counted(backends.database), delivered(receiver)),
                work=work,
                on_work=restart_shard,
            )
            clients.enough()  # they sent past the kills
            assert clients.wait(600), "the clients could not send everything"
            wait_for_everything(service, receiver, clients, 400, backends.database)
            bound = KILLS * MAX_IN_FLIGHT
            check_exact(service, receiver, clients, bound, backends.database)
        finally:
            service.close()
    cut = short_reads.cuts(cuts)
    print(f"cuts {cut}")
    assert len(landings.kills) == KILLS - STARTUP_KILLS
    landings.check(least=1.0)  # each kill after start-up found work in flight
    assert shard.restarts == len(SHARD_RESTARTS)
    assert not spark_failures(tmp_path / "data"), spark_failures(tmp_path / "data")[:3]
    assert cut["raw"] + cut["events"] >= 20, cut  # the fault fired in the pipeline's readers
