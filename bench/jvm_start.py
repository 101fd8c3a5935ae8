"""The driver JVM's CPU for a Spark session's start, a grouped count and its stop, by Java options.

    .venv/bin/python bench/jvm_start.py [--rounds 5] [--base OPTIONS] [--vs OPTIONS]

For the crash tests, whose every run starts a JVM (``tests/job_child.py`` ``FAST_JVM``): each
round starts a session in a fresh process with ``JDK_JAVA_OPTIONS`` set to ``--base`` and then
to ``--base`` plus ``--vs`` (A B, A B, ...), and reads the JVM's own CPU (user and system, all
its threads) from ``/proc`` before the session stops. Prints each pair, the medians and their
ratio. The JVM's CPU, not the machine's, so a busy machine shifts both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

FAST_JVM = (
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"
    " -Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
)
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
    parser.add_argument("--base", default=FAST_JVM)
    parser.add_argument("--vs", default="-XX:CICompilerCount=1")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    base: list[float] = []
    other: list[float] = []
    with tempfile.TemporaryDirectory(prefix="exactly-jvm-start-") as data_dir:
        for round_ in range(1, args.rounds + 1):
            base.append(jvm_seconds(args.base, data_dir))
            other.append(jvm_seconds(f"{args.base} {args.vs}", data_dir))
            print(f"round {round_}: base {base[-1]:.2f} s, with {args.vs!r} {other[-1]:.2f} s")
    a, b = statistics.median(base), statistics.median(other)
    print(f"medians: base {a:.2f} s, with {args.vs!r} {b:.2f} s: {b / a:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
