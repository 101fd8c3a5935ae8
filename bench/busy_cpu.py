"""One command's wall time and the whole machine's busy CPU while it ran, from ``/proc/stat``.

    .venv/bin/python bench/busy_cpu.py -- COMMAND ...

For what spreads over many short processes (a crash test's children, their JVMs and Spark's
Python workers), which a parent's ``rusage`` misses when they are not its own waited-for
children: the machine's busy time (user, nice, system, irq, softirq, steal) from before the
command to after it. On a shared machine, run it beside nothing else and compare in pairs
(``bench/pairs.py --figure 'busy CPU ([\\d.]+) s'``). Prints the load average before, the
command's exit status, and the figures; exits with the command's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (not idle, iowait)


def busy_seconds() -> float:
    """The machine's busy CPU seconds since boot, all cores."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def main(command: list[str]) -> int:
    if not command:
        print("usage: bench/busy_cpu.py -- COMMAND ...", file=sys.stderr)
        return 2
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    busy, began = busy_seconds(), time.monotonic()
    status = subprocess.run(command).returncode
    busy, wall = busy_seconds() - busy, time.monotonic() - began
    print(f"exit status {status}; wall {wall:.1f} s; busy CPU {busy:.1f} s", flush=True)
    return status


if __name__ == "__main__":
    arguments = sys.argv[1:]
    sys.exit(main(arguments[1:] if arguments[:1] == ["--"] else arguments))
