"""Two benchmark commands run in turn, A B A B ..., and the ratio of the figure each prints.

    .venv/bin/python bench/pairs.py [--runs 5] [--warm-up 1] --vs 'COMMAND B' -- COMMAND A ...

Each command is run ``--runs`` times after ``--warm-up`` uncounted pairs; the figure of a run is
the last number on the last line of its output that has one (``8,952 deliveries/s`` gives
8952), or with ``--figure REGEX`` the first group of the regex's last match in the output. On a
shared, noisy machine the ratio of a pair (A and B run back to back) holds when the absolute
figures drift: the medians of A, B and of the per-pair A/B are what to quote. Used for
before/after comparisons, with the base in a worktree of the older commit::

    git worktree add /tmp/base COMMIT
    .venv/bin/python bench/pairs.py --runs 5 \\
      --vs "env PYTHONPATH=/tmp/base/src .venv/bin/python bench/director_drain.py" \\
      -- .venv/bin/python bench/director_drain.py
"""

from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def figure(output: str, pattern: re.Pattern[str] | None = None) -> float:
    """The first group of ``pattern``'s last match in ``output``; without one, the last number
    of the last line that has one."""
    if pattern is not None:
        matches = pattern.findall(output)
        if matches:
            return float(matches[-1].replace(",", ""))
        raise ValueError(f"{pattern.pattern!r} not in the output:\n{output[-2000:]}")
    for line in reversed(output.splitlines()):
        found = NUMBER.findall(line)
        if found:
            return float(found[-1].replace(",", ""))
    raise ValueError(f"no figure in the output:\n{output[-2000:]}")


def run(command: list[str], timeout: float, pattern: re.Pattern[str] | None) -> float:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return figure(done.stdout, pattern)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--figure", help="a regex whose first group is the figure")
    parser.add_argument("--vs", required=True, help="command B, one string split as a shell does")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="command A, after --")
    args = parser.parse_args()
    a = [word for word in args.command if word != "--"] or parser.error("no command A")
    b = shlex.split(args.vs)
    pattern = re.compile(args.figure) if args.figure else None
    for _ in range(args.warm_up):
        run(a, args.timeout, pattern), run(b, args.timeout, pattern)
    rows: list[tuple[float, float]] = []
    print(f"{'pair':>4} {'A':>12} {'B':>12} {'A/B':>6}")
    for pair in range(1, args.runs + 1):
        one, other = run(a, args.timeout, pattern), run(b, args.timeout, pattern)
        rows.append((one, other))
        print(f"{pair:>4} {one:>12,.1f} {other:>12,.1f} {one / other:>6.3f}", flush=True)
    median_a = statistics.median(one for one, _ in rows)
    median_b = statistics.median(other for _, other in rows)
    ratio = statistics.median(one / other for one, other in rows)
    print(f"median {median_a:>10,.1f} {median_b:>12,.1f} {ratio:>6.3f}")


if __name__ == "__main__":
    sys.exit(main())
