"""Spark checkpoints: what is read back from them, and one left by a run killed before its
first micro-batch was planned."""

from __future__ import annotations

from pathlib import Path

from exactly.spark import checkpoint
from exactly.spark.streaming import clear_unplanned


def plant(checkpoint: Path, *files: str) -> None:
    for name in files:
        path = checkpoint / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("v1\n")


def test_leftovers_of_an_unplanned_start_are_removed(tmp_path: Path) -> None:
    plant(tmp_path, "metadata", "offsets/.0.a1b2.tmp", "commits/.0.c3d4.tmp", "state/0/x")
    removed = clear_unplanned(tmp_path)
    assert sorted(path.name for path in removed) == ["commits", "offsets", "state"]
    assert (tmp_path / "metadata").exists(), "the query id is kept"


def test_a_checkpoint_with_a_planned_batch_is_left_alone(tmp_path: Path) -> None:
    plant(tmp_path, "offsets/0", "offsets/.1.e5f6.tmp", "state/0/x")
    assert clear_unplanned(tmp_path) == []
    assert (tmp_path / "offsets" / ".1.e5f6.tmp").exists()
    assert (tmp_path / "state" / "0" / "x").exists()


def test_a_new_or_empty_checkpoint_is_left_alone(tmp_path: Path) -> None:
    assert clear_unplanned(tmp_path / "missing") == []
    (tmp_path / "offsets").mkdir()
    assert clear_unplanned(tmp_path) == []


def test_what_spark_recorded_is_read_back(tmp_path: Path) -> None:
    assert checkpoint.query_id(tmp_path) is None
    assert not checkpoint.planned(tmp_path) and checkpoint.committed_end(tmp_path) is None
    (tmp_path / "metadata").write_text('{"id":"q-1"}\n')
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for batch, end in ((0, 5), (1, 9)):
        (offsets / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"0":{end},"1":2}}\n')
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    assert checkpoint.query_id(tmp_path) == "q-1"
    assert checkpoint.query_id(f"file://{tmp_path}") == "q-1"
    assert checkpoint.query_id("s3a://bucket/cp") is None  # only local checkpoints are read
    assert checkpoint.planned(tmp_path)
    assert checkpoint.batch_end(tmp_path, 1) == {0: 9, 1: 2}
    assert checkpoint.batch_end(tmp_path, 2) is None
    assert checkpoint.last_committed(tmp_path) == 0
    assert checkpoint.committed_end(tmp_path) == {0: 5, 1: 2}
