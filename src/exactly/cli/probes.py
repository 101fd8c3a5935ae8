"""What ``exactly doctor`` asks of each configured backend, and how its answer is told in a line.

A :class:`Probe` names what it checks and the fix for a failure before it runs, so a probe that
does not answer in time can still be told. :func:`run_probes` runs every probe at once, each in a
daemon thread given :data:`TIMEOUT` seconds (one that hangs in a driver's connect is left behind,
and never delays the exit), after importing, one at a time, the modules each will need: two
threads importing at once can deadlock on Python's per-module import locks. Nothing is written
to a server, and no embedded store that does not exist yet is created (the command that uses it
makes it).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import socket
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from exactly.config import Settings
from exactly.text import WIDTH, place
from exactly.urls import embedded_path

TIMEOUT = 2.0  # seconds each probe may take
INDENT = "    "  # a finding's further lines: under its name, room for a long path


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, what was found and, when it failed, the fix."""

    name: str
    ok: bool
    what: str  # what was checked: a version, a URL (redacted), a host, a path
    said: str = ""  # what was found, or what is wrong
    fix: str = ""  # on failure: what to do

    def line(self, marks: tuple[str, str] = ("✓", "✗"), width: int = WIDTH) -> str:
        """``✓ name      what said`` or ``✗ name      what: said; fix`` in ``width`` columns.

        Nothing is cut (a path or URL shortened is one the user cannot act on): a finding too
        long for one line goes on, between words, on lines indented by :data:`INDENT`.
        """
        head = f"{marks[0] if self.ok else marks[1]} {self.name:<9} "
        tail = "" if self.ok or not self.fix else f"; {self.fix}"
        sep = "" if not (self.what and self.said) else (" " if self.ok else ": ")
        text = " ".join(f"{self.what}{sep}{self.said}{tail}".split())
        return textwrap.fill(
            head + text,
            width,
            subsequent_indent=INDENT,
            break_long_words=False,
            break_on_hyphens=False,
        )


@dataclass(frozen=True)
class Probe:
    """A check of one backend: ``run`` returns what it found, or raises what is wrong."""

    name: str
    what: str  # the URL (redacted), host or path checked
    fix: str
    run: Callable[[], str]
    modules: tuple[str, ...] = ()  # what ``run`` imports, imported before the probes run


_URL_OPTIONS = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s?]+)\?[^\s)]*")  # a URL's ?options


def reason(error: BaseException) -> str:
    """What went wrong, in a few words: a driver's message reduced to what the user acts on,
    without the options of a URL it quotes (the doctor shows each URL without them)."""
    text = _URL_OPTIONS.sub(r"\1", " ".join(str(error).split())) or type(error).__name__
    lowered = text.lower()
    if isinstance(error, ConnectionRefusedError) or "refused" in lowered:
        return "refused"
    if isinstance(error, socket.gaierror) or any(
        words in lowered
        for words in (
            "could not translate host name",
            "name or service not known",
            "name resolution",
            "nodename nor servname",
            "no address associated",
            "getaddrinfo",
            "unknown mysql server host",
        )
    ):
        return "no such host"
    if isinstance(error, TimeoutError) or "timed out" in lowered or "timeout" in lowered:
        return "timed out"
    if "password authentication failed" in lowered or "access denied" in lowered:
        return "wrong user or password"
    return text


def run_probes(probes: list[Probe], timeout: float = TIMEOUT) -> list[Finding]:
    """Every probe's finding, in the order given; all run at once, each for ``timeout`` s."""
    results: dict[int, Finding] = {}
    for module in dict.fromkeys(name for probe in probes for name in probe.modules):
        with contextlib.suppress(ImportError):  # a missing extra: the probe's run says so
            importlib.import_module(module)

    def attempt(at: int, probe: Probe) -> None:
        try:
            results[at] = Finding(probe.name, True, probe.what, probe.run())
        except Exception as error:  # noqa: BLE001 - any failure is the finding
            results[at] = Finding(probe.name, False, probe.what, reason(error), probe.fix)

    threads = [
        threading.Thread(target=attempt, args=(at, probe), daemon=True, name=f"doctor-{at}")
        for at, probe in enumerate(probes)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        results.get(at)
        or Finding(probe.name, False, probe.what, f"no answer in {timeout:g} s", probe.fix)
        for at, probe in enumerate(probes)
    ]


def probes(settings: Settings) -> list[Probe]:
    """A probe of each backend ``settings`` configure: the log, the aggregate database, the
    dedupe store's Redis servers, and with delivery the JobDB, the archive and each
    destination's host."""
    found = [log_probe(settings), aggregate_probe(settings)]
    found += dedupe_probes(settings)
    delivery = bool(settings.destinations or settings.delivery.jobdb or settings.delivery.archive)
    if delivery:
        found += [jobdb_probe(settings), archive_probe(settings)]
    found += [destination_probe(d.name, d.url) for d in settings.destinations]
    return found


