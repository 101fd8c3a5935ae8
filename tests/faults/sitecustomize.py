"""Faults injected into a whole process tree at start-up (tests/short_reads.py).

On ``PYTHONPATH`` only for the child processes of the tests that inject them; Spark's Python
workers inherit that environment from the JVM, so the fault reaches every reader.
"""

import os

if os.environ.get("EXACTLY_TEST_SHORT_READS"):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.short_reads import RATE, RECORD, install, rates

    rate, endings = rates(os.environ[RATE])
    install(rate, record=os.environ.get(RECORD), endings=endings)
