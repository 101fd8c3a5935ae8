"""How often a refused body's answer is lost to a TCP reset: 413s that reach the client.

    .venv/bin/python bench/refused_body.py [--posts 300] [--megabytes 8]

Starts ``exactly collect`` (the tests' helper: sqlite log, a free port) and posts a body of
``--megabytes`` MB, past what the collector drains, ``--posts`` times, each on a new connection
after a ``/health``. Prints how many got their 413 and how many saw the connection reset
instead. The ``exactly`` imported (by the collector too) is the first on ``PYTHONPATH``, so the
code before a change runs with ``env PYTHONPATH=BASE/src``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from tests.integration.collector_server import KEYS, Collector, basic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--posts", type=int, default=300)
    parser.add_argument("--megabytes", type=int, default=8)
    args = parser.parse_args()
    body = b"x" * (args.megabytes << 20)
    answered = resets = 0
    with (
        tempfile.TemporaryDirectory(prefix="exactly-refused-") as work,
        Collector(Path(work)) as collector,
        httpx.Client(base_url=collector.url) as client,
    ):
        began = time.perf_counter()
        for _ in range(args.posts):
            try:
                answer = client.post("/v1/batch", content=body, auth=basic(KEYS["web"]))
                answered += answer.status_code == 413
            except httpx.TransportError:
                resets += 1
            client.get("/health")
        took = time.perf_counter() - began
    print(f"{answered} of {args.posts} got their 413, {resets} reset, in {took:.1f} s")
    print(f"resets {resets}")


if __name__ == "__main__":
    main()
