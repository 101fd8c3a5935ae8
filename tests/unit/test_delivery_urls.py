"""A destination URL that can never work is refused when the settings load, in one line naming
``destinations[i].url``; each refused URL is first shown to fail with the director's client for
real, against a local server that answers every good request (issue 31, item 1). IPv4 shorthand
(``127.1``) is refused too, though the resolver takes it: it reaches another address than it
seems to name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from exactly.config import load_settings
from exactly.delivery.client import Client
from exactly.errors import ConfigError

LONG = "a" * 64
# (url with {port} of the local server, headers, what the refusal says)
NEVER = [
    ("ftp://127.0.0.1:{port}/hook", {}, "is not an http:// or https:// URL"),
    ("http://" + LONG + ".localhost:{port}/hook", {}, "cannot be looked up"),
    ("http://a..localhost:{port}/hook", {}, "cannot be looked up"),
    ("http://.localhost:{port}/hook", {}, "cannot be looked up"),
    ("http://u:s3cretpass@127.0.0.1:{port}/", {"Authorization": "Bearer t"}, "user info"),
    ("http://s3cretuser@127.0.0.1:{port}/", {"authorization": "Bearer t"}, "user info"),
    ("http://u:s3cretpass@127.0.0.1:{port}/", {"AUTHORIZATION": "Bearer t"}, "user info"),
    ("http://127.0.0.1:65536/hook", {}, "Port out of range"),
    ("http://127.0.0.1:99999/hook", {}, "Port out of range"),
    ("http://127.0.0.1:-1/hook", {}, "Port out of range"),
    ("http://127.0.0.1:8x/hook", {}, "port can't be converted"),
    ("http://127.0.0.1:0/hook", {}, "port 0"),
    ("http://[::1:{port}/hook", {}, "is not a valid URL"),
    ("http://[zz]:{port}/hook", {}, "is not a valid URL"),
    ("http://:{port}/hook", {}, "is not a valid URL"),
    ("http:///hook", {}, "has no host"),
    ("http://127.0.0.0.1:{port}/hook", {}, "is not an IPv4 address"),
    ("http://xn--zz.localhost:{port}/hook", {}, "cannot be looked up"),
    ("http://a\u200db.localhost:{port}/hook", {}, "is not a valid URL"),
    ("http://u:s3cretpass@\u2100.localhost:{port}/hook", {}, "is not a valid URL"),
]
# reached, but not where it seems: refused all the same
SHORTHAND = [("http://127.1:{port}/hook", {}, "is not an IPv4 address")]
# odd but working: each reaches the local server
FINE = [
    ("HTTP://127.0.0.1:{port}/hook", {}),
    ("http://127.0.0.1:{port}/h\u00e9 ok?x=1#part", {}),
    ("http://u:s3cretpass@127.0.0.1:{port}/hook", {"X-Key": "k"}),
    ("http://localhost:{port}/hook", {"Authorization": "Bearer t"}),
    ("http://@127.0.0.1:{port}/hook", {"Authorization": "Bearer t"}),
]


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """A local HTTP server answering 200 to any request, running on its own loop and thread."""
    import threading

    ready = threading.Event()
    found: list[int] = []
    loop = asyncio.new_event_loop()

    async def start() -> web.AppRunner:
        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        found.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    yield found[0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def send(url: str, headers: dict[str, str]) -> int | BaseException:
    """One POST as the director makes it: the status, or what its client raised."""

    async def post() -> int | BaseException:
        try:
            client = Client(url)
            try:
                return (await client.post(b"{}", headers, 5)).status
            finally:
                client.close()
        except Exception as error:  # noqa: BLE001 (what is raised is what is tested)
            return error

    return asyncio.run(post())


def load(tmp_path: Path, url: str, headers: dict[str, str]) -> None:
    config = tmp_path / "exactly.toml"
    config.write_text(
        '[[destinations]]\nname = "fine"\nurl = "http://127.0.0.1:9/ok"\n'
        f'[[destinations]]\nname = "hook"\nurl = {json.dumps(url)}\n'
        + "".join(f"headers.{name} = {json.dumps(value)}\n" for name, value in headers.items())
    )
    load_settings(config)


@pytest.mark.parametrize(("url", "headers", "says"), NEVER + SHORTHAND)
def test_a_url_that_can_never_work_is_refused_at_start_in_one_line(
    tmp_path: Path, port: int, url: str, headers: dict[str, str], says: str
) -> None:
    shorthand = (url, headers, says) in SHORTHAND
    url = url.format(port=port)
    answer = send(url, headers)
    if shorthand:
        assert answer == 200
    else:
        assert isinstance(answer, BaseException), f"the client sent to {url!r}: {answer}"
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, url, headers)
    message = str(refused.value)
    assert message.startswith(f"setting destinations[1] (hook).url in {tmp_path}"), message
    assert says in message
    assert "\n" not in message and "s3cret" not in message


@pytest.mark.parametrize(("url", "headers"), FINE)
def test_an_odd_url_that_works_is_accepted(
    tmp_path: Path, port: int, url: str, headers: dict[str, str]
) -> None:
    url = url.format(port=port)
    assert send(url, headers) == 200
    load(tmp_path, url, headers)
