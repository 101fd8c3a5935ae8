"""The synced watermark of a sqlite topic: how far each partition is durable, for every process.

A commit of the sqlite log becomes readable before its ``fdatasync`` (the sync runs outside the
topic's lock, so that syncs of several processes overlap). Readers must not see that window: after
a power cut the records could vanish and their offsets be given to new records, which a consumer
that already moved past them would skip. So readers stop at the watermark, as Kafka readers stop at
the high watermark.

``DIR/<topic>.synced`` holds a 16-byte header (magic, partition count) and one little-endian u64
per partition: the end offset below which that partition's records are known durable. Rules:

* It is raised only after a successful ``fdatasync`` of the WAL, to ends that the synced commits
  reached, and only ever grows while the topic lives; so it never exceeds what is durable. The file
  itself is never fsynced: after a power cut it may be stale, short or zeroed, hence too low or
  invalid, never too high. Too low stalls readers until the next sync raises it; invalid is
  rebuilt from the committed ends after an fsync (``exactly.log.group_commit.recover``).
* Every access holds ``flock`` on the file (shared to read, exclusive to write) and, within a
  process, a mutex (an ``flock`` belongs to the open file, which threads share), so no reader sees
  a half-written value. Reads use ``pread``: a file truncated under a reader cannot kill it with
  SIGBUS. Writers store through a shared mmap of the validated file (checked again on each raise):
  the syncer's raise then costs two ``flock`` calls and no write syscall, and does not dirty the
  inode each time. Only a file shrunk by hand under a running writer could SIGBUS it.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

MAGIC = b"exsync01"
_HEADER = struct.Struct("<8sI4x")
_SLOT = struct.Struct("<Q")


class Watermark:
    """One topic's ``.synced`` file, opened by one process (reopen it after a fork)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:  # a reader without write access still reads a valid file
            self._fd = os.open(path, os.O_RDONLY)
        self._mutex = threading.Lock()
        self._map: mmap.mmap | None = None  # writers only: stores, no syscall, rare inode updates

    @contextlib.contextmanager
    def _locked(self, how: int) -> Iterator[None]:
        with self._mutex:
            fcntl.flock(self._fd, how)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _raw(self, partitions: int) -> bytes | None:
        """The whole file in one read (one byte more, to catch a longer file); None if invalid."""
        size = _HEADER.size + _SLOT.size * partitions
        raw = os.pread(self._fd, size + 1, 0)
        if len(raw) != size or _HEADER.unpack_from(raw) != (MAGIC, partitions):
            return None
        return raw

    def _read(self, partitions: int) -> list[int] | None:
        raw = self._raw(partitions)
        if raw is None:
            return None
        return list(struct.unpack_from(f"<{partitions}Q", raw, _HEADER.size))

    def get(self, partitions: int, partition: int) -> int | None:
        """The durable end of one partition; None when the file is missing or invalid."""
        with self._locked(fcntl.LOCK_SH):
            raw = self._raw(partitions)
            if raw is None:
                return None
            return int(_SLOT.unpack_from(raw, _HEADER.size + _SLOT.size * partition)[0])

    def get_all(self, partitions: int) -> list[int] | None:
        """The durable end of every partition; None when the file is missing or invalid."""
        with self._locked(fcntl.LOCK_SH):
            return self._read(partitions)

    def raise_to(self, partitions: int, ends: Mapping[int, int], *, complete: bool = False) -> bool:
        """Raise each given partition's watermark to its end in ``ends`` (never lower it).

        Call only after an fdatasync that covered those ends. An invalid file is left alone
        (False), unless ``ends`` is ``complete`` (every partition, from a recovery): then it is
        written afresh.
        """
        with self._locked(fcntl.LOCK_EX):
            mapped = self._mapped(partitions)
            if mapped is not None:
                for partition, end in ends.items():
                    at = _HEADER.size + _SLOT.size * partition
                    if end > _SLOT.unpack_from(mapped, at)[0]:
                        _SLOT.pack_into(mapped, at, end)
                return True
            current = self._read(partitions)
            if current is None:
                if not complete:
                    return False
                self._write(partitions, [ends.get(p, 0) for p in range(partitions)])
                return True
            raised = {p: end for p, end in ends.items() if end > current[p]}
            if raised:  # one write for the slots from the lowest raised to the highest
                low, high = min(raised), max(raised)
                values = [max(raised.get(p, 0), current[p]) for p in range(low, high + 1)]
                os.pwrite(
                    self._fd,
                    struct.pack(f"<{len(values)}Q", *values),
                    _HEADER.size + _SLOT.size * low,
                )
            return True

    def _mapped(self, partitions: int) -> mmap.mmap | None:
        """The file mapped for writing once it is valid (None if it is not, or is read-only)."""
        header = _HEADER.pack(MAGIC, partitions)
        if self._map is not None:
            if (
                self._map[: _HEADER.size] == header
                and len(self._map) == _HEADER.size + _SLOT.size * partitions
            ):
                return self._map
            self._map.close()
            self._map = None
        if self._raw(partitions) is None:
            return None
        try:
            self._map = mmap.mmap(self._fd, _HEADER.size + _SLOT.size * partitions)
        except OSError:  # opened read-only
            return None
        return self._map

    def reset(self, partitions: int) -> None:
        """Zero every partition: for a topic being created (a stale file must not show through)."""
        with self._locked(fcntl.LOCK_EX):
            self._write(partitions, [0] * partitions)

    def _write(self, partitions: int, ends: Sequence[int]) -> None:
        # values first, header last: a reader that finds the header finds the values
        os.ftruncate(self._fd, _HEADER.size + _SLOT.size * partitions)
        os.pwrite(self._fd, struct.pack(f"<{partitions}Q", *ends), _HEADER.size)
        os.pwrite(self._fd, _HEADER.pack(MAGIC, partitions), 0)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        os.close(self._fd)
