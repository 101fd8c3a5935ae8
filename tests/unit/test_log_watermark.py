"""The synced watermark file of the sqlite log: only ever raised, invalid files read as None."""

from __future__ import annotations

from pathlib import Path

from exactly.log.watermark import Watermark


def test_raised_never_lowered_and_per_partition(tmp_path: Path) -> None:
    watermark = Watermark(tmp_path / "t.synced")
    watermark.reset(4)
    assert watermark.get_all(4) == [0, 0, 0, 0]
    assert watermark.raise_to(4, {1: 5, 3: 2})
    assert watermark.raise_to(4, {1: 3, 2: 7})  # 1 stays at 5
    assert watermark.get_all(4) == [0, 5, 7, 2]
    assert [watermark.get(4, p) for p in range(4)] == [0, 5, 7, 2]
    other = Watermark(tmp_path / "t.synced")  # another process's view of the same file
    assert other.get(4, 2) == 7
    watermark.close()
    other.close()


def test_missing_short_or_foreign_files_read_as_invalid(tmp_path: Path) -> None:
    path = tmp_path / "t.synced"
    watermark = Watermark(path)  # created empty
    assert watermark.get_all(2) is None and watermark.get(2, 0) is None
    assert not watermark.raise_to(2, {0: 9})  # a partial raise cannot make it valid
    assert watermark.get_all(2) is None
    assert watermark.raise_to(2, {0: 9, 1: 1}, complete=True)  # a recovery's complete ends can
    assert watermark.get_all(2) == [9, 1]
    assert watermark.get_all(3) is None  # another partition count: a stale file
    path.write_bytes(path.read_bytes() + b"\0")  # longer than it should be
    assert watermark.get_all(2) is None
    path.write_bytes(b"\0" * 32)  # zeroed by a power cut
    assert watermark.get_all(2) is None
    watermark.close()
