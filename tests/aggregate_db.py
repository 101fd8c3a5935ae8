"""Aggregate databases for tests: a SQLite file, or a fresh schema in the local PostgreSQL."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from exactly.aggregate import BACKENDS
from tests.servers import free_port

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
__all__ = ["BACKENDS", "Proxy", "database", "postgres_missing", "postgres_schema"]


def postgres_missing() -> str | None:
    """None when the PostgreSQL at 127.0.0.1:5432 (database ``test``) answers, else why not."""
    try:
        import psycopg
    except ImportError:
        return "PostgreSQL tests need psycopg: pip install -e '.[dev]'"
    try:
        with psycopg.connect(POSTGRES, connect_timeout=3):
            return None
    except psycopg.Error as error:
        return f"no PostgreSQL at {POSTGRES}: {str(error).strip().splitlines()[0]}"


@contextlib.contextmanager
def postgres_schema(base: str = POSTGRES) -> Iterator[str]:
    """A URL whose tables live in a new schema, dropped afterwards."""
    import psycopg

    schema = f"exactly_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{base}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@contextlib.contextmanager
def database(backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty aggregate database of ``backend``; skips when PostgreSQL is absent."""
    from tests.conftest import require

    if backend == "sqlite":
        yield f"sqlite://{tmp_path / 'aggregates.db'}"
        return
    if backend == "postgresql":
        require(postgres_missing())
        with postgres_schema() as url:
            yield url
        return
    raise AssertionError(f"no test database for the aggregate backend {backend!r}: add one here")


class Proxy:
    """A TCP forwarder to PostgreSQL that can be taken down (refusing, connections cut) and up."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        import socket

        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self.up()

    def up(self) -> None:
        import socket
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and cut the open ones, as a server that went away."""
        import socket

        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept()
            self._listener.close()
            self._listener = None
        for sock in self._open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.clear()

    def _accept(self, listener: object) -> None:
        import socket
        import threading

        assert isinstance(listener, socket.socket)
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: object, sink: object) -> None:
        import socket

        assert isinstance(source, socket.socket) and isinstance(sink, socket.socket)
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
