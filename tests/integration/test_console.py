"""The web console of ``exactly up`` in a real headless Chromium (Debian's ``chromium``, driven by
playwright): the page loads while events flow, its numbers move without a reload, they agree
with the JSON API and with what the pipeline did, the trace box follows a message sent twice
and an unknown one, and the console stops with ``up``.

Under ``CI=true`` a missing chromium or playwright fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.sdks import CHROMIUM, chromium_missing
from tests.cli_text import messages
from tests.conftest import require
from tests.receiver import Receiver
from tests.servers import free_port
from tests.up_service import ROOT, Clients, UpService, counted, write_config


@pytest.fixture
def browser() -> Iterator[Any]:
    require(chromium_missing())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        yield launched
        launched.close()


def number(page: Any, key: str) -> int:
    """The figure the page shows at ``key`` (``—`` before it is known: -1)."""
    text = page.locator(f'[data-k="{key}"]').first.text_content().strip()
    return -1 if text == "—" else int(text.replace(",", ""))


def check_on_a_phone(browser: Any, url: str) -> None:
    """At a 390 px viewport: nothing wider than it, no console error or failed request (the
    favicon), one clock (UTC, 24 h), empty cells a grey dash, the latencies as numbers."""
    phone = browser.new_page(viewport={"width": 390, "height": 844})
    errors: list[str] = []
    phone.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    phone.on("pageerror", lambda e: errors.append(str(e)))
    phone.on(
        "response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None
    )
    phone.goto(url)
    phone.wait_for_timeout(3500)  # two polls of /api/state
    assert errors == [], errors
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    assert phone.evaluate("document.body.scrollWidth") <= 390
    icon = httpx.get(f"{url}/favicon.svg", timeout=10)
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")
    clock = phone.locator('[data-k="at"]').text_content()
    assert re.fullmatch(r"([01]\d|2[0-3]):[0-5]\d:[0-5]\d UTC", clock), clock
    body = phone.locator("main").text_content()
    assert not re.search(r"\b(AM|PM)\b", body), "a 12 h clock on the page"
    empty = phone.locator("#stages td .empty").first  # the collector's lag, for one
    assert empty.text_content() == "—"
    assert empty.evaluate("e => getComputedStyle(e).color") == "rgb(154, 163, 178)"
    for key in ("counted", "delivered"):
        for share in ("p50", "p99"):
            shown = phone.locator(f'[data-k="latency.{key}.{share}_ms"]').text_content()
            assert re.fullmatch(r"\d+ ms|\d+\.\d s", shown), (key, share, shown)
    phone.close()


def wait_for_state(url: str, ready: Any, timeout: float = 240) -> dict[str, Any]:
    """``/api/state`` once ``ready(state)`` holds."""
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            state = httpx.get(f"{url}/api/state", timeout=10).json()
            if ready(state):
                return state
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the console never showed what was awaited: {state}")


@pytest.mark.slow
@pytest.mark.spark
def test_console_shows_the_pipeline_moving(tmp_path: Path, browser: Any) -> None:
    with Receiver() as receiver:
        config = write_config(tmp_path, receiver.url, console_port=free_port())
        service = UpService(config, tmp_path)
        try:
            service.start()
            url = service.console_url
            first = Clients(service.port, batches=10).start()
            assert first.wait(180), "the clients could not send"
            wait_for_state(url, lambda s: (s["totals"]["counted"] or 0) >= 500)

            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            assert page.title() == "exactly · console"
            accepted = number(page, "totals.accepted")
            counted_before = number(page, "totals.counted")
            delivered_before = number(page, "totals.delivered.all")
            assert accepted >= 500 and counted_before >= 500
            names = page.locator("#stages td:first-child").all_text_contents()
            assert names == ["collector", "dedupe", "aggregate", "route", "director"]
            destinations = page.locator("#destinations td:first-child").all_text_contents()
            assert destinations == ["all", "orders"]

            # events flow while the page is open: its figures move without a reload
            flowing = Clients(service.port, batches=60, size=50, pause=0.2, prefix="flow")
            flowing.start()
            again = Clients(service.port, batches=1).start()  # the first batch again: 50 dupes
            page.wait_for_function(
                f"() => parseInt(document.querySelector('[data-k=\"totals.accepted\"]')"
                f".textContent.replace(/,/g, '')) > {accepted}",
                timeout=60_000,
            )
            page.wait_for_function(
                f"() => parseInt(document.querySelector('[data-k=\"totals.counted\"]')"
                f".textContent.replace(/,/g, '')) > {counted_before}",
                timeout=120_000,
            )
            rates = "#stages td:nth-child(5)"
            page.wait_for_function(
                f"() => [...document.querySelectorAll('{rates}')]"
                ".some(td => parseFloat(td.textContent) > 0)",
                timeout=60_000,
            )
            page.wait_for_function(
                "() => document.querySelector('[data-k=\"totals.delivered.all\"]').textContent"
                f" !== '{delivered_before:,}'",
                timeout=120_000,
            )
            assert page.locator("#chart svg rect").count() > 0, "no bar in the chart"
            assert page.locator("#live").text_content() == "live"
            check_on_a_phone(browser, url)  # while events flow: latencies of the last minute
            assert flowing.wait(240) and again.wait(60), "the clients could not send"

            # once everything is through, the page and the API agree with the pipeline
            everyone = len(first.ids | flowing.ids)
            # delivered counts archived datasets too (dataset_rows is 2,000 here)
            delivered = {"all": everyone, "orders": len(first.orders | flowing.orders)}
            state = wait_for_state(
                url,
                lambda s: (
                    s["totals"]["counted"] == everyone
                    and s["stages"][1]["lag"] == 0
                    and s["totals"]["delivered"] == delivered
                ),
            )
            assert list((tmp_path / "data" / "archive").glob("*.jsonl.gz")), "nothing archived"
            assert counted(tmp_path / "data") == everyone
            totals = state["totals"]
            assert totals["kept"] == everyone and totals["rejected"] == 0
            assert totals["duplicates"] >= 50 and state["dedupe"]["duplicates"] >= 50
            # a batch a client sent again (a timeout under load) is in raw twice: dropped
            assert totals["accepted"] == everyone + totals["duplicates"]
            assert state["dedupe"]["window_ms"] == 24 * 3600 * 1000
            assert state["dedupe"]["effective_window_ms"] == 24 * 3600 * 1000
            assert [p["name"] for p in state["parts"]] == ["collector", "pipeline", "director"]
            assert all(p["state"] == "running" and p["restarts"] == 0 for p in state["parts"])
            # each query ran its first micro-batch: none is "starting" any more
            assert all(s["starting_seconds"] is None for s in state["stages"]), state["stages"]
            assert {s["state"] for s in state["stages"]} == {"running"}, state["stages"]
            orders = next(d for d in state["destinations"] if d["name"] == "orders")
            assert orders["last_error"] and "500" in orders["last_error"]  # /flaky/1 fails once
            page.wait_for_timeout(2000)
            assert number(page, "totals.counted") == everyone
            assert number(page, "totals.delivered.all") == everyone
            assert "500" in page.locator('[data-k="destinations.1.last_error"]').text_content()

            # the trace box: an order sent twice (its first delivery to "orders" answered 500)
            twice = str(first.sent[0][0]["messageId"])
            page.fill("#trace input", twice)
            page.click("#trace button")
            page.wait_for_function(
                "() => document.querySelector('#trace pre').textContent.includes('delivered')",
                timeout=30_000,
            )
            shown = page.locator("#trace pre").text_content()
            assert "accepted 2 times" in shown and "kept -> events" in shown, shown
            assert "duplicate of raw" in shown and "orders: succeeded" in shown, shown
            assert " 500 " in shown and "all: succeeded" in shown, shown
            page.screenshot(path=str(tmp_path / "console.png"), full_page=True)
            traced = httpx.get(f"{url}/api/trace/{twice}", timeout=30)
            assert traced.status_code == 200
            outcomes = sorted(c["verdict"]["outcome"] for c in traced.json()["copies"])
            assert outcomes == ["duplicate", "kept"]
            page.fill("#trace input", "no-such-message")
            page.click("#trace button")
            page.wait_for_function(
                "() => document.querySelector('#trace pre').textContent.includes('unknown')",
                timeout=30_000,
            )
            unknown = httpx.get(f"{url}/api/trace/no-such-message", timeout=30)
            assert unknown.status_code == 404 and not unknown.json()["found"]
            print(f"screenshot: {tmp_path / 'console.png'}")

            missing = httpx.get(f"{url}/api/nothing", timeout=10)
            assert missing.status_code == 404 and "/api/nothing" in missing.json()["error"]

            code, _ = service.terminate()
            assert code == 0, service.stderr()
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/api/state", timeout=5)
            page.wait_for_function(
                "() => document.getElementById('live').textContent === 'not answering'",
                timeout=10_000,
            )
        finally:
            service.close()


def test_a_taken_console_port_stops_up_in_one_line(tmp_path: Path) -> None:
    """Before any part starts: ``error: the console cannot listen ...`` and exit status 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, "http://127.0.0.1:9", console_port=port)
        done = subprocess.run(
            [sys.executable, "-m", "exactly", "up", "--no-live"],
            cwd=tmp_path,
            env={**os.environ, "EXACTLY_CONFIG": str(config), "PYTHONPATH": str(ROOT / "src")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in messages(done.stderr) if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "up" / "pipeline.log").exists(), "a part was started"
