"""Archives for tests: a directory, or a fresh bucket on moto's standalone S3 server.

:class:`MotoServer` runs moto's real HTTP S3 API (``moto[server]``) on a free loopback port in a
thread of the test process, with test credentials in the environment (inherited by the
subprocesses tests start), and no AWS config file read.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.servers import free_port

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


def moto_missing() -> str | None:
    try:
        import boto3  # noqa: F401
        from moto.server import ThreadedMotoServer  # noqa: F401
    except ImportError:
        return "S3 archive tests need boto3 and moto[server]: pip install -e '.[dev]'"
    return None


class MotoServer:
    """moto's S3 server on 127.0.0.1:<free port>; ``endpoint`` is its URL."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._saved: dict[str, str | None] = {}
        self._server: Any = None

    def __enter__(self) -> MotoServer:
        from moto.server import ThreadedMotoServer

        for name, value in AWS_ENV.items():
            self._saved[name] = os.environ.get(name)
            os.environ[name] = value
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stop()
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"exactly-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def url(self, prefix: str = "archive") -> str:
        """``s3://<new bucket>/<prefix>?endpoint=<this server>``."""
        return f"s3://{self.bucket()}/{prefix}?endpoint={self.endpoint}"


@contextlib.contextmanager
def archive_url(backend: str, tmp_path: Path, s3: MotoServer | None) -> Iterator[str]:
    """The URL of an empty archive of ``backend``."""
    if backend == "file":
        yield f"file://{tmp_path / 'archive'}"
    elif backend == "s3":
        assert s3 is not None, "the s3 archive needs the moto server fixture"
        yield s3.url()
    else:
        raise AssertionError(
            f"no test archive for backend {backend!r}: add one to tests/archives.py"
        )
