"""Secrets in a Kafka log URL never reach a message, a repr, the collector's answers or its output.

Issue 17, item 3: ``?sasl.password=...`` stayed in ``KafkaLog.url``, which every
``LogUnavailable`` embeds, and the collector returned that text in 503 bodies and in ``GET /health``
(no auth) and printed it at start.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import httpx
import pytest

from exactly.errors import InvalidLogURL, LogError, LogUnavailable
from exactly.log import open_log
from exactly.log.kafka import KafkaLog
from tests.conftest import require
from tests.integration.collector_server import KEYS, Collector, basic
from tests.integration.test_cli import run
from tests.servers import TansuBroker, free_port, tansu_available

pytestmark = pytest.mark.kafka
SECRET = "Sup3rSecretValue"
OPTIONS = f"?sasl.username=app&sasl.password={SECRET}&ssl.key.password={SECRET}x&linger.ms=1"


def everything_said(error: BaseException) -> str:
    """The message and the whole traceback, causes included, as a log of the failure shows."""
    return str(error) + "".join(traceback.format_exception(error))


def test_an_unreachable_kafka_log_never_shows_its_secret() -> None:
    url = f"kafka://127.0.0.1:{free_port()}{OPTIONS}"
    with open_log(url, timeout=1) as log:
        for shown in (log.url, str(log), repr(log)):
            assert SECRET not in shown
            assert "sasl.password=***" in shown and "sasl.username=app" in shown
        for call in (log.topics, lambda: log.topic_info("raw"), lambda: log.create_topic("t", 1)):
            with pytest.raises(LogUnavailable) as failed:
                call()
            assert "sasl.password=***" in str(failed.value)
            assert SECRET not in everything_said(failed.value)


@pytest.mark.parametrize(
    "url",
    [
        f"kafka://127.0.0.1:{free_port()}{OPTIONS}&no.such.option=1",  # librdkafka refuses it
        f"kafka://127.0.0.1:{free_port()}{OPTIONS}&enable.idempotence=false",
        f"kafka://127.0.0.1{OPTIONS}",  # no port
        f"kafka://127.0.0.1:9092?sasl.password={SECRET}&&&=",  # options not understood
        f"kafka:/127.0.0.1:9092?sasl.password={SECRET}",  # not a URL
    ],
)
def test_a_misconfigured_kafka_log_never_shows_its_secret(url: str) -> None:
    with pytest.raises(InvalidLogURL) as failed:
        open_log(url, timeout=1)
    assert SECRET not in everything_said(failed.value)


def test_secrets_come_from_the_environment_or_a_file(
    kafka_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTLY_TEST_KAFKA_PASSWORD", SECRET)
    secret_file = tmp_path / "kafka-password"
    secret_file.write_text(f"{SECRET}-file\n")
    url = (
        f"{kafka_url}?sasl.password=env:EXACTLY_TEST_KAFKA_PASSWORD"
        f"&ssl.key.password=file:{secret_file}"
    )
    with open_log(url) as log:
        assert isinstance(log, KafkaLog)
        log.topics()  # Tansu speaks plaintext: the SASL and SSL options are not used
        config = log._producer_config
        assert config["sasl.password"] == SECRET
        assert config["ssl.key.password"] == f"{SECRET}-file"
        assert "sasl.password=env:EXACTLY_TEST_KAFKA_PASSWORD" in log.url
    monkeypatch.delenv("EXACTLY_TEST_KAFKA_PASSWORD")
    with pytest.raises(InvalidLogURL, match="'EXACTLY_TEST_KAFKA_PASSWORD' is not set"):
        open_log(url)
    secret_file.unlink()
    with pytest.raises(LogError, match="cannot read the file"):
        open_log(f"{kafka_url}?sasl.password=file:{secret_file}")


def test_the_collector_never_shows_the_log_secret(tmp_path: Path) -> None:
    require(tansu_available())
    event = {"userId": "u", "event": "e", "messageId": "m-1"}
    with TansuBroker() as broker, Collector(tmp_path, log_url=broker.url + OPTIONS) as collector:
        ok = httpx.post(f"{collector.url}/v1/track", json=event, auth=basic(KEYS["web"]))
        assert ok.status_code == 200
        broker.stop()  # the log goes away: appends fail with LogUnavailable
        started = time.monotonic()
        failed = httpx.post(
            f"{collector.url}/v1/track", json=event, auth=basic(KEYS["web"]), timeout=60
        )
        assert failed.status_code == 503, failed.text
        assert time.monotonic() - started < 45
        health = httpx.get(f"{collector.url}/health", timeout=10)
        assert health.status_code == 503 and "error" in health.json(), health.text
        for body in (failed.text, health.text):
            assert "sasl.password=***" in body
            assert SECRET not in body
        output = collector.tail()
        assert "sasl.password=***" in output  # the start line names the log, masked
        assert SECRET not in output


def test_the_cli_never_shows_the_log_secret(kafka_url: str, tmp_path: Path) -> None:
    unreachable = f"kafka://127.0.0.1:{free_port()}{OPTIONS}"
    env = {**os.environ, "EXACTLY_LOG__URL": unreachable}
    doctor = run("doctor", "--no-spark", cwd=tmp_path, env=env)
    assert doctor.returncode == 1 and "✗ log       kafka://127.0.0.1:" in doctor.stdout
    assert "sasl" not in doctor.stdout  # doctor shows no URL's options
    failed = run("log", "stat", cwd=tmp_path, env=env)
    assert failed.returncode == 1 and "sasl.password=***" in failed.stderr
    env["EXACTLY_LOG__URL"] = kafka_url + OPTIONS
    created = run("log", "create", "t-secret", "--exist-ok", cwd=tmp_path, env=env)
    assert created.returncode == 0 and "sasl.password=***" in created.stdout
    for result in (doctor, failed, created):
        assert SECRET not in result.stdout + result.stderr