def log_probe(settings: Settings) -> Probe:
    url = settings.log_url

    def run() -> str:
        from exactly.log import open_log

        options = {"timeout": TIMEOUT} if url.startswith("kafka://") else {}
        with open_log(url, **options) as log:
            topics = log.topics()
        return f"reachable, {len(topics)} topic(s)"

    backend = "exactly.log.kafka" if url.startswith("kafka://") else "exactly.log.sqlite"
    return Probe(
        "log",
        compact(url, settings.data_dir),
        "start it or fix [log] url",
        run,
        ("exactly.log", backend),
    )


def aggregate_probe(settings: Settings) -> Probe:
    url = settings.aggregate_url
    fix = "start it or fix [aggregate] url"

    def run() -> str:
        from exactly.aggregate import open_db

        if url.startswith("sqlite:"):
            from exactly.aggregate.sqlite import sqlite_path

            path = sqlite_path(url)
            if not path.exists():
                return not_made_yet(path.parent, "exactly aggregate")
        with open_db(url, retry_seconds=0) as db:
            db.query("SELECT 1")
        return "reachable"

    backend = "sqlite" if url.startswith("sqlite:") else "postgres"
    modules = ("exactly.aggregate", f"exactly.aggregate.{backend}")
    return Probe("aggregate", compact(url, settings.data_dir), fix, run, modules)


def dedupe_probes(settings: Settings) -> list[Probe]:
    """One probe per Redis server of a ``redis://`` dedupe store (both epochs when resharding);
    none for an embedded store."""
    store = settings.dedupe.store
    if not store.startswith(("redis://", "rediss://")):
        return []
    from exactly.dedupe.redis.sharding import sharding_from_url

    sharding, _ = sharding_from_url(store)
    return [redis_probe(server) for server in sharding.servers]


def redis_probe(url: str) -> Probe:
    def run() -> str:
        import redis

        client = redis.Redis.from_url(
            url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT, retry_on_timeout=False
        )
        try:
            client.ping()
            version = client.info("server").get("redis_version", "")
        finally:
            client.close()
        return f"answers (redis {version})" if version else "answers"

    return Probe("dedupe", compact(url), "start it or fix [dedupe] store", run, ("redis",))


def jobdb_probe(settings: Settings) -> Probe:
    url = settings.jobdb_url

    def run() -> str:
        from exactly.delivery.jobdb import open_jobdb

        if url.startswith("sqlite://"):
            from exactly.delivery.jobdb.sqlite import FILE

            directory = Path(url.partition("://")[2] or ".")
            if not (directory / FILE).exists():
                return not_made_yet(directory, "exactly route")
        jobdb = open_jobdb(url)
        tables = jobdb.tables()
        if "jobdb_datasets" not in tables:
            return "reachable (no tables yet)"
        return f"reachable, {sum(t.startswith('jobs_') for t in tables)} dataset(s)"

    scheme = url.partition("://")[0].replace("postgresql", "postgres")
    backend = scheme if scheme in ("postgres", "mysql") else "sqlite"
    modules = (
        "exactly.delivery.jobdb",
        "exactly.delivery.jobdb.sql",
        f"exactly.delivery.jobdb.{backend}",
    )
    fix = "start it or fix [delivery] jobdb"
    return Probe("jobdb", compact(url, settings.data_dir), fix, run, modules)


def archive_probe(settings: Settings) -> Probe:
    url = settings.archive_url

    def run() -> str:
        from exactly.delivery.archive import open_archive

        if "://" not in url or url.startswith("file://"):
            directory = Path(url.removeprefix("file://"))
            if not directory.exists():
                return not_made_yet(directory, "exactly deliver")
            open_archive(url).check()
            return "writable"
        open_archive(url).check()
        return "reachable"

    backend = "s3" if url.startswith("s3://") else "directory"
    modules = ("exactly.delivery.archive", f"exactly.delivery.archive.{backend}")
    return Probe("archive", compact(url, settings.data_dir), "fix [delivery] archive", run, modules)


def destination_probe(name: str, url: str) -> Probe:
    """The destination's host resolves (no request is sent: the host may count requests)."""
    from yarl import URL

    parsed = URL(url)
    host, port = parsed.host or "", parsed.port or 443

    def run() -> str:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return f"resolves to {addresses[0][4][0]}"

    return Probe("dest", f"{host} ({name})", "fix its url", run)


def compact(url: str, data_dir: Path | None = None) -> str:
    """``url`` as a report shows it: no user, password or options (``?...``), which the
    config file has; an embedded store's path relative to ``data_dir`` when inside it."""
    if data_dir is not None and embedded_path(url.partition("?")[0]) is not None:
        return place(url.partition("?")[0], data_dir)
    if "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    rest = rest.partition("?")[0]
    if scheme in ("sqlite", "file"):
        return f"{scheme}://{rest}"
    location, slash, path = rest.partition("/")
    return f"{scheme}://{location.rpartition('@')[2]}{slash}{path}"


def not_made_yet(path: Path, maker: str) -> str:
    """What to say of an embedded store that does not exist yet; raises if it cannot be made."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError("not writable" if existing == path else "cannot be made")
    return f"not made yet ({maker} makes it)"
