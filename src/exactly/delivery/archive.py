"""Where finished jobs go before their dataset is dropped: gzip JSON-lines files in a directory.

Guarantee: :meth:`DirectoryArchive.write` returns once the file is complete and synced under its
final name (written to a temporary name, fsynced, renamed, the directory fsynced), so a dataset
is dropped only after its archive survives a crash. Writing the same dataset again (after a crash
between the write and the drop) replaces the file with the same content: one file per dataset.
The S3 archive (``s3://bucket/prefix``) is a later step of issue 13.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exactly.delivery.base import Dataset
from exactly.errors import ConfigError


def archive_name(dataset: Dataset) -> str:
    """``jobs-<created, UTC>-<first job id>-<dataset>``: unique even if a JobDB is recreated."""
    created = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(dataset.created_at))
    return f"jobs-{created}-{dataset.first_id}-{dataset.number}.jsonl.gz"


class DirectoryArchive:
    """Archive files in ``directory`` (default ``DATA_DIR/archive``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, name: str, records: Iterable[dict[str, Any]]) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / name
        partial = self.directory / f".{name}.partial"
        with partial.open("wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed:
                for record in records:
                    packed.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, final)
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return final


def read_archive(path: Path) -> list[dict[str, Any]]:
    """Every record of one archive file."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def open_archive(url: str) -> DirectoryArchive:
    """The archive at ``url``: a directory path or ``file://DIR``."""
    if url.startswith("s3://"):
        raise ConfigError("the S3 archive is not built yet: use a directory for [delivery] archive")
    return DirectoryArchive(Path(url.removeprefix("file://")))
