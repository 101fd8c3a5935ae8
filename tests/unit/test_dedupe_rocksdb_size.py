"""The rocksdb store's size on disk while RocksDB removes files under it (pure logic)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exactly.dedupe import rocksdb


class _Vanished:
    """A directory entry whose file a compaction removed between the listing and its stat."""

    name = "000042.sst"

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        raise FileNotFoundError(self.name)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        raise FileNotFoundError(self.name)


def test_a_file_removed_during_the_listing_counts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "000041.sst").write_bytes(b"x" * 1000)
    (tmp_path / "LOG").write_bytes(b"y" * 24)
    (tmp_path / "archive").mkdir()  # a directory counts nothing either
    real = os.scandir

    @contextmanager
    def listing(path: Path) -> Iterator[list[object]]:
        with real(path) as entries:
            yield [*entries, _Vanished()]

    monkeypatch.setattr(rocksdb.os, "scandir", listing)
    assert rocksdb._size(tmp_path) == 1024
