"""The body budget of one worker (issue 33): room taken, waited for, given back; half of it for
bodies whose write key is not in a header."""

from __future__ import annotations

import asyncio

import pytest

from exactly.collector.memory import BodyBudget, tune_malloc
from exactly.errors import ConfigError


def test_holds_take_room_until_released_and_unkeyed_bodies_get_half() -> None:
    async def run() -> None:
        budget = BodyBudget(100, wait=0.05)
        first = budget.hold(keyed=True)
        assert await first.grow(60)
        unkeyed = budget.hold(keyed=False)
        assert not await unkeyed.grow(1)  # 60 used: past the unkeyed half
        keyed = budget.hold(keyed=True)
        assert await keyed.grow(40)
        assert not await budget.hold(keyed=True).grow(1)
        first.release()
        first.release()  # twice is once
        assert budget.used == 40
        assert await unkeyed.grow(10)
        keyed.release()
        unkeyed.release()
        assert budget.used == 0

    asyncio.run(run())


def test_a_waiting_body_gets_the_room_released_meanwhile() -> None:
    async def run() -> None:
        budget = BodyBudget(100, wait=5)
        full = budget.hold(keyed=True)
        assert await full.grow(100)
        asyncio.get_running_loop().call_later(0.05, full.release)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await budget.hold(keyed=True).grow(70)
        assert loop.time() - started < 1

    asyncio.run(run())


def test_malloc_is_tuned_on_glibc() -> None:
    assert tune_malloc()


def test_collect_refuses_to_start_in_one_line_without_files_for_its_caps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exactly.collector import server

    monkeypatch.setattr(server.resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(server.resource, "setrlimit", lambda *_: None)
    with pytest.raises(ConfigError, match=r"open-file limit \(4096\) is below the 10256"):
        server.check_file_limit(10_000, 1)
    assert server.check_file_limit(3_000, 1) == 3_000


def test_behind_the_front_each_connection_counts_two_files(monkeypatch: pytest.MonkeyPatch) -> None:
    from exactly.collector import server

    monkeypatch.setattr(server.resource, "getrlimit", lambda _: (1024, 20_000))
    monkeypatch.setattr(server.resource, "setrlimit", lambda *_: None)
    assert server.check_file_limit(8192, 1, front=True) == 8192  # 16,448 files
    with pytest.raises(ConfigError, match=r"below the 20064 .*\(2 files x 10000 connections"):
        server.check_file_limit(10_000, 1, front=True)
    assert server.check_file_limit(10_000, 1) == 10_000  # granian alone: 10,256


def test_a_start_removes_the_front_directories_of_killed_collectors() -> None:
    import os
    import shutil

    from exactly.collector import server

    created = server._front_directory()
    base = os.path.dirname(created)
    stale = os.path.join(base, f"{server.FRONT_PREFIX}999999999-abcdefgh")  # above any pid_max
    os.mkdir(stale)
    again = server._front_directory()
    try:
        assert not os.path.exists(stale)
        assert os.path.isdir(created) and os.path.isdir(again)  # this process is alive
        assert len(os.path.join(again, "4294967295_" + "f" * 39)) <= 107
    finally:
        shutil.rmtree(created)
        shutil.rmtree(again)
