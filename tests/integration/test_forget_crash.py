"""Forgetting under SIGKILL.

One ``exactly forget`` killed after its regulation was committed to the log and before that
was synced (so before any reader could see it): run again, it goes on with that regulation.

Then people forgotten one after another while `exactly up` runs and
clients send, each ``exactly forget`` SIGKILLed at random points and run again, and `up`'s parts
(the pipeline, the director, the collector) SIGKILLed meanwhile: :data:`FORGET_KILLS` +
:data:`PART_KILLS` SIGKILLs in all.

Afterwards, with `up` stopped:

* every regulation is done (``exactly forget --status``), and no byte of the data dir holds
  any forgotten person's ids, traits or properties (every file read, gzip and Parquet opened);
* nobody else's event was lost or doubled: each reached the receiver, has one job per
  destination, is one row of the lake, and ``exactly audit`` recounts the aggregates exactly.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from exactly.forget.regulations import TOPIC
from exactly.log import open_log
from tests.integration.test_forget import exactly, lake_ids, post, post_once_up, traces
from tests.receiver import Receiver
from tests.seeds import crash_seed
from tests.up_service import Clients, UpService, write_config

ROOT = Path(__file__).resolve().parents[2]
PEOPLE = 4
FORGET_KILLS = 10  # of the forget command, at random points
PART_KILLS = 10  # of up's parts: the pipeline 3 times, the director 4, the collector 3
COMMANDS = {"pipeline": "pipeline", "director": "deliver", "collector": "collect"}  # their words


def person(n: int) -> tuple[str, tuple[str, ...]]:
    """Person ``n``'s userId and what their events carry that nobody else's does."""
    user = f"person-{n}-{'abcdef'[n]}91c7"
    return user, (user, f"person{n}@example.org", f"Person Number {n}x")


def their_events(n: int, count: int) -> list[dict[str, Any]]:
    user, (_, email, name) = person(n)
    return [
        {
            "messageId": f"p{n}-{k}-{os.urandom(6).hex()}",
            "type": ("identify", "track", "page")[k % 3],
            "userId": user,
            "event": "Order Completed",
            "traits": {"email": email, "name": name},
            "properties": {"revenue": 2, "contact": email},
        }
        for k in range(count)
    ]


def forget_killed(config: Path, user: str, rng: random.Random, kills: int, log: list[str]) -> None:
    """``exactly forget USER`` SIGKILLed ``kills`` times at random points, then run through."""
    env = {**os.environ, "EXACTLY_CONFIG": str(config), "PYTHONPATH": str(ROOT / "src")}
    killed = tries = 0
    while killed < kills:
        tries += 1
        assert tries <= 4 * kills, f"forget {user} ended before each kill: {log}"
        process = subprocess.Popen(
            [sys.executable, "-m", "exactly", "forget", user],
            cwd=config.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(rng.uniform(0.3, 3.0))  # its start, the 2 s wait, then its steps
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            killed += 1
            log.append(f"forget {user} killed")
        else:
            log.append(f"forget {user} ended first ({process.returncode})")
        process.wait(30)
    done = exactly(config, "forget", user, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


_HELD_FORGET = """
import os, sys, threading
from exactly.cli import main
from exactly.log import Log

real, append = os.fdatasync, Log.append

def held(fd):
    if threading.current_thread().name.startswith("log-sync-"):
        print("committed", flush=True)
        threading.Event().wait()  # killed here: the regulation committed, never synced
    real(fd)

def held_append(*args, **kwargs):  # the regulation's append (the topic exists already)
    os.fdatasync = held
    return append(*args, **kwargs)

