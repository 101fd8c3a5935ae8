"""Shared fixtures: real servers started once per test session, one log per backend.

Under ``CI=true`` a server that cannot be started fails the run; elsewhere its tests are skipped
with the reason.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from exactly.log import BACKENDS, Log, open_log
from tests.slowness import slowness

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.delivery.jobdb import JobDB
    from tests.archives import MotoServer
    from tests.servers import RedisServer
    from tests.up_service import Stack

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Hypothesis checks what the code does, not how fast: its 200 ms deadline per example failed a
# first example that paid for pyarrow's lazy imports (455 ms on a slow machine), and the suite
# runs three workers on two cores
settings.register_profile("exactly", deadline=None)
settings.load_profile("exactly")
LOG_BACKENDS = list(BACKENDS)
# The Spark crash tests, each SIGKILLing a JVM 20 times or more while the next one starts, in
# two chains: with pytest-xdist (``./dev test`` starts three workers) two workers start with a
# chain each and run its tests one after another, in the order listed here, the third starts
# with the rest, and all share what is left once a chain ends
# (:func:`pytest_xdist_make_scheduler`, :func:`pytest_collection_modifyitems`). One chain
# alone took 69 minutes while the other worker had run everything else in 45 (2026-11-28).
# With two workers the rest waited for a chain to end, and then used only about one of the
# two cores (its tests wait on servers, clocks and kills): 44.6 minutes on 2026-11-29 against
# 36.4 and 40.3 with the third worker, the chains running at about two cores throughout.
# Two crash tests at once do not starve each other: a kill waits for a micro-batch of its own
# run to be in flight (``tests/batches_in_flight.py``), however slow the start, and the
# pipeline crash tests passed beside benchmarks that held the load average at 10 to 20. The
# cluster test does starve beside another crash test (four JVMs of its own: at load 19 a Python
# planner missed Spark's fixed 10 s to connect back, three times): it comes last in the longer
# chain, once the shorter one has ended and the other workers run the light tests. In CI on
# 2026-11-29 (48 minutes) the first chain, then holding test_forget too, was the whole run's
# length: 2,880 s against 2,334 for the second. test_forget (224 s there, no kills) now ends
# the second chain, so the chains are about 2,660 and 2,560 s, the cluster test meeting at most
# the end of test_forget. CI on 2026-11-30 (66.7 minutes of tests) had the first chain as the
# run's length again: the pipeline crash test's three stacks (842, 982 and 1,067 s), test_up
# (712) and the cluster test (361), 3,964 s against 3,428. Now the embedded stack (an entry of
# its own) starts the second chain and the cluster test ends it: about 3,560 and 3,840 s by
# those figures, the cluster test meeting at most the end of test_forget in the first.
_PIPELINE = "test_pipeline_crash::test_pipeline_killed_at_random_points_stays_exact"
CHAINS = (
    (
        f"{_PIPELINE}[spark-state]",
        f"{_PIPELINE}[scale-out]",
        "test_up",
        "test_up_scale_out",
        "test_forget_crash",
        "test_forget",
    ),
    (
        f"{_PIPELINE}[embedded]",
        "test_spark_crash",
        "test_route_crash",
        "test_backfill_crash",
        "test_lake_crash",
        "test_cluster",
    ),
)


def _chain_key(name: str) -> str:
    """A chain's entry as pytest names it: a module, or one test of a module (``::``)."""
    module, _, test = name.partition("::")
    return f"tests/integration/{module}.py" + (f"::{test}" if test else "")


SPARK_CRASH_CHAINS = {  # module or test -> (its chain, its place in the chain)
    _chain_key(name): (chain, place)
    for chain, names in enumerate(CHAINS)
    for place, name in enumerate(names)
}


def chain_place(nodeid: str) -> tuple[int, int] | None:
    """A test's chain and place in it, by its own node id or else by its module's; None: none."""
    return SPARK_CRASH_CHAINS.get(nodeid) or SPARK_CRASH_CHAINS.get(nodeid.split("::", 1)[0])


