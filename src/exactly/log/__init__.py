"""The durable partitioned log: open one by URL.

``sqlite://PATH`` (PATH a directory; ``sqlite:///abs/dir`` or ``sqlite://relative/dir``) is the
embedded default; ``kafka://HOST:PORT[,HOST:PORT...][?librdkafka.option=value...]`` uses any
Kafka-protocol cluster and needs the ``kafka`` extra. Backends are imported only when asked for.
A log's ``url`` and its messages show the URL with secrets masked (:mod:`exactly.urls`).
"""

from __future__ import annotations

from typing import Any

from exactly.errors import EnvironmentProblem, InvalidLogURL
from exactly.log.base import AppendResult, Log, LogRecord, Record, TopicInfo
from exactly.urls import redact

__all__ = ["BACKENDS", "AppendResult", "Log", "LogRecord", "Record", "TopicInfo", "open_log"]

BACKENDS = ("sqlite", "kafka")  # URL schemes; the contract suite runs on each


def open_log(url: str, **options: Any) -> Log:
    """Open the log at ``url``; ``options`` (such as ``max_record_bytes``) go to the backend."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidLogURL(
            f"log URL {redact(str(url))!r} is not understood: use sqlite://DIR or kafka://HOST:PORT"
        )
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite":
        from exactly.log.sqlite import SqliteLog

        return SqliteLog.from_url(rest, **options)
    if scheme == "kafka":
        if "@" in rest.partition("?")[0]:  # librdkafka would read it as a host name
            raise InvalidLogURL(
                f"log URL {redact(url)!r}: Kafka credentials do not go before the host; use "
                "kafka://HOST:PORT?security.protocol=SASL_SSL&sasl.mechanism=PLAIN"
                "&sasl.username=NAME&sasl.password=env:VARIABLE"
            )
        try:
            from exactly.log.kafka import KafkaLog
        except ImportError as error:  # pragma: no cover - depends on the installed extras
            raise EnvironmentProblem(
                f"the kafka log needs the kafka extra: pip install 'exactly[kafka]' ({error})"
            ) from error
        return KafkaLog.from_url(rest, **options)
    raise InvalidLogURL(
        f"log URL scheme {scheme!r} is not supported: use sqlite://DIR or kafka://HOST:PORT"
    )
