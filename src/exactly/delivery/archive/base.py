"""The archive: where finished jobs go, with their history, before their dataset is dropped.

An archive holds one file (or object) per dataset, named by :func:`archive_name`, of gzip JSON
lines: one job per line with its transitions (``jobdb/sql/archiving.py``). Backends store whole
files; the encoding is written once here, so every backend holds the same bytes for the same
dataset.

Guarantees, on every backend:

* **Complete and durable under its final name on return.** :meth:`Archive.write` returns only once
  the file can be read back whole after a crash of this machine; until then nothing (or the
  previous content) is under that name. The JobDB drops a dataset only after ``write`` returned.
* **Idempotent per dataset.** Writing the same dataset again (a crash between the write and the
  drop repeats it) replaces the file with the same bytes: gzip without a time stamp, records in
  job id order, so the archive never holds a dataset twice.
* **Readable.** :meth:`Archive.names` lists the archive files (oldest dataset first) and
  :meth:`Archive.records` streams one file's jobs, which ``exactly replay`` reads.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import IO, Any

import orjson

from exactly.delivery.jobdb.base import Dataset
from exactly.errors import ArchiveError
from exactly.urls import redact

SUFFIX = ".jsonl.gz"
_NAME = re.compile(r"jobs-\d{8}T\d{6}Z-\d+-\d+\.jsonl\.gz")
SPOOL_BYTES = 16 << 20  # an encoded file is kept in memory up to this size, then on disk


def archive_name(dataset: Dataset) -> str:
    """``jobs-<created, UTC>-<first job id>-<dataset>.jsonl.gz``: unique even if a JobDB is
    recreated (numbers and ids start again, the creation time does not), and sorted by time."""
    created = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(dataset.created_at))
    return f"jobs-{created}-{dataset.first_id}-{dataset.number}{SUFFIX}"


def is_archive_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def encode(records: Iterable[dict[str, Any]], into: IO[bytes]) -> None:
    """Write ``records`` as gzip JSON lines into ``into``, the same bytes for the same records.

    orjson and gzip's fastest level: the director archives every event it delivered, and
    ``json.dumps`` with level 6 cost it 3.6x the CPU for files a sixth smaller
    (``bench/archive_encode.py``)."""
    with gzip.GzipFile(fileobj=into, mode="wb", compresslevel=1, mtime=0) as packed:
        for record in records:
            packed.write(orjson.dumps(record) + b"\n")


def decode(packed: IO[bytes], name: str) -> Iterator[dict[str, Any]]:
    """The records of one archive file, streamed."""
    try:
        with gzip.GzipFile(fileobj=packed, mode="rb") as lines:
            for line in lines:
                yield json.loads(line)
    except (OSError, EOFError, ValueError) as error:
        raise ArchiveError(
            f"archive file {name} cannot be read: {error}; restore it from a copy (the archive "
            "is the only place its jobs are kept)"
        ) from error


class Archive(ABC):
    """The interface every archive backend keeps; open one with
    :func:`exactly.delivery.archive.open_archive`. Backends store and fetch whole files."""

    url: str

    def describe(self) -> str:
        """The URL with its secrets masked, for messages."""
        return redact(self.url)

    def write(self, name: str, records: Iterable[dict[str, Any]]) -> str:
        """Store ``records`` as archive file ``name``; where it is, once complete and durable."""
        if not is_archive_name(name):
            raise ValueError(f"{name!r} is not an archive file name (see archive_name)")
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            encode(records, spool)  # a failing iterator leaves nothing stored
            size = spool.tell()
            spool.seek(0)
            self._store(name, spool, size)
        return self.location(name)

    def names(self) -> list[str]:
        """Every archive file, oldest dataset first (other files are ignored)."""
        return sorted(name for name in self._list() if is_archive_name(name))

    def records(self, name: str) -> Iterator[dict[str, Any]]:
        """The jobs of archive file ``name``, each with its transitions, in job id order."""
        if not is_archive_name(name):
            raise ValueError(f"{name!r} is not an archive file name")
        with self._open(name) as packed:
            yield from decode(packed, self.location(name))

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`ArchiveError` in one line if the archive cannot be written."""

    @abstractmethod
    def location(self, name: str) -> str:
        """Where file ``name`` is, for messages (a path or an ``s3://`` URL)."""

    @abstractmethod
    def _store(self, name: str, data: IO[bytes], size: int) -> None:
        """Store ``size`` bytes from ``data`` as ``name``: complete, durable, replacing."""

    @abstractmethod
    def _list(self) -> Iterable[str]:
        """The names of the files in the archive."""

    @abstractmethod
    def _open(self, name: str) -> Any:
        """A readable binary file object of ``name`` (a context manager)."""
