"""The archive in a directory (``file://DIR`` or a path; the default is ``DATA_DIR/archive``).

Guarantee: :meth:`DirectoryArchive.write` returns once the file is complete and synced under its
final name: written to a hidden temporary name (``.NAME.partial``), fsynced, renamed over the
final name, and the directory fsynced, so a crash leaves either the old file or the new one, never
part of one. One writer per archive (the director holding the JobDB's lock); any number of readers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from exactly.delivery.archive.base import Archive
from exactly.errors import ArchiveError


class DirectoryArchive(Archive):
    """Archive files in ``directory``."""

    def __init__(self, directory: Path, url: str | None = None) -> None:
        self.directory = directory
        self.url = url or str(directory)

    def check(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ArchiveError(
                f"the archive directory {self.directory} cannot be created: "
                f"{error.strerror or error}; check the archive setting ([delivery] archive) and "
                "the permissions of its parent directory"
            ) from error
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ArchiveError(
                f"the archive directory {self.directory} is not writable: give the user running "
                "exactly write access to it, or set another [delivery] archive"
            )

    def location(self, name: str) -> str:
        return str(self.directory / name)

    def _store(self, name: str, data: IO[bytes], size: int) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / name
        partial = self.directory / f".{name}.partial"
        with partial.open("wb") as raw:
            shutil.copyfileobj(data, raw, 1 << 20)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, final)
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def _list(self) -> Iterable[str]:
        with contextlib.suppress(FileNotFoundError):
            return [entry.name for entry in os.scandir(self.directory) if entry.is_file()]
        return []

    def _open(self, name: str) -> Any:
        try:
            return (self.directory / name).open("rb")
        except FileNotFoundError as error:
            raise ArchiveError(
                f"no archive file {self.directory / name}: it was moved or removed; put it back "
                "(the archive is the only place its jobs are kept)"
            ) from error
