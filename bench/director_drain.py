"""One director draining single-event jobs in this process: deliveries/s, for before/after pairs.

    .venv/bin/python bench/director_drain.py [--jobs 30000] [--in-flight 64]

``bench/directors.py``'s fill (``--jobs`` jobs from ``--sources`` sources, 16 by default, in an
empty sqlite JobDB), then one (``--forgetting``: reading regulations, as ``deliver`` and ``up``'s
directors do)
:class:`exactly.delivery.director.Director` (8 partitions, ``max_in_flight`` = ``--in-flight``)
delivers them to the fast receiver of ``bench/delivery.py`` (its own process, same cores) until
drained; prints deliveries/s. The ``exactly`` imported is the first on ``PYTHONPATH``, so two
checkouts compare in turn with ``bench/pairs.py``::

    .venv/bin/python bench/pairs.py --runs 5 \\
      --vs "env PYTHONPATH=BASE/src .venv/bin/python bench/director_drain.py" \\
      -- .venv/bin/python bench/director_drain.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delivery import empty_jobdb, receiver  # type: ignore[import-not-found]
from directors import SECRET, fill  # type: ignore[import-not-found]
from exactly.delivery.director import Director
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.settings import DestinationSettings


def forgetting(directory: Path) -> Any:
    """What ``exactly deliver`` passes the director to read regulations: an empty log."""
    from exactly.delivery.director.forgetting import Forgetting
    from exactly.forget.regulations import load_key
    from exactly.log import open_log

    key = load_key(directory)
    return lambda calls, archive: Forgetting(
        open_log(f"sqlite://{directory / 'log'}"), key, calls, archive, lambda _: None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--sources", type=int, default=16, help="buckets the jobs are in")
    parser.add_argument(
        "--forgetting",
        action="store_true",
        help="read `exactly forget`'s regulations as `deliver` and `up` do (none are there)",
    )
    args = parser.parse_args()
    with receiver() as url, empty_jobdb("sqlite") as db_url:
        fill(db_url, args.jobs, args.sources)
        target = DestinationSettings(
            name="bench",
            url=url,
            secret=SECRET,
            max_in_flight=args.in_flight,  # type: ignore[arg-type]
        )
        with open_jobdb(db_url) as db:
            director = Director(
                db,
                [target],
                poll_seconds=0.05,
                report=lambda _: None,
                partitions=8,
                forgetting=forgetting(Path(db_url.partition("://")[2]))
                if args.forgetting
                else None,
            )
            began = time.perf_counter()
            director.run(until_drained=True)
            print(f"{args.jobs / (time.perf_counter() - began):,.0f} deliveries/s", flush=True)


if __name__ == "__main__":
    main()
