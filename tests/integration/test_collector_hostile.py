"""Hostile and unlucky input on a real collector (issue 17): each request is answered with a clear
4xx for what it got wrong, its valid neighbours are taken, and nothing half-written is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from base64 import b64encode
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli_text import messages, said
from tests.conftest import require
from tests.integration.collector_server import KEYS, Collector, basic

WEB = basic(KEYS["web"])


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with Collector(tmp_path_factory.mktemp("hostile")) as running:
        yield running


@pytest.fixture(scope="module")
def client(collector: Collector) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=collector.url, timeout=30) as http:
        yield http


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def track(**fields: object) -> dict[str, object]:
    return {"type": "track", "event": "e", "userId": "u", "messageId": str(uuid.uuid4()), **fields}


def ids_in(collector: Collector) -> list[str]:
    return [json.loads(record.value)["messageId"] for record in collector.records()]


@pytest.mark.parametrize("levels", [253, 300, 1000])
def test_a_deeply_nested_event_is_rejected_alone(
    collector: Collector, client: httpx.Client, levels: int
) -> None:
    """orjson reads 1,024 levels but writes fewer: the one event is refused, its neighbour kept."""
    valid = track()
    nested_id = str(uuid.uuid4())
    body = (
        '{"batch":[' + json.dumps(valid) + ',{"type":"track","event":"e","userId":"u",'
        f'"messageId":"{nested_id}","properties":{{"x":{deep(levels)}}}}}]}}'
    )
    response = client.post("/v1/batch", content=body, auth=WEB)
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["accepted"] == 1
    assert document["rejected"][0]["index"] == 1
    assert document["rejected"][0]["code"] == "too_deep"
    single = client.post(
        "/v1/track",
        content='{"event":"e","userId":"u","properties":{"x":' + deep(levels) + "}}",
        auth=WEB,
    )
    assert single.status_code == 400, single.text
    assert single.json()["code"] == "too_deep"
    found = ids_in(collector)
    assert valid["messageId"] in found and nested_id not in found


def test_what_one_request_may_append_is_bounded_after_expansion(
    collector: Collector, client: httpx.Client
) -> None:
    """A batch-level context is copied into every event: a small body may not append megabytes."""
    context = {"blob": "c" * 30_000}
    events = [{"type": "track", "event": "e", "userId": "u"} for _ in range(2000)]
    body = json.dumps({"batch": events, "context": context})
    assert len(body) < 130_000  # 60 MB once the context is copied into each event
    before = len(collector.records())
    response = client.post("/v1/batch", content=body, auth=WEB)
    assert response.status_code == 413, response.text
    assert response.json()["code"] == "too_large"
    assert "after" in response.json()["message"]
    assert len(collector.records()) == before
    # the same context on a few events is fine
    fine = client.post("/v1/batch", json={"batch": events[:20], "context": context}, auth=WEB)
    assert fine.status_code == 200, fine.text


def refused(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``exactly ARGS`` expected to refuse at once; a collector that starts anyway is killed
    with its whole process group (workers and appenders), so a regression leaves nothing behind."""
    command = [sys.executable, "-m", "exactly", *args]
    with subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_a_record_limit_below_the_event_limit_is_refused_at_start(tmp_path: Path) -> None:
    env = {"EXACTLY_LOG__MAX_RECORD_BYTES": "8192", "EXACTLY_COLLECTOR__SOURCES": "web=k"}
    result = refused(["--data-dir", str(tmp_path), "collect", "--port", "0"], env)
    assert result.returncode == 1
    assert len(messages(result.stderr)) == 1 and "max_record_bytes" in said(result.stderr)
    assert "Traceback" not in result.stderr