def pytest_configure(config: pytest.Config) -> None:
    """Measure the machine's slowness once, in the controller, before xdist starts its workers
    (they inherit it through the environment)."""
    slowness()


def pytest_report_header(config: pytest.Config) -> str:
    return f"time limits: x{slowness():.2f} for this machine's speed (tests/slowness.py)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The crash tests of each chain in the chain's order (each worker collects the same), and
    every test's time limit (its ``timeout`` mark, else ``--timeout`` or the ini's) multiplied
    by the machine's slowness."""

    def place(item: pytest.Item) -> tuple[int, int]:
        return chain_place(item.nodeid) or (-1, 0)

    items.sort(key=place)  # stable: everything else keeps its order, before the chains
    factor = slowness()
    if factor == 1.0:
        return
    default = float(config.getoption("timeout", None) or config.getini("timeout") or 0)
    for item in items:
        marked = item.get_closest_marker("timeout")
        limit = float(marked.args[0]) if marked is not None and marked.args else default
        if limit > 0:  # 0: no limit
            item.add_marker(pytest.mark.timeout(round(limit * factor)), append=False)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduler with one scope per chain of Spark crash tests and one per
    test for the rest; the scheduler hands out the largest scopes first, one to each worker.
    (xdist's ``loadgroup`` marks do nothing under pytest 9.2, which no longer reads the
    ``_nodeid`` xdist sets; the scheduler sees only node ids, hence the lists of names.)"""
    from xdist.scheduler import LoadScopeScheduling

    class CrashTestsTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            found = chain_place(nodeid)
            return nodeid if found is None else f"spark-crash-{found[0]}"

    return CrashTestsTogether(config, log)


REASON_LINES = 12  # of a failure's report, printed with it as it happens
PRINTED_LINES = 8  # of what the failed test printed (a crash test's last kills), printed after


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Name a failure the moment it happens, with its time and the end of its report (where the
    assertion or the exception is), then the last lines the test printed (a crash test says
    where its kills got to), on the controller's stderr: a run that CI stops at its time limit
    prints no summary, and a failure must still say why."""
    if report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller, or no xdist
        reason = report.longreprtext.rstrip().splitlines()[-REASON_LINES:]
        printed = report.capstdout.rstrip().splitlines()[-PRINTED_LINES:]
        sys.stderr.write(
            f"\nFAILED at {time.strftime('%H:%M:%S')} ({report.when}, {report.duration:.0f} s): "
            f"{report.nodeid}\n"
            + "".join(f"  | {line[:300]}\n" for line in reason)
            + "".join(f"  > {line[:300]}\n" for line in printed)
        )


