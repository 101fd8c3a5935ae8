"""The archive family: finished jobs with their history, before their dataset is dropped.

The interface is in ``base.py`` with one module per backend beside it: ``directory.py``
(``file://DIR`` or a plain path, the default ``DATA_DIR/archive``) and ``s3.py``
(``s3://BUCKET/PREFIX``, the ``s3`` extra: boto3). :func:`open_archive` imports a backend only
when asked for; :data:`BACKENDS` lists the schemes the contract suite runs on.
"""

from __future__ import annotations

from pathlib import Path

from exactly.delivery.archive.base import Archive, archive_name
from exactly.errors import ConfigError, EnvironmentProblem
from exactly.urls import redact

__all__ = ["BACKENDS", "Archive", "archive_name", "open_archive"]

BACKENDS = ["file", "s3"]


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
