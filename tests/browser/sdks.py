"""The npm SDKs of the browser and Node tests: installed with ``npm ci`` from the committed
lockfile into tests/browser/node_modules, and a page server on an origin of its own.

The lockfile lists msgpackr-extract's darwin, win32 and linux-arm builds (optional, never
installed on linux-x64) by hand: the registry mirror these machines use lacks them, so
``npm install`` left them out and ``npm ci`` then refused the lockfile as out of sync.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHROMIUM = Path("/usr/bin/chromium")
SEGMENT_BUNDLES = "node_modules/@segment/analytics-next/dist/umd"


def npm_missing() -> str | None:
    """Why the SDKs cannot be installed, or None once ``npm ci`` has put them in node_modules."""
    if shutil.which("npm") is None:
        return "npm is not installed (Node 20 is expected on every machine)"
    stamp = HERE / "node_modules" / ".package-lock.json"
    lock = HERE / "package-lock.json"
    if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
        return None
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return f"npm ci failed in {HERE}: {done.stderr.strip()[-500:]}"
    return None


def chromium_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: apt-get install -y chromium"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[dev]'"
    return None


class _PageHandler(SimpleHTTPRequestHandler):
    """tests/browser as the site's root; /cdn/analytics-next/bundles/ are analytics.js's chunks."""

    def translate_path(self, path: str) -> str:
        prefix = "/cdn/analytics-next/bundles/"
        if path.startswith(prefix):
            path = f"/{SEGMENT_BUNDLES}/{path[len(prefix) :]}"
        return super().translate_path(path)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def page_server() -> Iterator[str]:
    """A static server of tests/browser on 127.0.0.1 and a free port: its URL."""
    handler = functools.partial(_PageHandler, directory=os.fspath(HERE))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
