"""``exactly deliver --metrics-port``: /metrics scraped while a real director delivers to a real
receiver; the figures move while it works and match what the receiver counted at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import DISCARDED, EXPIRED, SUCCEEDED, NewJob
from tests.cli_text import messages
from tests.receiver import Receiver
from tests.servers import free_port

Figures = dict[tuple[str, str], float]  # (sample name, destination) -> value


def scrape(port: int) -> Figures:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    figures: Figures = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "le" not in sample.labels:
                figures[(sample.name, sample.labels.get("destination", ""))] = sample.value
    return figures


def add(db: JobDB, name: str, url: str, count: int, *, expire: float = 600) -> list[str]:
    ids = [f"{name}-{n}" for n in range(count)]
    db.add(
        [
            NewJob(
                source="web",
                destination=name,
                payload=b'{"messageId":"%s"}' % message_id.encode(),
                message_id=message_id,
                expire_at=time.time() + expire,
            )
            for message_id in ids
        ],
        query_id=f"route-{name}",
        batch_id=0,
    )
    return ids


@pytest.fixture
def director_config(tmp_path: Path) -> Iterator[tuple[Path, str, Receiver, int]]:
    with Receiver(delay=0.01) as receiver:
        closed = free_port()
        urls = {
            "hook": f"{receiver.url}/scripted",
            "refusing": f"{receiver.url}/status/400",
            "gone": f"http://127.0.0.1:{closed}/in",
        }
        text = f'data_dir = "{tmp_path / "data"}"\n'
        for name, url in urls.items():
            text += (
                f'[[destinations]]\nname = "{name}"\nurl = "{url}"\ntimeout = "1s"\n'
                'max_in_flight = 4\n[destinations.backoff]\nmin = "50ms"\nmax = "200ms"\n'
            )
        path = tmp_path / "exactly.toml"
        path.write_text(text)
        yield path, f"sqlite://{tmp_path / 'jobdb'}", receiver, closed


def test_metrics_move_while_delivering_and_match_the_receiver(
    director_config: tuple[Path, str, Receiver, int],
) -> None:
    path, jobdb, receiver, closed = director_config
    with open_jobdb(jobdb) as db:
        hook = add(db, "hook", f"{receiver.url}/scripted", 1200)
        add(db, "refusing", f"{receiver.url}/status/400", 20)
        add(db, "gone", f"http://127.0.0.1:{closed}/in", 5, expire=1.5)
    receiver.failures = {message_id: 1 for message_id in hook[::10]}  # 120 fail once
    port = free_port()
    command = [sys.executable, "-m", "exactly", "--config", str(path), "deliver"]
    process = subprocess.Popen(
        [*command, "--jobdb", jobdb, "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ},
    )
    try:
        seen: list[Figures] = []
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                figures = scrape(port)
            except OSError:
                assert process.poll() is None, process.stderr.read().decode()  # type: ignore[union-attr]
                time.sleep(0.05)
                continue
            seen.append(figures)
            if figures.get(("exactly_delivery_succeeded_total", "hook")) == 1200 and figures.get(
                ("exactly_delivery_expired_total", "gone")
            ):
                time.sleep(1.2)  # one more gauge refresh
                seen.append(scrape(port))
                break
            time.sleep(0.1)
        final = seen[-1]
        # the numbers moved: some scrapes caught the hook part-way, with a queue
        succeeded = [f.get(("exactly_delivery_succeeded_total", "hook"), 0) for f in seen]
        assert (
            succeeded == sorted(succeeded) and final[("exactly_delivery_succeeded_total", "hook")]
        )
        assert any(0 < n < 1200 for n in succeeded), succeeded
        assert any(f.get(("exactly_delivery_queued", "hook"), 0) > 0 for f in seen)
        assert any(f.get(("exactly_delivery_oldest_queued_seconds", "hook"), 0) > 0 for f in seen)
        # and match the receiver
        hook_requests = [r for r in receiver.requests if r.path == "/scripted"]
        successes = [r for r in hook_requests if r.status == 200]
        assert final[("exactly_delivery_requests_total", "hook")] == len(hook_requests) == 1320
        assert final[("exactly_delivery_succeeded_total", "hook")] == len(successes) == 1200
        assert final[("exactly_delivery_retried_total", "hook")] == 120
        assert final[("exactly_delivery_request_seconds_count", "hook")] == 1320
        assert final[("exactly_delivery_request_seconds_sum", "hook")] >= 1320 * 0.01
        refused = [r for r in receiver.requests if r.path == "/status/400"]
        assert final[("exactly_delivery_requests_total", "refusing")] == len(refused) == 20
        assert final[("exactly_delivery_discarded_total", "refusing")] == 20
        assert final[("exactly_delivery_expired_total", "gone")] == 5
        # each request to the closed port ended retried, or expired when its retry fell too late
        gone_requests = final[("exactly_delivery_requests_total", "gone")]
        assert final[("exactly_delivery_retried_total", "gone")] <= gone_requests
        for name in ("hook", "refusing", "gone"):
            assert final[("exactly_delivery_queued", name)] == 0
            assert final[("exactly_delivery_in_flight", name)] == 0
            assert final[("exactly_delivery_retrying", name)] == 0
        assert final[("exactly_delivery_jobdb_datasets", "")] == 1
        with open_jobdb(jobdb) as db:
            assert db.states() == {
                "hook": {SUCCEEDED: 1200},
                "refusing": {DISCARDED: 20},
                "gone": {EXPIRED: 5},
            }
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()
    assert "hook: 1,320 requests, 1,200 succeeded, 120 to retry" in out.decode()


def test_a_metrics_port_in_use_stops_deliver_with_one_line(
    director_config: tuple[Path, str, Receiver, int],
) -> None:
    path, jobdb, _, _ = director_config
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "exactly", "--config", str(path), "deliver"]
        done = subprocess.run(
            [*command, "--jobdb", jobdb, "--metrics-port", str(port)],
            capture_output=True,
            timeout=60,
            env={**os.environ},
        )
    assert done.returncode != 0
    lines = messages(done.stderr.decode())
    assert lines == [f"error: cannot serve metrics on 127.0.0.1:{port}: the port is in use"]
