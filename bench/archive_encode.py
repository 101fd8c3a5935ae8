"""The archive's encoding: CPU per record of ``archive.base.encode`` beside the encoding before it.

    .venv/bin/python bench/archive_encode.py [--records 50000] [--rounds 5]

The director archives every job it ended (a record per event, a pack's members included), in
its own process beside its sending. Per round, in turn: ``encode`` (orjson, gzip level 1) and
the encoding it replaced (``json.dumps``, gzip level 6, the baseline), each over the same
``--records`` records of delivered Segment track events (about 330 bytes of payload each, its
own ids, two transitions), into memory. Prints the CPU microseconds and the compressed bytes per
record, the medians of the rounds and the ratio of each round.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exactly.delivery.archive.base import encode


def records(count: int) -> list[dict[str, Any]]:
    """``count`` records of delivered track events, each its own ids, user and revenue."""
    steps = [
        {"time": 1.79e9, "attempt": 1, "state": state, "retry_at": None, "status_code": code}
        | {"error_type": None, "response": "ok" if code else None}
        for state, code in (("succeeded", 200), ("archiving", None))
    ]
    found = []
    for i in range(count):
        payload = {
            "type": "track",
            "event": "Order Completed",
            "userId": f"user-{i % 1000:04d}",
            "messageId": f"ajs-next-{i:032x}",
            "properties": {"revenue": i % 997 / 10, "plan": ("free", "pro")[i % 2]},
            "timestamp": f"2026-01-02T03:{i // 60 % 60:02d}:{i % 60:02d}.000Z",
            "context": {"library": {"name": "analytics.js", "version": "4.1.0"}, "ip": "1.2.3.4"},
        }
        found.append(
            {
                "id": i,
                "bucket": "web/hook",
                "destination": "hook",
                "payload": json.dumps(payload),
                "message_id": payload["messageId"],
                "user_id": payload["userId"],
                "created_at": 1.79e9 + i / 1000,
                "expire_at": 1.79e9 + 3600 + i / 1000,
                "transitions": steps,
            }
        )
    return found


def before(found: list[dict[str, Any]], into: io.BytesIO) -> None:
    """The encoding before issue 45: ``json.dumps`` and gzip level 6."""
    with gzip.GzipFile(fileobj=into, mode="wb", compresslevel=6, mtime=0) as packed:
        for record in found:
            packed.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")


def timed(
    how: Callable[[list[dict[str, Any]], io.BytesIO], None], found: list[Any]
) -> tuple[float, int]:
    into = io.BytesIO()
    start = time.process_time()
    how(found, into)
    return (time.process_time() - start) / len(found) * 1e6, into.tell() // len(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()}", flush=True)
    found = records(options.records)
    now: list[float] = []
    old: list[float] = []
    for round_ in range(options.rounds):
        now_us, now_bytes = timed(encode, found)
        old_us, old_bytes = timed(before, found)
        now.append(now_us)
        old.append(old_us)
        print(
            f"round {round_ + 1}: encode {now_us:.2f} us/record ({now_bytes:.0f} B), before "
            f"{old_us:.2f} us/record ({old_bytes:.0f} B), ratio {old_us / now_us:.1f}",
            flush=True,
        )
    ratios = [o / n for n, o in zip(now, old, strict=True)]
    print(
        f"median: encode {statistics.median(now):.2f} us/record, before "
        f"{statistics.median(old):.2f}, before / encode {statistics.median(ratios):.1f}; "
        f"load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
