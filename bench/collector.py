"""Durable throughput and latency of the collector, beside a naive baseline run alongside.

    .venv/bin/python bench/collector.py [--seconds 10] [--workers 1] [--server granian|uvicorn]
                                        [--skip-baseline]

The collector runs as ``exactly collect`` (or under uvicorn with ``--server uvicorn``, to compare
ASGI servers) with an embedded sqlite log in a temporary directory. The load generator is another
process (``bench/collector.py loadgen``, asyncio + uvloop over keep-alive HTTP/1.1 connections).
Scenarios, each for ``--seconds``:

* ``/v1/batch``, 100 events of ~300 B per request, closed loop: the maximum durable events/s;
* ``/v1/track``, one event per request, closed loop: the maximum requests/s;
* both again open loop at half the maximum rate: p50 / p99 latency counted from each request's
  scheduled send time (no coordinated omission).

``bench/collector.py json`` times the JSON libraries on the collector's work instead. Every event
has a unique messageId. After the collector's runs the log is read: every event
answered 200 must be in ``raw`` (checked, not assumed). The baseline is the usual first attempt:
FastAPI under uvicorn, stdlib ``json``, one SQLite commit (WAL, ``synchronous=FULL``) per request.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

WRITE_KEY = "bench-key"
EVENTS_PER_BATCH = 100
RUDDERSTACK_GATEWAY = 1_700  # events/s, published figure for a 2-core m5.large

_EVENT_HEAD = b'{"type":"track","event":"Order Completed","userId":"user-1234","messageId":"'
_EVENT_TAIL = (
    b'","timestamp":"2024-05-01T12:00:00.000Z","properties":{"revenue":12.5,"currency":"EUR",'
    b'"sku":"sku-123","plan":"pro","coupon":null},"context":{"library":{"name":"analytics-python"'
    b',"version":"2.4.0"},"ip":"10.0.0.1","locale":"en-GB","page":{"path":"/checkout"}}}'
)


# -- load generator (its own process) -------------------------------------------------------------


class Bodies:
    """Request bodies with unique messageIds: ``batch`` of 100 events or one ``track`` event.

    A template is built once; each body is a copy with a fresh counter written into each
    messageId slot, so the load generator spends its CPU on the requests, not on JSON.
    """

    def __init__(self, kind: str) -> None:
        self.events = 1 if kind == "track" else EVENTS_PER_BATCH
        prefix = os.urandom(6).hex().encode() + b"-"
        slot = b"0" * 10
        events = [_EVENT_HEAD + prefix + slot + _EVENT_TAIL for _ in range(self.events)]
        if kind == "track":
            self.template = events[0]
        else:
            self.template = b'{"sentAt":"2024-05-01T12:00:01.000Z","batch":[%s]}' % b",".join(
                events
            )
        self.slots = []
        at = 0
        while (found := self.template.find(prefix, at)) >= 0:
            self.slots.append(found + len(prefix))
            at = found + 1
        self.counter = 0

    def next(self) -> tuple[bytes, int]:
        body = bytearray(self.template)
        for slot in self.slots:
            self.counter += 1
            body[slot : slot + 10] = b"%010d" % self.counter
        return bytes(body), self.events


async def _connection(
    port: int, path: str, bodies: Bodies, slots: asyncio.Queue[float] | None, deadline: float,
    result: dict[str, Any],
) -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = base64.b64encode(f"{WRITE_KEY}:".encode())
    head = b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n" % path.encode()
    head += b"Authorization: Basic %s\r\n" % auth
    latencies: list[float] = result["latencies"]
    statuses: dict[int, int] = result["statuses"]
    try:
        while True:
            if slots is None:
                scheduled = time.perf_counter()
                if scheduled >= deadline:
                    return
            else:
                scheduled = await slots.get()
                if scheduled < 0:
                    return
            body, events = bodies.next()
            writer.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
            response = await reader.readuntil(b"\r\n\r\n")
            status = int(response[9:12])
            length = 0
            for line in response.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - scheduled)
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                result["events_ok"] += events
    finally:
        writer.close()


async def _schedule(
    slots: asyncio.Queue[float], rate: float, deadline: float, workers: int
) -> None:
    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) < deadline:
        due = int((now - start) * rate) + 1  # slot n is due at start + n / rate
        for n in range(sent, due):
            slots.put_nowait(start + n / rate)
        sent = max(sent, due)
        await asyncio.sleep(0.0005)
    for _ in range(workers):
        slots.put_nowait(-1.0)


async def _load(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"latencies": [], "statuses": {}, "events_ok": 0}
    bodies = Bodies(args.kind)
    path = "/v1/batch" if args.kind == "batch" else "/v1/track"
    started = time.perf_counter()
    deadline = started + args.seconds
    slots: asyncio.Queue[float] | None = None
    tasks = []
    if args.rate:
        slots = asyncio.Queue()
        tasks.append(_schedule(slots, args.rate, deadline, args.connections))
    tasks += [
        _connection(args.port, path, bodies, slots, deadline, result)
        for _ in range(args.connections)
    ]
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    latencies = sorted(result.pop("latencies"))
    count = len(latencies)
    return {
        **result,
        "requests": count,
        "seconds": elapsed,
        "requests_per_second": count / elapsed,
        "events_per_second": result["events_ok"] / elapsed,
        "p50_ms": latencies[count // 2] * 1000 if count else None,
        "p99_ms": latencies[min(count - 1, int(count * 0.99))] * 1000 if count else None,
    }


def loadgen(args: argparse.Namespace) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_load(args))))


# -- the naive baseline (its own process) ---------------------------------------------------------


def baseline(args: argparse.Namespace) -> None:
    """FastAPI + stdlib json + one SQLite commit per request, under uvicorn."""
    import sqlite3
    import threading
    import uuid

    import uvicorn
    from fastapi import FastAPI, HTTPException, Request

    globals()["Request"] = Request  # FastAPI resolves the endpoints' string annotations here
    app = FastAPI()
    local = threading.local()
    expected = "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()

    def connection() -> sqlite3.Connection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = sqlite3.connect(args.db, timeout=60)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("CREATE TABLE IF NOT EXISTS raw (message_id TEXT, event TEXT)")
        return conn

    def store(request: Request, events: list[dict[str, Any]]) -> dict[str, Any]:
        if request.headers.get("authorization") != expected:
            raise HTTPException(401, "unknown write key")
        rows = [(e.get("messageId") or str(uuid.uuid4()), json.dumps(e)) for e in events]
        conn = connection()
        conn.executemany("INSERT INTO raw VALUES (?, ?)", rows)
        conn.commit()
        return {"success": True}

    @app.post("/v1/batch")
    def batch(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return store(request, body["batch"])

    @app.post("/v1/track")
    def track(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return store(request, [body])

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


# -- JSON libraries -------------------------------------------------------------------------------


def json_libraries(repeat: int = 2000) -> str:
    """Decode a 100-event batch body, encode its 100 events: orjson, msgspec, stdlib json."""
    import timeit

    import msgspec
    import orjson

    body, _ = Bodies("batch").next()
    events = orjson.loads(body)["batch"]
    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()
    cases = {
        "orjson": (lambda: orjson.loads(body), lambda: [orjson.dumps(e) for e in events]),
        "msgspec": (lambda: decoder.decode(body), lambda: [encoder.encode(e) for e in events]),
        "json (stdlib)": (lambda: json.loads(body), lambda: [json.dumps(e) for e in events]),
    }
    lines = [
        "| library | decode a 100-event batch (µs) | encode 100 events (µs) |",
        "| --- | ---: | ---: |",
    ]
    for name, (decode, encode) in cases.items():
        times = [
            min(timeit.repeat(f, number=repeat, repeat=5)) / repeat * 1e6 for f in (decode, encode)
        ]
        lines.append(f"| {name} | {times[0]:.0f} | {times[1]:.0f} |")
    return "\n".join(lines)


# -- orchestration --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the server did not answer /health")


def start_server(
    system: str,
    args: argparse.Namespace,
    workdir: Path,
    port: int,
    extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(extra or {})}
    if system == "baseline":
        command = [python, __file__, "baseline", "--port", str(port), "--db", str(workdir / "b.db")]
    elif args.server == "uvicorn":
        from exactly.collector.settings import CollectorSettings, parse_source

        settings = CollectorSettings(
            log_url=f"sqlite://{workdir / 'log'}", sources=(parse_source(f"bench={WRITE_KEY}"),)
        )
        from exactly.log import open_log

        with open_log(settings.log_url) as log:
            log.create_topic("raw", settings.partitions, exist_ok=True)
        env.update(settings.to_environment())
        command = [
            python, "-m", "uvicorn", "--factory", "exactly.collector.app:from_environment",
            "--port", str(port), "--loop", "uvloop", "--http", "httptools",
            "--no-access-log", "--log-level", "warning", "--workers", str(args.workers),
        ]  # fmt: skip
    else:
        command = [
            python, "-m", "exactly", "--data-dir", str(workdir), "collect", "--port", str(port),
            "--workers", str(args.workers),
        ]  # fmt: skip
        env["EXACTLY_COLLECTOR__SOURCES"] = f"bench={WRITE_KEY}"
    process = subprocess.Popen(command, env=env, start_new_session=True, cwd=workdir)
    wait_healthy(port, process)
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_load(
    port: int, kind: str, seconds: float, connections: int, rate: float = 0
) -> dict[str, Any]:
    command = [
        sys.executable, __file__, "loadgen", "--port", str(port), "--kind", kind,
        "--seconds", str(seconds), "--connections", str(connections), "--rate", str(rate),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def logged_events(workdir: Path) -> int:
    from exactly.log import open_log

    with open_log(f"sqlite://{workdir / 'log'}") as log:
        return sum(log.end_offsets("raw").values())


def measure(system: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix=f"bench-{system}-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        process = start_server(system, args, workdir, port)
        try:
            for kind, connections in (
                ("batch", args.batch_connections),
                ("track", args.track_connections),
            ):
                peak = run_load(port, kind, args.seconds, connections)
                half = peak["requests_per_second"] / 2
                results[f"{kind} max"] = peak
                results[f"{kind} half"] = run_load(port, kind, args.seconds, connections, half)
                print(f"{system} {kind}: {json.dumps(results[f'{kind} max'])}", file=sys.stderr)
                print(
                    f"{system} {kind} half: {json.dumps(results[f'{kind} half'])}", file=sys.stderr
                )
        finally:
            stop(process)
        if system == "exactly":
            answered = sum(result["events_ok"] for result in results.values())
            stored = logged_events(workdir)
            assert stored >= answered, f"{answered} events answered 200 but {stored} in the log"
            results["check"] = {"answered": answered, "stored": stored}
    return results


KINDS = {"batch": 8, "track": 32}  # closed-loop connections of each scenario


def front_cost(args: argparse.Namespace) -> str:
    """The connection front's cost: the same collector with ``max_connections_per_address`` 0
    (granian on the port) and 256 (the front on the port, granian behind it), both started
    once, loaded in turn round after round; closed-loop events/s of each, and the ratio
    front / direct per round (pairing keeps it meaningful on a noisy machine; the one loaded first
    alternates); and the CPU seconds each server's processes used per event, which other load on
    the machine moves much less than it moves throughput."""
    import statistics

    modes = {"direct": "0", "front": "256"}
    rates: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in KINDS}
    cpu: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in KINDS}
    with tempfile.TemporaryDirectory(prefix="bench-front-") as tmp:
        servers = {}
        try:
            for mode, cap in modes.items():
                workdir = Path(tmp) / mode
                workdir.mkdir()
                port = free_port()
                extra = {"EXACTLY_COLLECTOR__MAX_CONNECTIONS_PER_ADDRESS": cap}
                servers[mode] = (port, start_server("exactly", args, workdir, port, extra))
            for round_ in range(args.rounds):
                order = list(servers.items())[:: 1 if round_ % 2 == 0 else -1]
                for kind, connections in KINDS.items():
                    for mode, (port, process) in order:
                        before = group_cpu(process.pid)
                        load = run_load(port, kind, args.seconds, connections)
                        used = group_cpu(process.pid) - before
                        rates[kind][mode].append(load["events_per_second"])
                        events = load["events_per_second"] * load.get("seconds", args.seconds)
                        cpu[kind][mode].append(1e6 * used / max(events, 1))
        finally:
            for _, process in servers.values():
                stop(process)
    lines = [
        "| scenario | direct events/s (median) | front events/s (median) | front / direct, "
        "per round | median |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for kind, by_mode in rates.items():
        ratios = [f / d for f, d in zip(by_mode["front"], by_mode["direct"], strict=True)]
        lines.append(
            f"| {kind} max | {statistics.median(by_mode['direct']):,.0f} | "
            f"{statistics.median(by_mode['front']):,.0f} | "
            f"{', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |"
        )
    lines += [
        "",
        "| scenario | direct CPU us/event (median) | front CPU us/event (median) | front / direct, "
        "per round | median |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for kind, by_mode in cpu.items():
        ratios = [f / d for f, d in zip(by_mode["front"], by_mode["direct"], strict=True)]
        lines.append(
            f"| {kind} max | {statistics.median(by_mode['direct']):.1f} | "
            f"{statistics.median(by_mode['front']):.1f} | "
            f"{', '.join(f'{r:.2f}' for r in ratios)} | {statistics.median(ratios):.2f} |"
        )
    return "\n".join(lines)


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the processes of group ``pgid`` (the server:
    its workers, appenders and front), counting only those still running."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def profile(args: argparse.Namespace) -> str:
    """Where the collector's Python time goes under the closed-loop ``/v1/batch`` load: py-spy
    samples of the threads holding the GIL in the server's processes (its appender included),
    summed per function: self time and total, in % of the samples."""
    import collections
    import shutil

    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("profile needs py-spy: .venv/bin/pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        process = start_server("exactly", args, workdir, port)
        raw = workdir / "samples.txt"
        try:
            record = ["record", "--pid", str(process.pid), "--subprocesses", "--gil"]
            record += ["--rate", "200"]
            spying = subprocess.Popen(
                [
                    spy,
                    *record,
                    "--duration",
                    str(int(args.seconds)),
                    "--format",
                    "raw",
                    "-o",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            load = run_load(port, "batch", args.seconds, args.batch_connections)
            spying.wait(timeout=args.seconds + 60)
        finally:
            stop(process)
        own: collections.Counter[str] = collections.Counter()
        total: collections.Counter[str] = collections.Counter()
        samples = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [
                re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith("process ")
            ]
            if not frames:
                continue
            samples += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                total[frame] += int(count)
    lines = [
        f"/v1/batch closed loop: {load['events_per_second']:,.0f} events/s during the profile; "
        f"{samples:,} samples of GIL holders at 200 Hz over {args.seconds:.0f} s, all processes",
        "",
        "| function | self % | total % |",
        "| --- | ---: | ---: |",
    ]
    for frame, count in own.most_common(args.top):
        lines.append(
            f"| `{frame}` | {100 * count / samples:.1f} | {100 * total[frame] / samples:.1f} |"
        )
    return "\n".join(lines)


def table(runs: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = [
        "| system | scenario | events/s | requests/s | p50 ms | p99 ms | non-200 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, results in runs.items():
        for scenario, r in results.items():
            if scenario == "check":
                continue
            errors = sum(count for status, count in r["statuses"].items() if str(status) != "200")
            lines.append(
                f"| {system} | {scenario} | {r['events_per_second']:,.0f} | "
                f"{r['requests_per_second']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{errors} |"
            )
    lines.append(
        f"| RudderStack gateway (published, 2-core m5.large) | batch | {RUDDERSTACK_GATEWAY:,} "
        "| | | | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("loadgen")
    gen.add_argument("--port", type=int, required=True)
    gen.add_argument("--kind", choices=["batch", "track"], required=True)
    gen.add_argument("--seconds", type=float, default=10)
    gen.add_argument("--connections", type=int, default=16)
    gen.add_argument("--rate", type=float, default=0, help="requests/s (open loop); 0: closed loop")
    base = sub.add_parser("baseline")
    base.add_argument("--port", type=int, required=True)
    base.add_argument("--db", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--server", choices=["granian", "uvicorn"], default="granian")
    parser.add_argument("--batch-connections", type=int, default=8)
    parser.add_argument("--track-connections", type=int, default=32)
    parser.add_argument("--skip-baseline", action="store_true")
    sub.add_parser("json", help="compare JSON libraries on the collector's work")
    front = sub.add_parser("front", help="the connection front's cost, beside granian direct")
    front.add_argument("--rounds", type=int, default=5)
    spy = sub.add_parser("profile", help="py-spy the collector under the /v1/batch load")
    spy.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    if args.command == "json":
        print(json_libraries())
        return
    if args.command == "loadgen":
        loadgen(args)
        return
    if args.command == "profile":
        print(profile(args))
        return
    if args.command == "front":
        load_before = os.getloadavg()
        print(front_cost(args))
        print(f"load average before: {load_before}, after: {os.getloadavg()}")
        return
    if args.command == "baseline":
        baseline(args)
        return
    load_before = os.getloadavg()
    label = f"exactly ({args.server}, {args.workers} worker{'s' if args.workers > 1 else ''})"
    runs = {label: measure("exactly", args)}
    if not args.skip_baseline:
        runs["baseline (FastAPI + json + commit per request)"] = measure("baseline", args)
    check = runs[label]["check"]
    print(f"\n{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"load average before: {load_before}, after: {os.getloadavg()}")
    print(f"durability check: {check['answered']} events answered 200, {check['stored']} in raw\n")
    print(table(runs))


if __name__ == "__main__":
    main()
