"""What ``exactly up`` costs with no traffic: CPU of all its processes, and their memory.

    .venv/bin/python bench/idle.py [--seconds 60] [--settle 30] [--rounds 2] [--trickle N]
                                   [--lanes N]

``exactly up`` starts on the embedded defaults with a Delta lake, its two destinations at a real
receiver in this process (tests/receiver.py), as a user runs it (no test JVM options). 1,000
events are sent through its collector and the bench waits until they are counted and delivered,
so every part has done its first work; then ``--settle`` seconds pass, and over the next
``--seconds`` the CPU seconds of ``up`` and every process under it are summed from
``/proc/PID/stat`` (processes that start and end meanwhile are counted by their parent's
``cutime``/``cstime``, the children they waited for). Memory is taken at the end: the sum of the
processes' RSS, and of their PSS (``/proc/PID/smaps_rollup``: shared pages counted once).

``--trickle N``: a client sends a batch of N events once a second from the start of the
settling to the end of the measure, so what is measured is ``up`` at a trickle of traffic: each
query running a micro-batch per trigger, the fixed cost of a micro-batch paid every second. It
also prints the micro-batches the queries started while measured (from their checkpoints, as
``bench/micro_batches.py`` reads them) and ``up``'s CPU per micro-batch.

``--lanes N``: the single-event destination ``all`` in N lanes (a bucket each, by user), so
what is measured includes what its caught-up buckets cost the director at rest: each is asked
for new jobs every ``poll_seconds``.

The baseline, in the same round: a plain PySpark session with the same master, held idle for the
same seconds, no query (what the JVM and a driver cost doing nothing). Prints the machine, the
load, each process's share, and a table of both.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.receiver import Receiver
from tests.up_service import Clients, counted, write_config

import micro_batches  # type: ignore[import-not-found]  # bench/micro_batches.py

TICKS = os.sysconf("SC_CLK_TCK")
BASELINE = """
import time
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("idle-baseline")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.range(10).count()
print("ready", flush=True)
time.sleep(86400)
"""


def tree(root: int) -> list[int]:
    """``root`` and its live descendants (``up`` starts each part in a session of its own, so
    a process group would miss them)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        found += frontier
    return found


