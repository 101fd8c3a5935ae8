"""How long each streaming query's micro-batches took, read from a data dir's checkpoints.

    .venv/bin/python bench/micro_batches.py DATA_DIR [--since EPOCH_SECONDS] [--until ...]

Spark writes ``offsets/N`` when micro-batch N starts (its offset range, before any task) and
``commits/N`` when it ends, so for each query's checkpoint under ``DATA_DIR/checkpoints``
(``dedupe-rocksdb-raw-events``, ``aggregate-events``, ``route-events``, ``lake-events``) the
file times give each batch's duration and the wait between one batch's end and the next
one's start, and the offsets files give the records each batch read. Prints per query the
batches, their median and 90th/99th-percentile duration, the median wait, and records per
batch: where the accept -> counted and accept -> delivered latencies of ``up`` go (a record
waits up to one batch for the next to start, then that batch's whole duration, per query it
goes through). Run ``bench/e2e.py`` with ``BENCH_KEEP=1`` to keep its data dir.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exactly.spark.checkpoint import batch_end


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def batches(checkpoint: Path) -> list[tuple[int, float, float, int]]:
    """(batch id, start, end, records read) of each committed batch of ``checkpoint``; the
    records are the offsets its end position (``spark.checkpoint.batch_end``) moved past the
    batch before's (0 for the first batch kept)."""
    made = []
    previous: dict[int, int] | None = None
    ids = sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    for batch in ids:
        planned, commit = checkpoint / "offsets" / str(batch), checkpoint / "commits" / str(batch)
        current = batch_end(checkpoint, batch) or {}
        if commit.exists():
            before = current if previous is None else previous
            records = sum(end - before.get(partition, end) for partition, end in current.items())
            made.append((batch, planned.stat().st_mtime, commit.stat().st_mtime, records))
        previous = current
    return made


def table(data_dir: Path, since: float = 0.0, until: float = float("inf")) -> list[str]:
    """The markdown table of every query's batches under ``data_dir`` that started between
    ``since`` and ``until`` (seconds since the epoch): also what ``bench/e2e.py`` prints."""
    lines = [
        "| query | batches | duration p50 / p90 / p99 | wait before p50 | records p50 / max |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    checkpoints = data_dir / "checkpoints"
    for checkpoint in sorted(checkpoints.iterdir() if checkpoints.is_dir() else ()):
        if not (checkpoint / "offsets").is_dir():
            continue
        found = batches(checkpoint)
        waits = [b[1] - a[2] for a, b in itertools.pairwise(found)]
        kept = [
            (batch, wait)
            for batch, wait in zip(found[1:], waits, strict=True)
            if since <= batch[1] <= until
        ]
        if not kept:
            continue
        durations = [end - start for (_, start, end, _), _ in kept]
        records = [count for (_, _, _, count), _ in kept]
        lines.append(
            f"| {checkpoint.name} | {len(kept)} | {statistics.median(durations):.2f} / "
            f"{percentile(durations, 0.9):.2f} / {percentile(durations, 0.99):.2f} s | "
            f"{statistics.median(w for _, w in kept):.2f} s | "
            f"{statistics.median(records):,.0f} / {max(records):,} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--since", type=float, default=0.0, help="batches starting after this")
    parser.add_argument("--until", type=float, default=float("inf"))
    args = parser.parse_args()
    print("\n".join(table(args.data_dir, args.since, args.until)))


if __name__ == "__main__":
    sys.exit(main())