def require(reason: str | None) -> None:
    """Skip (or, in CI, fail) when ``reason`` says a server is missing."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a required server is missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kafka_url() -> Iterator[str]:
    """A Tansu Kafka-protocol broker (memory storage) shared by the whole session."""
    from tests.servers import TansuBroker, tansu_available

    require(tansu_available())
    with TansuBroker() as broker:
        yield broker.url


LOCAL_REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def redis_servers() -> Iterator[list[str]]:
    """Three Redis servers for the redis dedupe store: the local one when it answers, else a
    started one, then two ``redis-server`` processes on free ports (stopped at the end).

    Tests share them, each under a namespace of its own (:func:`redis_namespace`).
    """
    from tests.servers import RedisServer, redis_answers, redis_available

    require(redis_available())
    with contextlib.ExitStack() as stack:
        urls = [] if not redis_answers(LOCAL_REDIS) else [LOCAL_REDIS]
        while len(urls) < 3:
            urls.append(stack.enter_context(RedisServer()).url)
        yield urls
        if urls[0] == LOCAL_REDIS:  # what this session left on the shared server
            import redis

            client = redis.Redis.from_url(LOCAL_REDIS)
            for key in client.scan_iter(f"{REDIS_SESSION}:*", count=1000):
                client.unlink(key)


REDIS_SESSION = f"exactly-test:{uuid.uuid4().hex[:8]}"


def redis_namespace() -> str:
    """A key prefix of one test's own, under this session's (removed at its end)."""
    return f"{REDIS_SESSION}:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def dedupe_store(request: pytest.FixtureRequest) -> str:
    """The ``--store`` of a test parametrised with ``store``: ``rocksdb`` and ``spark-state``
    (their default place), or for ``redis`` a URL of two shards and a namespace of its own."""
    store: str = request.node.callspec.params["store"]
    if store != "redis":
        return store
    from tests.dedupe_stores import redis_store_url

    urls = request.getfixturevalue("redis_servers")
    return redis_store_url(urls[:2], redis_namespace())


@pytest.fixture(params=LOG_BACKENDS)
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty log (sqlite) or of the shared broker (kafka) for one test."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'log'}"
    if request.param == "kafka":
        url: str = request.getfixturevalue("kafka_url")
        return url
    raise AssertionError(f"no test log for the backend {request.param!r}: add one here")


@pytest.fixture
def log(log_url: str) -> Iterator[Log]:
    with open_log(log_url) as opened:
        yield opened


def _jobdb_backends() -> list[str]:
    from exactly.delivery.jobdb import BACKENDS as JOBDB_BACKENDS

    return list(JOBDB_BACKENDS)


@pytest.fixture(params=_jobdb_backends())
def jobdb(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JobDB]:
    """An empty JobDB of each backend (sqlite, postgresql, mysql: ``tests/jobdb.py``), for the
    delivery tests whose behaviour rests on what the JobDB records (retries, 429s, the breaker,
    isolation)."""
    from exactly.delivery.jobdb import open_jobdb
    from tests.jobdb import jobdb_url

    with jobdb_url(request.param, tmp_path) as url, open_jobdb(url) as opened:
        yield opened


def pytest_sessionstart(session: pytest.Session) -> None:
    """Every Spark driver the tests start maps Spark's classes from one archive, made here once
    per machine (``exactly.spark.class_sharing``): without it each command's JVM would start
    slower, and the first ones would each launch a trainer in the background."""
    from exactly.spark.class_sharing import prepare

    prepare()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One local Spark for the whole session: 2 cores, up to 3 attempts per task, fast JVM start."""
    from exactly.config import Settings
    from exactly.spark.session import build_session

    before = os.environ.get("JDK_JAVA_OPTIONS")
    os.environ["JDK_JAVA_OPTIONS"] = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    try:
        session = build_session(
            Settings(data_dir=tmp_path_factory.mktemp("spark")),
            "exactly-tests",
            master="local[2,3]",
            conf={"spark.sql.shuffle.partitions": "2"},
        )
    finally:
        if before is None:
            del os.environ["JDK_JAVA_OPTIONS"]
        else:
            os.environ["JDK_JAVA_OPTIONS"] = before
    yield session
    session.stop()


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses (the Kafka broker is shared by the session)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoServer]:
    """moto's standalone S3 server (real HTTP S3 API) shared by the session (tests/archives.py)."""
    from tests.archives import MotoServer, moto_missing

    require(moto_missing())
    with MotoServer() as server:
        yield server


@pytest.fixture
def scale_out(redis_servers: list[str]) -> Iterator[tuple[Stack, RedisServer]]:
    """The scale-out backends of one test: a Kafka-protocol broker of its own (the pipeline's
    topics have fixed names), the redis store over the shared Redis and a server of the test's
    own (to kill), and a PostgreSQL schema for the aggregates and the JobDB."""
    from tests.aggregate_db import postgres_missing, postgres_schema
    from tests.dedupe_stores import redis_store_url
    from tests.servers import RedisServer, TansuBroker, redis_available, tansu_available
    from tests.up_service import Stack

    require(tansu_available())
    require(redis_available())
    require(postgres_missing())
    with contextlib.ExitStack() as servers:
        broker = servers.enter_context(TansuBroker())
        shard = servers.enter_context(RedisServer())
        database = servers.enter_context(postgres_schema())
        store = redis_store_url([redis_servers[0], shard.url], redis_namespace())
        yield Stack(broker.url, store, database), shard
