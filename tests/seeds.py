"""The seed of every random kill schedule, so that a failed crash test can be run again as it
was: ``EXACTLY_CRASH_SEED`` (a fixed default per test, so CI runs are repeatable too), printed
at the start of each test, which pytest shows with a failure."""

from __future__ import annotations

import os
import random

SEED = "EXACTLY_CRASH_SEED"


def crash_seed(default: str) -> str:
    """The seed of this run's kill schedule, printed with how to replay it."""
    seed = os.environ.get(SEED, default)
    print(f"kill schedule seed {seed} (replay: {SEED}={seed})", flush=True)
    return seed


def crash_rng(name: str, default: str) -> random.Random:
    """A random generator for the kill schedule of ``name``, from :func:`crash_seed`."""
    return random.Random(f"{name}-{crash_seed(default)}")
