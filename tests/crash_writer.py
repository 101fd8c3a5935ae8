"""A writer for crash tests: appends numbered records in a loop until it is killed.

Usage: python -m tests.crash_writer URL TOPIC PRODUCER

Each record's value is ``PRODUCER:SEQUENCE`` followed by padding; sequences continue from
``last_sequence`` on every partition, so a restarted writer resumes with no gap. After an append
returns, one line ``partition first_sequence last_sequence`` goes to stdout (flushed): the parent
knows exactly which appends were acknowledged before the kill.
"""

from __future__ import annotations

import random
import sys

from exactly.log import Record, open_log


def main() -> None:
    url, topic, producer = sys.argv[1:4]
    rng = random.Random()
    with open_log(url) as log:
        partitions = log.topic_info(topic).partitions
        next_seq = {}
        for partition in range(partitions):
            last = log.last_sequence(topic, partition, producer)
            next_seq[partition] = 0 if last is None else last + 1
        print("ready", flush=True)
        while True:
            partition = rng.randrange(partitions)
            first = next_seq[partition]
            size = rng.choice([1, 1, 5, 50, 200])
            sequences = list(range(first, first + size))
            records = [Record(f"{producer}:{seq}:".encode() + b"x" * 200) for seq in sequences]
            log.append(topic, partition, records, producer=producer, sequences=sequences)
            next_seq[partition] = first + size
            print(partition, first, first + size - 1, flush=True)


if __name__ == "__main__":
    main()
