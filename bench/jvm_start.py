"""The driver JVM's CPU for a Spark session's start, a grouped count and its stop, by Java options.

    .venv/bin/python bench/jvm_start.py [--rounds 5] [--vs OPTIONS]

For the crash tests, whose every run starts a JVM (``tests/job_child.py`` ``FAST_JVM``): each
round starts a session in a fresh process with ``JDK_JAVA_OPTIONS`` set to ``FAST_JVM`` without
the ``--vs`` options and then with them (A B, A B, ...), and reads the JVM's own CPU (user and
system, all its threads) from ``/proc`` before the session stops; a first start, not counted,
warms the class-sharing archive and the disk (a first start took 12-25 s). Prints each pair, the
medians and their ratio. The JVM's CPU, not the machine's, so a busy machine shifts both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.job_child import FAST_JVM

SESSION = """
import os
from exactly.config import Settings
from exactly.spark.session import build_session
spark = build_session(Settings(), master="local[2]")
assert spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().count() == 7
fields = open(f"/proc/{spark.sparkContext._gateway.proc.pid}/stat").read().rsplit(")", 1)[1]
ticks = fields.split()[11:13]
print("jvm", sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK"))
spark.stop()
"""


def jvm_seconds(options: str, data_dir: str) -> float:
    """One session's JVM CPU seconds with ``options``."""
    env = {**os.environ, "JDK_JAVA_OPTIONS": options, "EXACTLY_DATA_DIR": data_dir}
    done = subprocess.run(
        [sys.executable, "-c", SESSION], env=env, capture_output=True, text=True, check=True
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("jvm "))
    return float(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vs", default="-XX:CICompilerCount=1", help="options to add")
    args = parser.parse_args()
    added = args.vs.split()
    base_options = " ".join(option for option in FAST_JVM.split() if option not in added)
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    base: list[float] = []
    other: list[float] = []
    with tempfile.TemporaryDirectory(prefix="exactly-jvm-start-") as data_dir:
        jvm_seconds(base_options, data_dir)  # the warm-up, not counted
        for round_ in range(1, args.rounds + 1):
            base.append(jvm_seconds(base_options, data_dir))
            other.append(jvm_seconds(f"{base_options} {args.vs}", data_dir))
            print(f"round {round_}: base {base[-1]:.2f} s, with {args.vs!r} {other[-1]:.2f} s")
    a, b = statistics.median(base), statistics.median(other)
    print(f"medians: base {a:.2f} s, with {args.vs!r} {b:.2f} s: {b / a:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