Log.append = held_append
sys.argv = ["exactly", "forget", "--no-wait", sys.argv[1]]
main()
"""


def test_a_forget_killed_before_its_regulation_synced_goes_on_with_it_when_run_again(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/")
    env = {**os.environ, "EXACTLY_CONFIG": str(config), "PYTHONPATH": str(ROOT / "src")}
    user = person(0)[0]
    with open_log(f"sqlite://{(tmp_path / 'data' / 'log').resolve()}") as log:
        log.create_topic(TOPIC, 1)  # so the sync held is the regulation's
    held = subprocess.Popen(
        [sys.executable, "-c", _HELD_FORGET, user],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert held.stdout is not None
    try:
        assert held.stdout.readline().strip() == "committed"
    finally:
        os.killpg(held.pid, signal.SIGKILL)
        held.wait(30)

    with open_log(f"sqlite://{(tmp_path / 'data' / 'log').resolve()}") as log:
        assert log.end_offsets(TOPIC) == {0: 0}  # committed, not readable: never synced
    again = exactly(config, "forget", "--no-wait", user)
    assert again.returncode == 0, again.stderr
    assert "is under way: going on" in again.stderr, again.stderr
    status = exactly(config, "forget", "--status")
    heads = [line for line in status.stdout.splitlines() if line.startswith("regulation")]
    assert len(heads) == 1 and heads[0].endswith(" under way"), status.stdout


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_forgets_killed_beside_a_killed_pipeline_leave_nobody_and_lose_nothing(
    tmp_path: Path,
) -> None:
    rng = random.Random(f"forget-{crash_seed('29')}")
    data_dir = tmp_path / "data"
    with Receiver() as receiver:
        config = write_config(tmp_path, receiver.url)
        lake = data_dir / "lake" / "events"
        config.write_text(config.read_text() + f'\n[lake]\nurl = "delta://{lake}"\n')
        service = UpService(config, tmp_path)
        service.start()
        kills: list[str] = []
        try:
            post_once_up(service, their_events(0, 1))  # once up has started its collector
            theirs: list[dict[str, Any]] = []
            for n in range(PEOPLE):
                theirs += their_events(n, 8)
            post(service.port, theirs)
            others = Clients(service.port, batches=80, size=10, pause=0.3).start()
            ids = {event["messageId"] for event in theirs}
            deadline = time.monotonic() + 300
            while not (set(receiver.successes("/ok")) >= ids and lake_ids(data_dir) >= ids):
                assert time.monotonic() < deadline, service.stderr()[-3000:]
                time.sleep(1)

            stop = threading.Event()

            def kill_parts() -> None:
                # up gives a part up after 5 deaths in a row within 60 s of its start: at most
                # 4 kills each, the pipeline's spaced for it to start again
                left = {"pipeline": 3, "director": 4, "collector": 3}
                while left and not stop.is_set():
                    time.sleep(rng.uniform(3.0, 8.0))
                    part = rng.choice(sorted(left))
                    pid = service.part_pid(COMMANDS[part])
                    if pid is None:
                        continue  # restarting after the last kill
                    os.kill(pid, signal.SIGKILL)
                    kills.append(f"{part} killed")
                    left[part] -= 1
                    if not left[part]:
                        del left[part]

            killer = threading.Thread(target=kill_parts, daemon=True)
            killer.start()
            shares = [FORGET_KILLS // PEOPLE + (n < FORGET_KILLS % PEOPLE) for n in range(PEOPLE)]
            for n in range(PEOPLE):
                forget_killed(config, person(n)[0], rng, shares[n], kills)
            killer.join(300)
            stop.set()
            assert others.wait(300), "the clients could not send"
            deadline = time.monotonic() + 600
            while not (
                set(receiver.successes("/ok")) >= others.ids and lake_ids(data_dir) >= others.ids
            ):
                assert time.monotonic() < deadline, service.stderr()[-3000:]
                assert service.alive(), service.stderr()[-3000:]
                time.sleep(1)
            code, _ = service.terminate(timeout=120)
            assert code == 0, service.stderr()[-3000:]
        finally:
            service.kill()
        print(f"{len(kills)} events: {Counter(line.split(' ')[0] for line in kills)}: {kills}")
        assert sum("killed" in line for line in kills) >= FORGET_KILLS + PART_KILLS

        status = exactly(config, "forget", "--status")
        assert status.returncode == 0, status.stderr
        heads = [line for line in status.stdout.splitlines() if line.startswith("regulation")]
        assert len(heads) == PEOPLE and all(line.endswith(" done") for line in heads), heads
        for n in range(PEOPLE):
            assert traces(data_dir, person(n)[1]) == [], n
        assert lake_ids(data_dir) == others.ids  # each once: a set of every row's messageId
        from deltalake import DeltaTable

        rows = DeltaTable(str(lake)).to_pyarrow_table(columns=["messageId"]).num_rows
        assert rows == len(others.ids)
        assert set(receiver.successes("/ok")) >= others.ids
        audit = exactly(config, "audit")
        assert audit.returncode == 0, audit.stdout + audit.stderr