def cpu_ticks(pid: int) -> int:
    """utime + stime + cutime + cstime of ``pid`` (0 once gone)."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(value) for value in fields[11:15])
    return 0


def name_of(pid: int) -> str:
    """A short name: ``java``, or the Python module or command it runs."""
    with contextlib.suppress(OSError):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"java" in args[0]:
            return "java"
        if b"-m" in args:
            module = args[args.index(b"-m") + 1].decode()
            rest = [a.decode() for a in args[args.index(b"-m") + 2 :][:1]]
            return " ".join([module.rsplit(".", 1)[-1], *rest])
        return Path(args[0].decode()).name
    return "?"


def memory(pids: list[int]) -> tuple[float, float, Counter[str]]:
    """(RSS, PSS) of ``pids`` summed, in MiB, and the PSS per process name."""
    rss = pss = 0
    named: Counter[str] = Counter()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
                    named[name_of(pid)] += int(line.split()[1]) // 1024
    return rss / 1024, pss / 1024, named


def measure(root: int, seconds: float) -> tuple[float, Counter[str], float, float]:
    """CPU cores used by ``root`` and its descendants over ``seconds`` (and per process
    name), their RSS and PSS at the end."""
    before = {pid: cpu_ticks(pid) for pid in tree(root)}
    time.sleep(seconds)
    pids = tree(root)
    shares: Counter[str] = Counter()
    total = 0
    for pid in set(before) | set(pids):
        spent = cpu_ticks(pid) - before.get(pid, 0)
        if pid in before and pid not in pids:
            continue  # gone: its time is its parent's cutime now, if it was waited for
        total += max(spent, 0)
        shares[name_of(pid)] += max(spent, 0)
    rss, pss, named = memory(pids)
    print("  PSS MiB by process: " + ", ".join(f"{n} {m:,}" for n, m in named.most_common(8)))
    return total / TICKS / seconds, shares, rss, pss


def up_idle(
    seconds: float, settle: float, trickle: int = 0, lanes: int = 1
) -> tuple[float, Counter[str], float, float]:
    with tempfile.TemporaryDirectory(prefix="exactly-idle-") as work, Receiver() as receiver:
        home = Path(work)
        config = write_config(home, receiver.url)
        lake = home / "data" / "lake" / "events"
        text = config.read_text() + f'\n[lake]\nurl = "delta://{lake}"\n'
        if lanes > 1:
            everything = f'name = "all"\nurl = "{receiver.url}/ok"\n'
            assert everything in text, "the config's destination `all` moved"
            text = text.replace(everything, f"{everything}lanes = {lanes}\n")
        config.write_text(text)
        env = {**os.environ, "EXACTLY_CONFIG": str(config)}
        env.pop("JDK_JAVA_OPTIONS", None)
        up = subprocess.Popen(
            [sys.executable, "-m", "exactly", "up", "--no-live"],
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        drip: Clients | None = None
        try:
            clients = Clients(port_of(config), batches=10, size=100).start()
            assert clients.wait(300), "the clients could not send"
            deadline = time.monotonic() + 300
            while counted(home / "data") < len(clients.ids) or not set(
                receiver.successes("/ok")
            ) >= set(clients.ids):
                assert time.monotonic() < deadline, "the events were not counted and delivered"
                time.sleep(1)
            if trickle:  # a batch a second until the measure ends (the pause paces it)
                batches = int(settle + seconds) + 5
                drip = Clients(port_of(config), batches, trickle, pause=1.0, prefix="trickle-")
                drip.start()
            time.sleep(settle)
            began = time.time()
            found = measure(up.pid, seconds)
            if trickle:
                say_per_batch(home / "data" / "checkpoints", began, found[0] * seconds)
            return found
        finally:
            if drip is not None:
                drip.stopping.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(up.pid, signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()


def say_per_batch(checkpoints: Path, since: float, cpu: float) -> None:
    """The micro-batches each query started while measured, and ``up``'s CPU per micro-batch:
    a figure a loaded machine moves less than cores (a slow batch means fewer batches)."""
    started = {
        query.name: sum(1 for _, start, _, _ in micro_batches.batches(query) if start >= since)
        for query in sorted(checkpoints.iterdir())
        if (query / "offsets").is_dir()
    }
    total = sum(started.values())
    listed = ", ".join(f"{name} {count}" for name, count in started.items())
    per_batch = f"{cpu / total * 1000:,.0f} ms" if total else "-"
    print(f"  micro-batches started: {total} ({listed}); CPU per micro-batch {per_batch}")


def port_of(config: Path) -> int:
    text = config.read_text().split("[collector]", 1)[1]
    return int(text.split("port = ", 1)[1].split("\n", 1)[0])


def baseline_idle(seconds: float, settle: float) -> tuple[float, Counter[str], float, float]:
    env = {**os.environ}
    env.pop("JDK_JAVA_OPTIONS", None)
    spark = subprocess.Popen(
        [sys.executable, "-c", BASELINE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert spark.stdout is not None and spark.stdout.readline().strip() == b"ready"
        time.sleep(settle)
        return measure(spark.pid, seconds)
    finally:
        os.killpg(spark.pid, signal.SIGKILL)
        spark.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trickle", type=int, default=0, help="events sent each second")
    parser.add_argument("--lanes", type=int, default=1, help="the destination `all`'s lanes")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    results: dict[str, list[tuple[float, float, float]]] = {"up": [], "baseline": []}
    for _ in range(args.rounds):
        for way in ("up", "baseline"):
            if way == "up":
                cores, shares, rss, pss = up_idle(
                    args.seconds, args.settle, args.trickle, args.lanes
                )
            else:
                cores, shares, rss, pss = baseline_idle(args.seconds, args.settle)
            results[way].append((cores, rss, pss))
            top = ", ".join(
                f"{name} {ticks / TICKS / args.seconds:.3f}"
                for name, ticks in shares.most_common(6)
            )
            print(f"{way}: {cores:.3f} cores, RSS {rss:,.0f} MiB, PSS {pss:,.0f} MiB ({top})")
    print(f"load after {os.getloadavg()[0]:.1f}")
    traffic = f"{args.trickle} events/s" if args.trickle else "idle"
    print(f"\n{traffic} for {args.seconds:.0f} s after {args.settle:.0f} s of settling")
    print("\n| process group | cores (rounds) | median | RSS MiB | PSS MiB |")
    print("| --- | --- | ---: | ---: | ---: |")
    for way, found in results.items():
        runs = ", ".join(f"{cores:.3f}" for cores, _, _ in found)
        median = statistics.median(cores for cores, _, _ in found)
        rss = statistics.median(value for _, value, _ in found)
        pss = statistics.median(value for _, _, value in found)
        label = "plain PySpark session, idle"
        if way == "up":
            label = f"`exactly up`, {traffic}" if args.trickle else "`exactly up`, no traffic"
            label += f", `all` in {args.lanes} lanes" if args.lanes > 1 else ""
        print(f"| {label} | {runs} | {median:.3f} | {rss:,.0f} | {pss:,.0f} |")


if __name__ == "__main__":
    main()
