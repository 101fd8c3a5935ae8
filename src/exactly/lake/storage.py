"""Listing and removing a lake table's files, on a local directory or in S3 (through
``pyarrow.fs``): what vacuum needs beyond what the formats' libraries do themselves."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlparse

import pyarrow.fs as pafs  # type: ignore[import-untyped]


@dataclass(frozen=True)
class S3:
    """Where S3 is and how to sign in; each unset value falls back to the ``AWS_*`` variable."""

    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    region: str | None = None

    def filesystem(self) -> pafs.FileSystem:
        endpoint = self.endpoint or os.environ.get("AWS_ENDPOINT_URL")
        scheme, override = "https", None
        if endpoint:
            parsed = urlparse(endpoint)
            scheme, override = parsed.scheme or "https", parsed.netloc or parsed.path
        return pafs.S3FileSystem(
            access_key=self.access_key or os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_key=self.secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY"),
            region=self.region or os.environ.get("AWS_REGION") or "us-east-1",
            endpoint_override=override,
            scheme=scheme,
        )


def located(uri: str, s3: S3 | None = None) -> tuple[pafs.FileSystem, str]:
    """The file system holding ``uri`` (``s3://BUCKET/KEY``, ``file://PATH`` or a path) and the
    path of ``uri`` in it."""
    if uri.startswith(("s3://", "s3a://")):
        return (s3 or S3()).filesystem(), uri.split("://", 1)[1].rstrip("/")
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    return pafs.LocalFileSystem(), path.rstrip("/") or "/"


def old_files(
    filesystem: pafs.FileSystem, root: str, older_than: timedelta, skip: tuple[str, ...] = ()
) -> list[str]:
    """The files under ``root`` last changed more than ``older_than`` ago, as paths relative to
    it, except those under a top directory named in ``skip``."""
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    cutoff = time.time() - older_than.total_seconds()
    found = []
    for info in filesystem.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root) :].lstrip("/")
        if relative.split("/", 1)[0] in skip:
            continue
        if info.mtime is None or info.mtime.timestamp() <= cutoff:
            found.append(relative)
    return found


def remove(filesystem: pafs.FileSystem, root: str, relative: list[str]) -> None:
    for path in relative:
        filesystem.delete_file(f"{root}/{path}")
