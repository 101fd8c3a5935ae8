"""What a micro-batch's checkpoint files cost: exactly's checkpoint file manager beside Spark's.

    .venv/bin/python bench/checkpoint_files.py [--seconds 40] [--rounds 3]

Each run is its own process with a session from ``exactly.spark.session.build_session``
(``local[2]``): a streaming query from Spark's ``rate`` source (10 rows a second) into the
``noop`` sink, a checkpoint on the local disk and a trigger every 200 ms, so each micro-batch
does almost nothing but plan, write ``offsets/N``, run and write ``commits/N``. After 15 s of
warm-up, over ``--seconds``: the CPU of the whole process tree per micro-batch (the JVM, the
driver, and the processes they started and waited for, from ``/proc``), the median of
``walCommit`` + ``commitOffsets`` (writing the two files) and of ``triggerExecution`` from
Spark's progress reports, and the process ids the kernel gave out per micro-batch (processes
and threads: Hadoop starts a thread beside each process it runs).

``exactly`` runs with its own setting (``session.CHECKPOINT_FILE_MANAGER``); the baseline is
the same session with Spark's default, ``FileContextBasedCheckpointFileManager``. The two
alternate, ``--rounds`` times; the ratio is taken pair by pair. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from idle import TICKS, cpu_ticks, tree  # bench/idle.py: a process tree's CPU from /proc

SPARK_DEFAULT = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants, with the children each has reaped."""
    return sum(cpu_ticks(pid) for pid in tree(root)) / TICKS


def last_pid() -> int:
    """The kernel's most recently given process id (to count the processes and threads started)."""
    return int(Path("/proc/loadavg").read_text().split()[-1])


def one_run(variant: str, seconds: float) -> dict[str, float]:
    """One session and query (in this process): its figures per micro-batch."""
    from exactly.config import Settings
    from exactly.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        conf = {"spark.sql.streaming.checkpointFileManagerClass": SPARK_DEFAULT}
        spark = build_session(
            Settings(data_dir=work),
            f"bench-checkpoint-{variant}",
            master="local[2]",
            conf=conf if variant == "spark" else None,
        )
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 10)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        time.sleep(15)
        cpu, batch, pid = tree_cpu(os.getpid()), query.lastProgress["batchId"], last_pid()
        time.sleep(seconds)
        cpu = tree_cpu(os.getpid()) - cpu
        batches = query.lastProgress["batchId"] - batch
        started = (last_pid() - pid) % (1 << 22)  # pid_max wraps; nothing else runs here
        reports = [r for r in query.recentProgress if r["batchId"] > batch]
        query.stop()
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    durations = [r["durationMs"] for r in reports]
    return {
        "batches": batches,
        "cpu_ms": 1000 * cpu / batches,
        "files_ms": statistics.median(
            d.get("walCommit", 0) + d.get("commitOffsets", 0) for d in durations
        ),
        "trigger_ms": statistics.median(d.get("triggerExecution", 0) for d in durations),
        "processes": started / batches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=["exactly", "spark"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.seconds)))
        return
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{n:.2f}' for n in os.getloadavg())}")
    runs: dict[str, list[dict[str, float]]] = {"exactly": [], "spark": []}
    for _ in range(args.rounds):
        for variant in runs:
            output = subprocess.run(
                [sys.executable, __file__, "--one", variant, "--seconds", str(args.seconds)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs[variant].append(json.loads(output.strip().splitlines()[-1]))
    print(f"load average after: {' '.join(f'{n:.2f}' for n in os.getloadavg())}\n")
    print("| manager | micro-batches | CPU per batch, ms | files, ms | trigger, ms | pids |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for variant, found in runs.items():
        for run in found:
            print(
                f"| {variant} | {run['batches']:.0f} | {run['cpu_ms']:.0f} | "
                f"{run['files_ms']:.0f} | {run['trigger_ms']:.0f} | {run['processes']:.1f} |"
            )
    pairs = zip(runs["exactly"], runs["spark"], strict=True)
    ratios = [new["cpu_ms"] / old["cpu_ms"] for new, old in pairs]
    print(
        f"\nCPU per micro-batch, exactly / Spark's default, pair by pair: "
        f"{', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
