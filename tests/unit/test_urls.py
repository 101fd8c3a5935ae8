"""Backend URLs shown to people: secrets masked; secrets read from the environment or a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.errors import ConfigError
from exactly.urls import redact, resolve, scrub


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "kafka://b1:9092,b2:9092?security.protocol=sasl_ssl&sasl.username=app"
            "&sasl.password=S3cret&linger.ms=5",
            "kafka://b1:9092,b2:9092?security.protocol=sasl_ssl&sasl.username=app"
            "&sasl.password=***&linger.ms=5",
        ),
        (
            "kafka://b:9092?ssl.key.password=a&ssl.keystore.password=b&ssl.key.pem=c"
            "&sasl.oauthbearer.client.secret=d&sasl.oauthbearer.config=e&SASL.PASSWORD=f",
            "kafka://b:9092?ssl.key.password=***&ssl.keystore.password=***&ssl.key.pem=***"
            "&sasl.oauthbearer.client.secret=***&sasl.oauthbearer.config=***&SASL.PASSWORD=***",
        ),
        ("kafka://b:9092?sasl.password=env:KAFKA_PW", "kafka://b:9092?sasl.password=env:KAFKA_PW"),
        ("kafka://b:9092?sasl.password=file:/run/pw", "kafka://b:9092?sasl.password=file:/run/pw"),
        ("kafka://b:9092?sasl.password=", "kafka://b:9092?sasl.password="),
        (
            "postgresql://u:p%40ss@h:5432/db?sslmode=require",
            "postgresql://u:***@h:5432/db?sslmode=require",
        ),
        (
            "postgresql://u@h/db?password=p&application_name=x",
            "postgresql://u@h/db?password=***&application_name=x",
        ),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://user:p@w@h:6380", "rediss://user:***@h:6380"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("sqlite:///data/log", "sqlite:///data/log"),
        ("nonsense?token=t", "nonsense?token=***"),
    ],
)
def test_redact_masks_passwords_and_secret_options_only(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_resolve_reads_the_environment_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXACTLY_TEST_SECRET", "from-env")
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    assert resolve("sasl.password", "env:EXACTLY_TEST_SECRET") == "from-env"
    assert resolve("sasl.password", f"file:{secret}") == "from-file"
    assert resolve("linger.ms", "5") == "5"
    monkeypatch.delenv("EXACTLY_TEST_SECRET")
    with pytest.raises(ConfigError, match="environment variable 'EXACTLY_TEST_SECRET' is not set"):
        resolve("sasl.password", "env:EXACTLY_TEST_SECRET")
    with pytest.raises(ConfigError, match=r"cannot read the file .*missing \(No such file"):
        resolve("sasl.password", f"file:{tmp_path / 'missing'}")


def test_scrub_masks_each_secret_in_a_message() -> None:
    text = "auth failed for app with password hunter22 (hunter2 tried)"
    assert (
        scrub(text, ["hunter22", "hunter2", "", "ab"])
        == "auth failed for app with password *** (*** tried)"
    )
