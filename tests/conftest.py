"""Shared fixtures: real servers started once per test session, one log per backend.

Under ``CI=true`` a server that cannot be started fails the run; elsewhere its tests are skipped
with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.log import Log, open_log

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
LOG_BACKENDS = ["sqlite", "kafka"]


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


@pytest.fixture(params=LOG_BACKENDS)
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty log (sqlite) or of the shared broker (kafka) for one test."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'log'}"
    url: str = request.getfixturevalue("kafka_url")
    return url


@pytest.fixture
def log(log_url: str) -> Iterator[Log]:
    with open_log(log_url) as opened:
        yield opened


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses (the Kafka broker is shared by the session)."""
    return f"t-{uuid.uuid4().hex[:12]}"
