"""The crash tests' record of where a kill landed (tests/batches_in_flight.py,
tests/requests_in_flight.py): a batch counts only if the killed run planned it, a share below
three quarters fails, and a message answered twice with no kill finding it out fails."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.batches_in_flight import Checkpoints, Landing, Landings, find, uncommitted
from tests.requests_in_flight import RequestKills


def batch(checkpoint: Path, folder: str, number: int) -> None:
    (checkpoint / folder).mkdir(parents=True, exist_ok=True)
    (checkpoint / folder / str(number)).write_text("v1\n")
    (checkpoint / folder / f".{number}.crc").write_text("")  # Spark's checksums are not batches


def test_a_batch_planned_and_not_committed_is_in_flight(tmp_path: Path) -> None:
    checkpoint = tmp_path / "route"
    assert uncommitted(checkpoint) is None  # nothing planned yet
    batch(checkpoint, "offsets", 0)
    assert uncommitted(checkpoint) == 0
    batch(checkpoint, "commits", 0)
    assert uncommitted(checkpoint) is None
    batch(checkpoint, "offsets", 1)
    assert uncommitted(checkpoint) == 1


def test_only_the_killed_runs_own_batches_count(tmp_path: Path) -> None:
    checkpoint = tmp_path / "lake"
    batch(checkpoint, "offsets", 0)  # left uncommitted by the previous run's kill
    checkpoints = Checkpoints({"lake": checkpoint})
    checkpoints.run_starts()
    assert not checkpoints.landing().inside  # killed before it did anything
    assert checkpoints.landing(by_itself=True).in_flight == ("lake batch 0",)  # from its sink
    batch(checkpoint, "commits", 0)
    batch(checkpoint, "offsets", 1)
    assert str(checkpoints.landing()) == "inside lake batch 1"
    assert checkpoints.wait_for_batch(1, lambda: True)
    batch(checkpoint, "commits", 1)
    assert not checkpoints.wait_for_batch(0.05, lambda: True)


def test_checkpoints_are_found_by_their_offsets_and_metadata(tmp_path: Path) -> None:
    batch(tmp_path / "route-events", "offsets", 0)
    (tmp_path / "route-events" / "metadata").write_text("{}")
    batch(tmp_path / "elsewhere", "offsets", 0)  # no metadata: not a checkpoint
    assert find(tmp_path) == {"route-events": tmp_path / "route-events"}


def test_a_share_below_three_quarters_fails() -> None:
    landings = Landings("test")
    for inside in (True, True, False, True):
        landings.add(Landing(("route batch 3",) if inside else ()))
    landings.check()  # 3 of 4
    landings.add(Landing(()))
    with pytest.raises(AssertionError, match="3 of 5 kills inside a micro-batch"):
        landings.check()


def test_a_copy_needs_a_kill_that_found_it_executing() -> None:
    kills = RequestKills("test")
    found = kills.add({("hook", "a"), ("hook", "b")}, {("hook", "a"), ("hook", "c")})
    assert found == {("hook", "a")}  # c was sent, not yet received: executing all the same
    kills.add(set(), set())
    assert kills.share == 0.5
    assert kills.check_duplicates({"hook": Counter({"a": 2, "b": 1, "c": 2})}) == 2
    with pytest.raises(AssertionError, match="'hook', 'b'"):
        kills.check_duplicates({"hook": Counter({"b": 2})})
    with pytest.raises(AssertionError, match="'hook', 'a'"):
        kills.check_duplicates({"hook": Counter({"a": 3})})  # one kill: one copy more
