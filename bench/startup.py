"""Start-up of the streaming commands: seconds from launch until the first micro-batch is done.

    .venv/bin/python bench/startup.py [--repeat 3]

Each command gets a fresh data dir on the embedded defaults with 1,000 events imported by
``exactly import`` (as a new user would), and runs in a fresh process; in turn:

* ``exactly dedupe`` (rocksdb store): launch until ``commits/0`` exists in its checkpoint, with
  the class-sharing archive (``exactly.spark.class_sharing``) and without it;
* ``exactly aggregate`` (SQLite) over events imported into ``events``: the same;
* baseline: a plain PySpark script with the same Spark settings but no ``exactly``: a
  streaming query from Spark's ``rate`` source into a ``noop`` sink, launch until its
  ``commits/0``;
* and pieces of our start-up, each in a fresh process: ``import exactly.cli`` alone, and
  ``build_session`` (the JVM and the SparkSession) timed from launch.

The archive is made first if this machine has none (``class_sharing.prepare``, about 40 s).

Each command is stopped with SIGTERM once its first batch is done. Medians of ``--repeat``
rounds, the commands interleaved in each round; prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EVENTS = 1_000
TIMEOUT = 180.0
CHECKPOINTS = {"dedupe": "dedupe-rocksdb-raw-events", "aggregate": "aggregate-events"}

BASELINE = """
import sys, time
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("baseline")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "8").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
query = (spark.readStream.format("rate").option("rowsPerSecond", "1000").load()
         .writeStream.format("noop").option("checkpointLocation", sys.argv[1])
         .trigger(processingTime="1 second").start())
query.awaitTermination()
"""

PIECES = {
    "import exactly.cli": "import exactly.cli",
    "build_session (JVM and SparkSession)": (
        "from exactly.config import Settings\n"
        "from exactly.spark.session import build_session\n"
        "build_session(Settings())"
    ),
}


def events_file(path: Path) -> Path:
    with path.open("wb") as out:
        for n in range(EVENTS):
            event = {"type": "track", "event": "Viewed", "messageId": f"m-{n}", "userId": "u"}
            out.write(orjson.dumps(event) + b"\n")
    return path


def until_first_batch(
    command: list[str], checkpoint: Path, env: dict[str, str], timeline: list[str] | None = None
) -> float:
    """Seconds from launch until ``checkpoint/commits/0`` exists; the command is then stopped.

    With ``timeline``, notes when each process of the command's tree first appears (the JVM,
    Spark's Python daemons and workers), polled every 20 ms.
    """
    import psutil

    began = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    seen: set[int] = set()
    try:
        while not (checkpoint / "commits" / "0").exists():
            if process.poll() is not None:
                raise RuntimeError(f"{command} exited: {process.stderr.read().decode()[-2000:]}")
            if time.perf_counter() - began > TIMEOUT:
                raise RuntimeError(f"{command}: no first batch in {TIMEOUT} s")
            if timeline is not None:
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(process.pid).children(recursive=True):
                        if child.pid not in seen:
                            seen.add(child.pid)
                            timeline.append(f"{time.perf_counter() - began:6.2f} s  {kind(child)}")
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        if timeline is not None:
            timeline.append(f"{elapsed:6.2f} s  first micro-batch committed")
        return elapsed
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def kind(process: object) -> str:
    """A short name for a process of the tree: a JVM, or a Python daemon and its module."""
    line = process.cmdline()  # type: ignore[attr-defined]
    name = process.name()  # type: ignore[attr-defined]
    if "pyspark.daemon" in line:
        parent = process.parent().cmdline()  # type: ignore[attr-defined]
        role = "forked worker" if "pyspark.daemon" in parent else "daemon"
        return f"python {line[-1]} ({role})"
    if name == "java":
        main = next((arg for arg in line if arg.startswith("org.apache.spark")), line[-1])
        return f"java {main}"
    return f"{name} {' '.join(line[1:])}"[:70]


def timed_script(script: str, env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True)
    return time.perf_counter() - began


def round_of(work: Path, n: int, data_file: Path) -> dict[str, float]:
    exactly = str(BIN / "exactly")

    def command(name: str, topic: str, sharing: bool = True) -> float:
        data = work / f"{name}-{n}-{sharing}"
        env = {
            **os.environ,
            "EXACTLY_DATA_DIR": str(data),
            "EXACTLY_SPARK__CLASS_SHARING": str(sharing).lower(),
        }
        subprocess.run(
            [exactly, "import", str(data_file), "--source", "bench", "--topic", topic],
            env=env,
            check=True,
            capture_output=True,
        )
        checkpoint = data / "checkpoints" / CHECKPOINTS[name]
        try:
            return until_first_batch([exactly, name], checkpoint, env)
        finally:
            shutil.rmtree(data, ignore_errors=True)

    baseline = work / f"baseline-{n}"
    times = {
        "exactly dedupe": command("dedupe", "raw"),
        "exactly dedupe, class sharing off": command("dedupe", "raw", sharing=False),
        "exactly aggregate": command("aggregate", "events"),
        "exactly aggregate, class sharing off": command("aggregate", "events", sharing=False),
        "baseline: plain PySpark, rate -> noop": until_first_batch(
            [sys.executable, "-c", BASELINE, str(baseline)], baseline, dict(os.environ)
        ),
    }
    for name, script in PIECES.items():
        times[name] = timed_script(script, dict(os.environ))
    return times


def print_timeline(work: Path, data_file: Path) -> None:
    data = work / "timeline"
    env = {**os.environ, "EXACTLY_DATA_DIR": str(data)}
    exactly = str(BIN / "exactly")
    subprocess.run(
        [exactly, "import", str(data_file), "--source", "bench"],
        env=env,
        check=True,
        capture_output=True,
    )
    timeline: list[str] = []
    checkpoint = data / "checkpoints" / CHECKPOINTS["dedupe"]
    until_first_batch([exactly, "dedupe"], checkpoint, env, timeline)
    print("exactly dedupe, from launch:")
    print("\n".join(timeline))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--timeline", action="store_true", help="print when each process of one dedupe run starts"
    )
    args = parser.parse_args()
    from exactly.spark.class_sharing import prepare

    prepare()  # the archive the commands map, made once per machine
    load = os.getloadavg()[0]
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        work = Path(scratch)
        data_file = events_file(work / "events.jsonl")
        if args.timeline:
            print_timeline(work, data_file)
            return
        for n in range(args.repeat):
            for name, seconds in round_of(work, n, data_file).items():
                runs.setdefault(name, []).append(seconds)
                print(f"round {n}: {name} {seconds:.2f} s", flush=True)
    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.2f} before")
    print("| measure | runs (s) | median (s) |")
    print("| --- | --- | ---: |")
    for name, values in runs.items():
        listed = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} | {listed} | {statistics.median(values):.2f} |")


if __name__ == "__main__":
    main()
