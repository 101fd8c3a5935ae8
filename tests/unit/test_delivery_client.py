"""The director's HTTP/1.1 client against raw sockets: what it writes, how it reads each kind of
answer, and when it reuses a connection."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from exactly.delivery.client import Answer, Client, ConnectFailed, Disconnected
from exactly.delivery.failures import failure
from exactly.delivery.jobdb.base import MAX_RESPONSE

CLOSE = b"<close>"  # at the end of an answer: the connection is closed once it is sent
HOLD = b"<hold>"  # instead of an answer: none is sent, the connection is kept open


class Peer:
    """A TCP server on 127.0.0.1 answering each request it reads with the next of ``answers``
    (bytes, :data:`HOLD`, or None to close the connection); it keeps what it read and counts
    connections."""

    def __init__(self, answers: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.answers = answers
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        if self.tls is not None:
            try:
                connection = self.tls.wrap_socket(connection, server_side=True)
            except (ssl.SSLError, OSError):  # the client refused the certificate
                connection.close()
                return
        with connection:
            buffer = b""
            while self.answers:
                while b"\r\n\r\n" not in buffer:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(rest) < length:
                    rest += connection.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + rest[:length])
                buffer = rest[length:]
                answer = self.answers.pop(0)
                if answer is None:
                    return
                if answer == HOLD:
                    connection.recv(1)
                    return
                connection.sendall(answer.removesuffix(CLOSE))
                if answer.endswith(CLOSE):
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def peer() -> Iterator[Callable[[list[bytes | None]], Peer]]:
    peers: list[Peer] = []

    def start(answers: list[bytes | None]) -> Peer:
        peers.append(Peer(answers))
        return peers[-1]

    yield start
    for one in peers:
        one.close()


def posts(url: str, *bodies: bytes, headers: dict[str, str] | None = None) -> list[Answer]:
    async def send() -> list[Answer]:
        client = Client(url)
        try:
            async with asyncio.timeout(5):
                return [await client.post(body, headers or {}, 5) for body in bodies]
        finally:
            client.close()

    return asyncio.run(send())


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_the_request_it_writes(peer: Callable[[list[bytes | None]], Peer]) -> None:
    server = peer([OK])
    url = f"http://jo:p%40ss@127.0.0.1:{server.port}/hook/in?a=1&b=%20"
    (answer,) = posts(url, b'{"x":1}', headers={"Idempotency-Key": "m-1", "X-Extra": "é"})
    assert answer == Answer(200, None, b"ok")
    auth = base64.b64encode(b"jo:p@ss").decode()
    assert server.requests == [
        (
            "POST /hook/in?a=1&b=%20 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{server.port}\r\n"
            "User-Agent: exactly-delivery\r\n"
            f"Authorization: Basic {auth}\r\n"
            "Idempotency-Key: m-1\r\n"
            "X-Extra: é\r\n"
            "Content-Length: 7\r\n\r\n"
            '{"x":1}'
        ).encode()
    ]


def test_one_connection_is_kept_for_answer_after_answer(
    peer: Callable[[list[bytes | None]], Peer],
) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    server = peer([OK, chunked, b"HTTP/1.1 204 No Content\r\n\r\n", OK])
    answers = posts(f"http://127.0.0.1:{server.port}/", b"1", b"2", b"3", b"4")
    assert [(one.status, one.body) for one in answers] == [
        (200, b"ok"),
        (200, b"ok"),
        (204, b""),
        (200, b"ok"),
    ]
    assert server.connections == 1


def test_connection_close_and_http_1_0_answers_end_their_connection(
    peer: Callable[[list[bytes | None]], Peer],
) -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server = peer([closing, OK])
    assert [one.status for one in posts(f"http://127.0.0.1:{server.port}/", b"1", b"2")] == [
        200,
        200,
    ]
    assert server.connections == 2
    # an HTTP/1.0 answer without a length ends where its connection does
    unframed = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 7\r\n\r\nbusy now"
    server = peer([unframed + CLOSE, OK])
    answers = posts(f"http://127.0.0.1:{server.port}/", b"1", b"2")
    assert answers == [Answer(503, "7", b"busy now"), Answer(200, None, b"ok")]
    assert server.connections == 2


def test_an_interim_answer_is_skipped(peer: Callable[[list[bytes | None]], Peer]) -> None:
    server = peer([b"HTTP/1.1 100 Continue\r\n\r\n" + OK])
    assert posts(f"http://127.0.0.1:{server.port}/", b"1") == [Answer(200, None, b"ok")]


def test_a_long_answer_is_kept_to_its_first_bytes(
    peer: Callable[[list[bytes | None]], Peer],
) -> None:
    body = b"x" * (MAX_RESPONSE * 3)
    long = b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    server = peer([long, OK])
    answers = posts(f"http://127.0.0.1:{server.port}/", b"1", b"2")
    assert answers[0] == Answer(500, None, b"x" * MAX_RESPONSE)
    assert answers[1].status == 200 and server.connections == 1  # read to its end, then reused


def test_a_connection_the_peer_closed_while_idle_is_not_reused(
    peer: Callable[[list[bytes | None]], Peer],
) -> None:
    server = peer([OK + CLOSE, OK])

    async def send() -> list[int]:
        client = Client(f"http://127.0.0.1:{server.port}/")
        statuses = [(await client.post(b"1", {}, 5)).status]
        await asyncio.sleep(0.2)  # the close arrives while the connection is idle
        statuses.append((await client.post(b"2", {}, 5)).status)
        client.close()
        return statuses

    assert asyncio.run(send()) == [200, 200]
    assert server.connections == 2


def test_a_request_cancelled_midway_closes_its_connection(
    peer: Callable[[list[bytes | None]], Peer],
) -> None:
    server = peer([HOLD])

    async def send() -> None:
        client = Client(f"http://127.0.0.1:{server.port}/")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.post(b"1", {}, 5)
        assert client._idle == []
        client.close()

    asyncio.run(send())


def test_no_answer_within_the_timeout(peer: Callable[[list[bytes | None]], Peer]) -> None:
    """Timed from the call; the connection is closed, not kept for the next request."""
    server = peer([HOLD, OK])

    async def send() -> tuple[float, int]:
        client = Client(f"http://127.0.0.1:{server.port}/")
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await client.post(b"1", {}, 0.3)
        waited = loop.time() - started
        status = (await client.post(b"2", {}, 5)).status
        client.close()
        return waited, status

    waited, status = asyncio.run(send())
    assert 0.3 <= waited < 1.0 and status == 200
    assert server.connections == 2


def test_a_peer_that_closes_before_answering_is_disconnected(
    peer: Callable[[list[bytes | None]], Peer],
) -> None:
    server = peer([None])
    with pytest.raises(Disconnected):
        posts(f"http://127.0.0.1:{server.port}/", b"1")


def test_https_to_a_certificate_the_system_trusts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    authority = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(served)
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))  # the system's trust, here
    server = Peer([OK, OK], tls=served)
    try:
        answers = posts(f"https://localhost:{server.port}/", b"1", b"2")
    finally:
        server.close()
    assert [one.status for one in answers] == [200, 200]
    assert server.connections == 1
    assert server.requests[0].startswith(
        f"POST / HTTP/1.1\r\nHost: localhost:{server.port}\r\n".encode()
    )


@pytest.mark.parametrize(
    ("issued_for", "trusted", "says"),
    [
        ("localhost", False, "unable to get local issuer certificate"),
        ("other.example", True, "Hostname mismatch"),
    ],
)
def test_https_to_a_certificate_not_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, issued_for: str, trusted: bool, says: str
) -> None:
    authority = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(issued_for).configure_cert(served)
    if trusted:
        authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    server = Peer([OK], tls=served)
    url = f"https://localhost:{server.port}/hook"
    try:
        with pytest.raises(ConnectFailed) as refused:
            posts(url, b"1")
    finally:
        server.close()
    kind, text = failure(refused.value, timeout=5, url=url)
    assert kind == "certificate"
    assert text.startswith(f"TLS certificate of localhost:{server.port} not accepted: ")
    assert says in text
