"""``exactly up``: the whole pipeline as one service, crashed, stopped and restarted.

Real parts throughout: ``exactly up`` as a process group (collector, one Spark application with
the dedupe, aggregate and route queries, the director), clients that retry as SDKs do, a real
HTTP receiver for two destinations, and ``exactly audit`` (a batch recount) at the end; with a
lake on moto's S3 (Delta, Iceberg), ``up`` killed inside a micro-batch of the lake query.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.archives import MotoServer
from tests.batches_in_flight import Checkpoints, find
from tests.lake_tables import S3_CASES, lake_url
from tests.receiver import Receiver
from tests.seeds import crash_rng
from tests.up_service import (
    ROOT,
    Clients,
    UpService,
    WorkInFlight,
    counted,
    kill_on_progress,
    spark_failures,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def service(tmp_path: Path, receiver: Receiver) -> Iterator[UpService]:
    running = UpService(write_config(tmp_path, receiver.url), tmp_path)
    try:
        yield running
    finally:
        running.close()


def wait_for_everything(
    service: UpService,
    receiver: Receiver,
    clients: Clients,
    timeout: float = 240,
    aggregates: str | None = None,
) -> None:
    """Until every event is counted (in the data dir, or the ``aggregates`` database) and has
    reached every destination it matches."""
    data: Path | str = aggregates or service.directory / "data"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivered = set(receiver.successes("/ok")) >= clients.ids
        orders = set(receiver.successes("/flaky/1")) >= clients.orders
        if delivered and orders and counted(data) >= len(clients.ids):
            return
        assert service.process is not None and service.process.poll() is None, service.stderr()
        time.sleep(0.5)
    raise AssertionError(
        f"not everything arrived: counted {counted(data)} of {len(clients.ids)}, "
        f"{len(set(receiver.successes('/ok')) & clients.ids)} delivered to 'all'\n"
        + service.stderr()[-3000:]
    )


def check_exact(
    service: UpService,
    receiver: Receiver,
    clients: Clients,
    in_flight: int,
    aggregates: str | None = None,
) -> None:
    """Audit exact, each event counted once, each destination got each event it matches."""
    data: Path | str = aggregates or service.directory / "data"
    assert counted(data) == len(clients.ids), "an event counted twice or not at all"
    audit = subprocess.run(
        [sys.executable, "-m", "exactly", "audit"],
        cwd=service.directory,
        env={**os.environ, "EXACTLY_CONFIG": str(service.config), "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
    for path, wanted in (("/ok", clients.ids), ("/flaky/1", clients.orders)):
        got = receiver.successes(path)
        assert set(got) == wanted, f"{path}: missing {len(wanted - set(got))}"
        copies = sum(got.values()) - len(got)
        print(f"{path}: {len(got)} events, {copies} extra copies (bound {in_flight})")
        assert copies <= in_flight, f"{path}: {copies} extra copies, bound {in_flight}"


def test_up_runs_restarts_a_part_and_stops_on_sigterm(
    service: UpService, receiver: Receiver
) -> None:
    service.start()
    clients = Clients(service.port, batches=12).start()
    assert clients.wait(180), "the clients could not send"
    wait_for_everything(service, receiver, clients)

    # One part crashing: the pipeline's process is killed; up restarts it, the collector goes on.
    pipeline = service.part_pid("pipeline")
    assert pipeline is not None
    os.kill(pipeline, 9)
    more = Clients(service.port, batches=6, prefix="more")
    more.start()
    assert more.wait(60), "the collector stopped accepting while the pipeline restarted"
    assert more.refused == 0, "the collector refused events while another part restarted"
    deadline = time.monotonic() + 60
    while "pipeline died" not in service.stderr() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "pipeline died (signal 9)" in service.stderr(), service.stderr()
    everyone = Clients(service.port, batches=0)
    everyone.sent = clients.sent + more.sent
    wait_for_everything(service, receiver, everyone)

    # SIGTERM while clients send: exit 0 within 30 s; what was acknowledged survives a restart.
    late = Clients(service.port, batches=30, pause=0.1, prefix="late")
    late.start()
    time.sleep(2)
    code, seconds = service.terminate()
    assert code == 0, service.stderr()
    assert seconds <= 30, f"stopping took {seconds:.1f} s"
    assert 0 < late.accepted < len(late.sent), "the stop did not come while clients sent"
    service.start()  # the clients go on retrying what was not acknowledged, as SDKs do
    assert late.wait(180), "the clients could not send after the restart"
    everyone.sent += late.sent
    wait_for_everything(service, receiver, everyone)
    check_exact(service, receiver, everyone, in_flight=0)


KILLS = 10
STARTUP_KILLS = 3  # at a random moment of the start; the others once this run has worked


@pytest.mark.timeout(1200)  # 10 kills, each a restart of up: 6 minutes in CI, 10 on a slow machine
def test_up_killed_at_random_points_stays_exact(service: UpService, receiver: Receiver) -> None:
    """SIGKILL up's whole process group 10 times while clients send; nothing lost or doubled.

    Seven kills come once this run was seen to count or deliver events and a micro-batch of its
    own is in flight (0 to 0.5 s after), three at a random moment of its start. Each of the
    seven must find work in flight when it lands: a micro-batch of the run's own not committed,
    or a request the receiver got from it whose outcome the JobDB does not hold."""
    rng = crash_rng("up-crash", "14")
    clients = Clients(service.port, batches=60, size=20, pause=1.0, more=True)  # past the kills
    service.start()
    clients.start()
    data = service.directory / "data"
    work = WorkInFlight(
        data, f"sqlite://{data / 'jobdb'}", receiver, {"all": "/ok", "orders": "/flaky/1"}
    )
    landings = kill_on_progress(
        service,
        rng,
        kills=KILLS,
        at_start=STARTUP_KILLS,
        progress=lambda: (counted(data), len(receiver.successes("/ok"))),
        work=work,
    )
    clients.enough()
    assert len(landings.kills) == KILLS - STARTUP_KILLS
    landings.check(least=1.0)  # each kill after start-up found work in flight
    assert clients.wait(600), "the clients could not send everything"
    wait_for_everything(service, receiver, clients, timeout=300)
    # a request in flight at each kill may be sent again: at most max_in_flight (8) per kill
    check_exact(service, receiver, clients, in_flight=KILLS * 8)
    assert not spark_failures(data), spark_failures(data)[:3]


@pytest.mark.parametrize("case", S3_CASES)
def test_up_killed_inside_a_lake_batch_on_s3_lands_each_event_once(
    tmp_path: Path, receiver: Receiver, moto_s3: MotoServer, case: str
) -> None:
    """SIGKILL up's whole process group once the lake query (Delta or Iceberg on moto's S3) has
    a micro-batch of its own in flight, start it again: the table holds each event once."""
    from exactly.lake import open_table

    with lake_url(case, tmp_path, moto_s3) as lake:
        config = write_config(tmp_path, receiver.url)
        config.write_text(config.read_text() + f'\n[lake]\nurl = "{lake}"\n')
        service = UpService(config, tmp_path)
        checkpoints = tmp_path / "data" / "checkpoints"
        lake_batches = Checkpoints(
            lambda: {name: path for name, path in find(checkpoints).items() if "lake" in name}
        )
        try:
            clients = Clients(service.port, batches=40, size=20, pause=0.5)
            lake_batches.run_starts()
            service.start()
            clients.start()
            assert lake_batches.wait_for_batch(300, service.alive), service.stderr()
            service.kill()  # at once: a lake batch takes far longer than one poll (10 ms)
            landing = lake_batches.landing()
            print(f"{case}: up killed {landing}")
            assert landing.inside, "the kill did not land inside a lake micro-batch"
            service.start()
            assert clients.wait(300), "the clients could not send everything"
            deadline = time.monotonic() + 300
            with open_table(lake) as table:
                landed = table.read().column("messageId").to_pylist()
                while len(landed) < len(clients.ids):
                    assert time.monotonic() < deadline, f"{len(landed)} of {len(clients.ids)}"
                    assert service.alive(), service.stderr()
                    time.sleep(1)
                    landed = table.read().column("messageId").to_pylist()
        finally:
            service.close()
    assert sorted(landed) == sorted(clients.ids), "an event is in the lake twice or not at all"
