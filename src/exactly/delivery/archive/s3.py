"""The archive in S3 or an S3-compatible store (``s3://BUCKET/PREFIX``, the ``s3`` extra: boto3).

Credentials, region and endpoint come from the standard AWS chain (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``~/.aws/config``, an
instance role; ``AWS_REGION``; ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``). The URL may
override three of them for this archive only: ``?endpoint=http://HOST:PORT`` (MinIO, Ceph, R2,
moto ...), ``region=`` and ``profile=``. Secrets never go in the URL.

Guarantee: :meth:`S3Archive.write` returns once S3 acknowledged the whole object under its final
key and a ``HEAD`` of that key shows its full length. S3 makes an object visible only when its
upload completes (one ``PUT`` up to 256 MB, a completed multipart upload above), and acknowledges
only what it stored durably; rewriting a key replaces the object whole. One writer per archive.
A crash during a multipart upload leaves an incomplete upload, invisible but billed: give the
bucket a lifecycle rule that aborts incomplete multipart uploads after a day.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import IO, Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import boto3
import botocore.exceptions
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from exactly.delivery.archive.base import Archive
from exactly.errors import ArchiveError, ConfigError

T = TypeVar("T")
OPTIONS = ("endpoint", "region", "profile")
_HINT = (
    "check the bucket, the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
    "AWS_PROFILE) and the endpoint (?endpoint= or AWS_ENDPOINT_URL_S3)"
)


class S3Archive(Archive):
    """Archive objects under ``s3://bucket/prefix/``."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        if parts.username or parts.password:
            raise ConfigError(
                f"archive URL {self.describe()!r}: S3 credentials do not go in the URL; set "
                "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
            )
        self.bucket = parts.hostname or ""
        if not self.bucket:
            raise ConfigError(
                f"archive URL {self.describe()!r} names no bucket: s3://BUCKET/PREFIX"
            )
        self.prefix = parts.path.strip("/")
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"archive URL {self.describe()!r}: unknown option {unknown[0]!r} "
                f"(known: {', '.join(OPTIONS)})"
            )
        try:
            session = boto3.session.Session(
                profile_name=options.get("profile") or None,
                region_name=options.get("region") or None,
            )
            self._client: Any = session.client(
                "s3",
                endpoint_url=options.get("endpoint") or None,
                config=Config(connect_timeout=10, read_timeout=60),
            )
        except (botocore.exceptions.BotoCoreError, ValueError) as error:
            raise ConfigError(f"archive URL {self.describe()!r}: {error}") from error
        self._transfer = TransferConfig(
            multipart_threshold=256 << 20, multipart_chunksize=64 << 20, use_threads=False
        )

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def location(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def _call(self, what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return function(*args, **kwargs)
        except botocore.exceptions.ClientError as error:
            answer = error.response.get("Error", {})
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            why = f"{answer.get('Code') or status} {answer.get('Message') or ''}".strip()
            raise ArchiveError(
                f"the archive {self.describe()}: {what} failed ({why}); {_HINT}"
            ) from error
        except botocore.exceptions.BotoCoreError as error:
            raise ArchiveError(
                f"the archive {self.describe()}: {what} failed ({error}); {_HINT}"
            ) from error

    def check(self) -> None:
        self._call(f"reaching bucket {self.bucket!r}", self._client.head_bucket, Bucket=self.bucket)

    def _store(self, name: str, data: IO[bytes], size: int) -> None:
        key = self.key(name)
        self._call(
            f"writing {key}",
            self._client.upload_fileobj,
            data,
            self.bucket,
            key,
            ExtraArgs={"ContentType": "application/gzip"},
            Config=self._transfer,
        )
        stored = self._call(
            f"checking {key}", self._client.head_object, Bucket=self.bucket, Key=key
        )
        if int(stored["ContentLength"]) != size:
            raise ArchiveError(
                f"the archive {self.describe()}: {key} holds {stored['ContentLength']} bytes "
                f"after writing {size}: does another writer use the same bucket and prefix? "
                "Check it, then run again (the dataset stays in the JobDB until its file is whole)"
            )

    def _list(self) -> Iterable[str]:
        start = f"{self.prefix}/" if self.prefix else ""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=start, Delimiter="/"
        )
        names: list[str] = []

        def collect() -> None:
            for page in pages:
                names.extend(item["Key"][len(start) :] for item in page.get("Contents", []))

        self._call("listing", collect)
        return names

    def _open(self, name: str) -> Any:
        key = self.key(name)
        found = self._call(f"reading {key}", self._client.get_object, Bucket=self.bucket, Key=key)
        return contextlib.closing(_Body(self, key, found["Body"]))


class _Body:
    """An object's body as a file for gzip, its read errors as :class:`ArchiveError`."""

    def __init__(self, archive: S3Archive, key: str, body: Any) -> None:
        self._archive, self._key, self._body = archive, key, body

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._archive._call(f"reading {self._key}", self._body.read, size)
        return data

    def close(self) -> None:
        self._body.close()
