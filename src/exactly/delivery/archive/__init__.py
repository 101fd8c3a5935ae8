"""The archive family: finished jobs with their history, before their dataset is dropped.

The interface is in ``base.py`` with one module per backend beside it: ``directory.py``
(``file://DIR`` or a plain path, the default ``DATA_DIR/archive``) and ``s3.py``
(``s3://BUCKET/PREFIX``, the ``s3`` extra: boto3). :func:`open_archive` imports a backend only
when asked for; :data:`BACKENDS` lists the schemes the contract suite runs on. ``apart.py`` is
the child process in which a director writes a dataset's file (:func:`reopens` says whether an
archive can be written there).
"""

from __future__ import annotations

from pathlib import Path

from exactly.delivery.archive.base import Archive, archive_name
from exactly.errors import ConfigError, EnvironmentProblem
from exactly.urls import redact

__all__ = ["BACKENDS", "Archive", "archive_name", "open_archive", "reopens"]

BACKENDS = ["file", "s3"]
_KINDS = {  # what open_archive makes of each scheme: (module, class)
    "file": ("exactly.delivery.archive.directory", "DirectoryArchive"),
    "s3": ("exactly.delivery.archive.s3", "S3Archive"),
}


def open_archive(url: str) -> Archive:
    """The archive at ``url``: a directory path, ``file://DIR`` or ``s3://BUCKET/PREFIX``."""
    scheme = url.partition("://")[0] if "://" in url else "file"
    if scheme not in BACKENDS or not url.strip():
        raise ConfigError(
            f"archive URL {redact(url)!r} is not understood: use a directory, file://DIR or "
            "s3://BUCKET/PREFIX"
        )
    if scheme == "file":
        from exactly.delivery.archive.directory import DirectoryArchive

        directory = url.removeprefix("file://")
        if not directory:
            raise ConfigError(f"archive URL {url!r} names no directory: file://DIR")
        return DirectoryArchive(Path(directory), url)
    try:
        from exactly.delivery.archive.s3 import S3Archive
    except ImportError as error:
        raise EnvironmentProblem(
            f"the S3 archive needs the s3 extra: pip install 'exactly[s3]' ({error})"
        ) from error
    return S3Archive(url)


def reopens(archive: Archive) -> bool:
    """Whether :func:`open_archive` of ``archive.url`` makes the same kind of archive, so
    another process can write to it (an archive made in code, a subclass of a test's, cannot be
    made from its URL)."""
    url = archive.url
    scheme = url.partition("://")[0] if "://" in url else "file"
    kind = type(archive)
    return _KINDS.get(scheme) == (kind.__module__, kind.__qualname__)