def test_an_oversize_event_fails_alone_not_its_group(tmp_path: Path) -> None:
    """One event the log would refuse is rejected alone; concurrent requests are not failed."""
    env = {"EXACTLY_LOG__MAX_RECORD_BYTES": "10240", "EXACTLY_COLLECTOR__MAX_EVENT_BYTES": "9000"}
    with Collector(tmp_path, env=env) as small:
        big = track(properties={"p": "x" * 9500})
        statuses: list[int] = []
        answers: list[dict[str, object]] = []

        def send(body: dict[str, object]) -> None:
            response = httpx.post(f"{small.url}/v1/batch", json=body, auth=WEB, timeout=30)
            statuses.append(response.status_code)
            answers.append(response.json())

        threads = [threading.Thread(target=send, args=({"batch": [track()]},)) for _ in range(30)]
        threads.append(threading.Thread(target=send, args=({"batch": [big, track()]},)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert statuses.count(200) == 31, statuses
        assert sum(int(a["accepted"]) for a in answers) == 31  # type: ignore[call-overload]
        assert len(small.records()) == 31
        single = httpx.post(f"{small.url}/v1/track", json=big, auth=WEB)
        assert single.status_code == 413 and single.json()["code"] == "too_large"


def test_names_with_a_trailing_newline_are_refused_in_one_line(tmp_path: Path) -> None:
    for args, env in (
        (["collect", "--topic", "raw\n"], {"EXACTLY_COLLECTOR__SOURCES": "web=k"}),
        (["collect"], {"EXACTLY_COLLECTOR__SOURCES": "web\n=k"}),
        (["log", "create", "raw\n"], {}),
    ):
        port = ["--port", "0"] if args[0] == "collect" else []
        result = refused(["--data-dir", str(tmp_path), *args, *port], env)
        assert result.returncode != 0, (args, result.stdout)
        assert "Traceback" not in result.stderr, result.stderr
        assert len(messages(result.stderr)) == 1, result.stderr


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` read-only: a read-only bind mount as root (root ignores modes), else 0o500."""
    if os.geteuid() != 0:
        directory.chmod(0o500)
        try:
            yield
        finally:
            directory.chmod(0o700)
        return
    mounted = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(directory), str(directory)], capture_output=True
    )
    if mounted.returncode:  # a skip elsewhere, a failure under CI=true
        require(f"cannot make a read-only mount here: {mounted.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_read_only_data_dir_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps(track()) + "\n")
    exactly = [sys.executable, "-m", "exactly", "--data-dir", str(data)]
    subprocess.run([*exactly, "import", str(events), "--source", "web"], check=True)
    with read_only(data):
        for args in (
            ["import", str(events), "--source", "web"],
            ["log", "create", "other"],
            ["log", "read", "raw"],
        ):
            result = subprocess.run([*exactly, *args], capture_output=True, text=True, timeout=60)
            assert result.returncode == 1, (args, result.stderr)
            assert "Traceback" not in result.stderr, result.stderr
            assert len(messages(result.stderr)) == 1, result.stderr
            assert "does not exist" not in said(result.stderr), result.stderr  # it does: say why


def test_keys_on_the_command_line_are_not_needed(tmp_path: Path) -> None:
    """Write keys come from the config file or the environment, not argv (visible in ps)."""
    config = tmp_path / "exactly.toml"
    config.write_text('[collector.sources]\nweb = "from-file-key"\n')
    with Collector(tmp_path, sources={}, env={"EXACTLY_CONFIG": str(config)}) as running:
        argv = Path(f"/proc/{running.process.pid}/cmdline").read_bytes()  # type: ignore[union-attr]
        assert b"from-file-key" not in argv
        ok = httpx.post(f"{running.url}/v1/track", json=track(), auth=basic("from-file-key"))
        assert ok.status_code == 200, ok.text


def test_a_malformed_chunk_size_is_a_4xx(collector: Collector) -> None:
    with socket.create_connection(("127.0.0.1", collector.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
        )
        answer = sock.recv(4096)
    status = int(answer.split(b" ", 2)[1]) if answer else 400  # a closed connection is fine too
    assert 400 <= status < 500, answer


def test_sigterm_stops_within_a_deadline_despite_slow_clients(tmp_path: Path) -> None:
    running = Collector(tmp_path).start()
    slow = []
    try:
        for _ in range(3):  # clients that send half a body and then nothing
            sock = socket.create_connection(("127.0.0.1", running.port), timeout=10)
            sock.sendall(
                b"POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                b'Content-Type: application/json\r\n\r\n{"batch":['
            )
            slow.append(sock)
        time.sleep(0.5)
        started = time.monotonic()
        code = running.stop(timeout=40)
        took = time.monotonic() - started
    finally:
        for sock in slow:
            sock.close()
        running.kill()
    assert code == 0 and took < 15, (code, took)


def test_a_batch_of_integers_does_not_block_the_loop(
    collector: Collector, client: httpx.Client
) -> None:
    """Hostile batches are answered without stalling the other requests of the worker."""
    body = '{"batch":[' + ",".join(["1"] * 150_000) + "]}"
    assert len(body) < 500 * 1024
    probes: list[tuple[float, float]] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=collector.url, timeout=30) as other:
            while not done.is_set():
                started = time.perf_counter()
                other.get("/health")
                probes.append((started, time.perf_counter()))

    thread = threading.Thread(target=probe)
    thread.start()
    batches: list[tuple[float, float]] = []
    try:
        for _ in range(3):
            started = time.perf_counter()
            response = client.post("/v1/batch", content=body, auth=WEB)
            batches.append((started, time.perf_counter()))
            assert response.status_code == 400, response.text
            assert response.json()["code"] == "no_valid_events"
    finally:
        done.set()
        thread.join()

    # A worker that keeps the GIL while it checks a batch holds a probe for most of the batch's
    # time (ratio 0.5-1.0 idle, 0.15-0.25 s); one that lets others run answers it in 2-3 ms
    # (0.03-0.15). A probe is also held when the machine does not run the collector for a while
    # (a loaded machine: up to 0.7 seen), which can happen during any one batch but hardly each:
    # so the batch whose probes fared best is judged, against its own time.
    def longest_wait(batch: tuple[float, float]) -> float:
        return max(end - begin for begin, end in probes if begin < batch[1] and end > batch[0])

    ratios = [longest_wait(batch) / (batch[1] - batch[0]) for batch in batches]
    assert min(ratios) < 0.3, ratios


def test_a_client_over_its_source_rate_limit_gets_429_and_nothing_is_appended(
    tmp_path: Path,
) -> None:
    """A public key cannot flood its source: 429 with Retry-After past the burst, per client
    address and source; other sources keep their own (absent) limit."""
    env = {
        "EXACTLY_COLLECTOR__RATE_LIMITS": '{"web": 2}',
        "EXACTLY_COLLECTOR__RATE_LIMIT_BURST": "3",
    }
    with Collector(tmp_path, env=env) as limited, httpx.Client(base_url=limited.url) as http:
        sent = [track() for _ in range(6)]
        answers = [
            http.post("/v1/track", json=event, auth=WEB, headers={"Origin": "http://p.example"})
            for event in sent
        ]
        statuses = [answer.status_code for answer in answers]
        assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:], statuses
        refused = next(answer for answer in answers if answer.status_code == 429)
        assert refused.json()["code"] == "rate_limited"
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["access-control-allow-origin"] == "http://p.example"
        assert refused.headers["access-control-expose-headers"] == "retry-after"
        app = basic(KEYS["app"])
        for _ in range(6):
            assert http.post("/v1/track", json=track(), auth=app).status_code == 200
        time.sleep(1.0)
        assert http.post("/v1/track", json=track(), auth=WEB).status_code == 200
        taken = {e["messageId"] for e, a in zip(sent, answers, strict=True) if a.status_code == 200}
        found = set(ids_in(limited))
        assert taken <= found
        assert not ({event["messageId"] for event in sent} - taken) & found
        metrics = http.get("/metrics").text
        assert 'exactly_collector_events_rejected_total{reason="rate_limited"}' in metrics


def test_a_trickled_body_gets_408_at_the_body_deadline(tmp_path: Path) -> None:
    """One byte every half second never stalls a single read, yet the whole body has a deadline.

    The client is still trickling when the server answers and closes. A byte that reached the
    server after its last read would make its close a reset, and a reset throws away what the
    client had not read yet; the collector goes on reading after its answer (a lingering close),
    so the answer arrives every time.
    """
    env = {"EXACTLY_COLLECTOR__BODY_TIMEOUT": "2", "EXACTLY_COLLECTOR__READ_TIMEOUT": "5"}
    with Collector(tmp_path, env=env) as running:
        before = len(running.records())
        for _ in range(3):
            answer, took = _trickle(running.port)
            assert answer.startswith(b"HTTP/1.1 408"), (answer[:200], took)
            assert b"took more than 2 s" in answer and b"connection: close" in answer.lower()
            assert 1.5 < took < 4, took
        assert len(running.records()) == before


def _trickle(port: int) -> tuple[bytes, float]:
    """A body declared 1,000 bytes long, sent a byte every half second: the answer (empty if
    the connection closed without one) and the seconds it took."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/track HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
            b"Authorization: Basic " + b64encode(KEYS["web"].encode() + b":") + b"\r\n\r\n"
        )
        started = time.monotonic()
        sock.settimeout(0.5)
        while time.monotonic() - started < 8:
            with contextlib.suppress(OSError):
                sock.sendall(b" ")
            try:
                return sock.recv(4096), time.monotonic() - started  # b"": closed, no answer
            except TimeoutError:
                continue
            except OSError:  # reset
                return b"", time.monotonic() - started
    return b"", time.monotonic() - started


def test_an_answer_before_the_body_is_read_reaches_the_client(
    collector: Collector, client: httpx.Client
) -> None:
    """404 and 405 are answered before the body is read: the collector drains it first, or the
    client, still sending, gets a reset connection instead of the answer (1 in 30 did)."""
    body = b'{"batch":[' + b'{"type":"track","event":"e","userId":"u"},' * 9_000 + b"{}]}"
    statuses: Counter[int | str] = Counter()
    for method, path in [("PUT", "/v1/screen"), ("POST", "/nope")] * 100:
        try:
            statuses[client.request(method, path, content=body, auth=WEB).status_code] += 1
        except httpx.TransportError as error:
            statuses[type(error).__name__] += 1
    assert statuses == {405: 100, 404: 100}
