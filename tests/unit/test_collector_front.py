"""The connection front's admission policy (issue 33): per address (IPv6 per /64) and in all,
the least recently active connection closed first; the address read back from a socket name."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from exactly.collector.front import Client, Front, FrontSettings, address_of
from exactly.collector.ratelimit import client_key

Opener = Callable[..., Callable[[str], Client]]


class Transport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def opener() -> Iterator[Opener]:
    loop = asyncio.new_event_loop()

    def make(per_address: int, total: int = 1000) -> Callable[[str], Client]:
        async def build() -> Front:
            return Front(FrontSettings("/d", per_address, total, 5.0, 100))

        front = loop.run_until_complete(build())

        def open_from(address: str) -> Client:
            client = Client(front)
            client.transport = Transport()  # type: ignore[assignment]
            client.address, client.key = address, client_key(address)
            front.admit(client)
            return client

        return open_from

    yield make
    loop.close()


def closed(client: Client) -> bool:
    return client.transport.closed  # type: ignore[attr-defined, no-any-return]


def test_an_address_over_its_cap_loses_its_least_recently_active(opener: Opener) -> None:
    open_from = opener(per_address=2)
    first, second = open_from("10.0.0.1"), open_from("10.0.0.1")
    other = open_from("10.0.0.2")
    first.front.touch(first)
    third = open_from("10.0.0.1")
    assert closed(second) and not closed(first) and not closed(third) and not closed(other)


def test_a_cap_of_one_keeps_the_newest(opener: Opener) -> None:
    open_from = opener(per_address=1)
    first = open_from("10.0.0.1")
    second = open_from("10.0.0.1")
    third = open_from("10.0.0.1")
    assert closed(first) and closed(second) and not closed(third)
    assert list(third.front.by_address["10.0.0.1"]) == [third]


def test_ipv6_addresses_share_their_64s_cap(opener: Opener) -> None:
    open_from = opener(per_address=2)
    a, b = open_from("2001:db8::1"), open_from("2001:db8::2")
    c = open_from("2001:db8::3:4")
    assert closed(a) and not closed(b) and not closed(c)
    assert not closed(open_from("2001:db8:0:1::1"))  # another /64


def test_the_total_cap_closes_the_least_recently_active_of_all(opener: Opener) -> None:
    open_from = opener(per_address=10, total=3)
    a, b, c = open_from("10.0.0.1"), open_from("10.0.0.2"), open_from("10.0.0.3")
    a.front.touch(a)
    d = open_from("10.0.0.4")
    assert closed(b) and not any(closed(x) for x in (a, c, d))
    assert len(d.front.everyone) == 3 and "10.0.0.2" not in d.front.by_address


def test_the_address_comes_back_from_the_socket_name_only_in_the_front_directory() -> None:
    assert address_of("/d/17_127.0.0.2", "/d") == "127.0.0.2"
    assert address_of("/d/3_2001:db8::1", "/d") == "2001:db8::1"
    assert address_of("/elsewhere/3_10.0.0.1", "/d") is None
    assert address_of("", "/d") is None
