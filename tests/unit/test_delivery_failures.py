"""failures.failure: the exceptions the director's client really raises against misbehaving local
sockets, told in one readable line with the host and port, never a library's repr or the URL's
credentials."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from exactly.delivery.client import Client, ConnectFailed, CutShort, Disconnected, Malformed
from exactly.delivery.failures import failure

Handler = Callable[[socket.socket], None]


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], int]]:
    """Start a raw TCP server on 127.0.0.1 answering each connection with a handler; its port."""
    listeners: list[socket.socket] = []

    def start(handler: Handler) -> int:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listeners.append(listener)

        def accept() -> None:
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=handler, args=(connection,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return int(listener.getsockname()[1])

    yield start
    for listener in listeners:
        listener.close()


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def attempt(url: str, *, headers: dict[str, str] | None = None, timeout: float = 5.0) -> Exception:
    """The exception one request raises, sent as the director sends it."""

    async def send() -> Exception:
        client = Client(url)
        try:
            await client.post(b"{}", headers or {}, timeout)
        except Exception as error:  # noqa: BLE001 (what is raised is what is tested)
            return error
        finally:
            client.close()
        raise AssertionError(f"{url} was answered")

    return asyncio.run(send())


def told(url: str, error: Exception, timeout: float = 5.0) -> tuple[str, str]:
    kind, text = failure(error, timeout=timeout, url=url)
    assert "\n" not in text and len(text) <= 300
    assert not any(mark in text for mark in ("ssl:default", "Errno", "^", "<", "message="))
    return kind, text


def close_at_once(connection: socket.socket) -> None:
    connection.recv(65536)
    connection.close()


def answer_with(data: bytes) -> Handler:
    def handler(connection: socket.socket) -> None:
        connection.recv(65536)
        connection.sendall(data)
        connection.close()

    return handler


def test_a_connection_closed_before_the_status_line(serve: Callable[[Handler], int]) -> None:
    port = serve(close_at_once)
    url = f"http://127.0.0.1:{port}/hook"
    error = attempt(url)
    assert isinstance(error, Disconnected)
    assert told(url, error) == (
        "disconnected",
        f"connection closed before the status line (by 127.0.0.1:{port})",
    )


def test_garbage_instead_of_http_is_a_malformed_answer(serve: Callable[[Handler], int]) -> None:
    port = serve(answer_with(b"HELLO THERE\r\n\r\n"))
    url = f"http://127.0.0.1:{port}/hook"
    error = attempt(url)
    assert isinstance(error, Malformed)
    kind, text = told(url, error)
    assert kind == "malformed"
    assert text.startswith(f"malformed answer from 127.0.0.1:{port}: Bad status line")
    assert "HELLO" not in text and "message=" not in text


def test_a_bad_header_is_a_malformed_answer(serve: Callable[[Handler], int]) -> None:
    port = serve(answer_with(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"))
    url = f"http://127.0.0.1:{port}/hook"
    kind, text = told(url, attempt(url))
    assert (kind, text) == (
        "malformed",
        f"malformed answer from 127.0.0.1:{port}: Invalid character in Content-Length",
    )


def test_a_body_cut_short(serve: Callable[[Handler], int]) -> None:
    port = serve(answer_with(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc"))
    url = f"http://127.0.0.1:{port}/hook"
    error = attempt(url)
    assert isinstance(error, CutShort)
    kind, text = told(url, error)
    assert kind == "cut-short"
    assert text == ("the answer's body was cut short: the connection closed after 3 of 100 bytes")


def test_https_to_a_plain_http_port_is_a_failed_tls_handshake(
    serve: Callable[[Handler], int],
) -> None:
    port = serve(answer_with(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
    url = f"https://127.0.0.1:{port}/hook"
    error = attempt(url)
    assert isinstance(error, ConnectFailed) and isinstance(error.os_error, ssl.SSLError)
    kind, text = told(url, error)
    assert kind == "tls"
    assert text.startswith(f"TLS handshake failed with 127.0.0.1:{port}: ")
    assert "_ssl.c" not in text and "[SSL" not in text


def test_https_to_a_port_that_closes_is_a_failed_tls_handshake(
    serve: Callable[[Handler], int],
) -> None:
    port = serve(close_at_once)
    url = f"https://127.0.0.1:{port}/hook"
    kind, text = told(url, attempt(url))
    assert (kind, text.startswith(f"TLS handshake failed with 127.0.0.1:{port}")) == ("tls", True)


def test_a_refused_port() -> None:
    port = refused_port()
    url = f"http://127.0.0.1:{port}/hook"
    assert told(url, attempt(url)) == ("refused", f"connection refused by 127.0.0.1:{port}")


def test_no_answer_within_the_timeout(serve: Callable[[Handler], int]) -> None:
    port = serve(lambda connection: (connection.recv(65536), time.sleep(2), connection.close()))
    url = f"http://127.0.0.1:{port}/hook"
    error = attempt(url, timeout=0.3)
    assert isinstance(error, TimeoutError)
    assert told(url, error, timeout=0.3) == ("timeout", "no answer within 0.3 s")


def test_a_host_that_does_not_resolve() -> None:
    url = "http://no-such-host.invalid/hook"
    kind, text = told(url, attempt(url))
    assert kind == "dns" and text.startswith("cannot resolve no-such-host.invalid: ")


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(
    serve: Callable[[Handler], int],
) -> None:
    """A messageId is the event's: one holding a line break must not split the request."""
    seen: list[bytes] = []
    port = serve(lambda connection: seen.append(connection.recv(65536)))
    url = f"http://user:s3cretpass@127.0.0.1:{port}/hook?token=t0psecret"
    for headers in ({"Idempotency-Key": "m1\r\nX-Injected: 1"}, {"X-A\nB": "v"}):
        error = attempt(url, headers=headers)
        assert type(error) is ValueError
        kind, text = told(url, error)
        assert (kind, text) == (
            "request",
            "request could not be built: ValueError: a header name or value holds a line break",
        )
    assert seen == []


def test_a_host_the_resolver_cannot_encode_never_shows_the_credentials() -> None:
    label = "http://user:s3cretpass@" + "a" * 64 + ".example/hook?token=t0psecret"
    kind, text = told(label, attempt(label))
    assert kind == "request" and "label empty or too long" in text
    assert "s3cretpass" not in text and "t0psecret" not in text


def test_any_other_exception_is_the_request_s_failure() -> None:
    kind, text = told("http://h/", RuntimeError("no\nway"))
    assert (kind, text) == ("request", "request could not be built: RuntimeError: no way")
