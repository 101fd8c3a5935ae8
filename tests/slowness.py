"""How much slower than the machines the tests' time limits were set on this one runs Python.

pytest-timeout's limits are there to stop a hung test, not to fail a slow machine: on one where
a loop of 10 M additions took 1.46 CPU seconds (2.5x the 0.57 of the machines the limits were
set on) the spark-state pipeline crash test ran past its 1,800 s beside the other crash tests,
and passed alone in 621 s. ``tests/conftest.py`` multiplies every test's limit by this factor.
"""

from __future__ import annotations

import os
import time

ADDITIONS = 10_000_000  # the gauge docs/benchmarks.md names each machine by
REFERENCE = 0.6  # CPU seconds for it on the machines the limits were set on (0.49-0.69)
MOST = 3.0  # a factor past this is a machine the suite cannot finish on anyway
VARIABLE = "EXACTLY_TEST_SLOWNESS"  # the factor, measured once and shared with xdist's workers


def additions_seconds() -> float:
    """The CPU seconds a loop of :data:`ADDITIONS` additions takes here, its names global as in
    the one-line script the figures were read with (local names take about half as long)."""
    loop = compile(
        f"total = 0\nfor number in range({ADDITIONS}):\n    total += number\n", "", "exec"
    )
    started = time.process_time()
    exec(loop, {})
    return time.process_time() - started


def slowness() -> float:
    """The factor, from 1 (as fast as the reference or faster) to :data:`MOST`: measured once
    in the first process that asks (pytest's controller) and kept in the environment, which
    xdist's workers inherit. Setting :data:`VARIABLE` gives it instead."""
    known = os.environ.get(VARIABLE)
    if known is None:
        known = f"{min(MOST, max(1.0, additions_seconds() / REFERENCE)):.2f}"
        os.environ[VARIABLE] = known
    return float(known)
