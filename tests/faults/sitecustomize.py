"""Faults injected into a whole process tree at start-up (tests/short_reads.py).

On ``PYTHONPATH`` only for the child processes of the tests that inject them; Spark's Python
workers inherit that environment from the JVM, so the fault reaches every reader.

The fault is installed when the process first imports the Kafka log, not at start-up: Spark
gives the Python process it starts for a query's source a fixed 10 s to connect back, and
importing the Kafka client first cost each Python process of the scale-out crash test about
0.25 CPU seconds before it could (its runs failed so at a load average of 18).
"""

from __future__ import annotations

import os

if os.environ.get("EXACTLY_TEST_SHORT_READS"):
    import importlib.machinery
    import sys

    KAFKA_LOG = "exactly.log.kafka"

    def _install() -> None:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        from tests.short_reads import RATE, RECORD, install, rates

        rate, endings = rates(os.environ[RATE])
        install(rate, record=os.environ.get(RECORD), endings=endings)

    class _OnKafkaLog:  # a meta path finder
        """Finds nothing itself; has the fault installed once the Kafka log is imported."""

        def find_spec(self, fullname: str, path: object, target: object = None) -> object:
            if fullname != KAFKA_LOG:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)  # type: ignore[arg-type]
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            run = loader.exec_module

            def exec_module(module: object) -> None:
                run(module)
                _install()

            loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, _OnKafkaLog())
