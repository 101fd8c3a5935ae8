"""One-line errors name what happened: a Spark JVM that is gone is not the data dir's fault.

The py4j errors are real ones, raised by py4j's own clients calling a port nobody listens on, as
after the JVM was killed: PySpark's client lets the refused reconnection through as a plain
``ConnectionRefusedError`` (an ``OSError``), the older gateway client wraps it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from py4j.clientserver import JavaClient, JavaParameters, PythonParameters  # type: ignore[import-untyped]
from py4j.java_gateway import (  # type: ignore[import-untyped]
    CallbackServer,
    CallbackServerParameters,
    GatewayClient,
    GatewayParameters,
    GatewayProperty,
    PythonProxyPool,
)

import exactly.cli
from exactly.cli import main, one_line
from exactly.errors import ConfigError
from exactly.spark.streaming import JVM_EXITED, from_spark
from exactly.text import message

COMMAND = "c\nt\ngetX\ne\n"  # any call: the connection fails first


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def raised(call: Callable[[], object]) -> Exception:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


def refused_by_pyspark_client() -> Exception:
    client = JavaClient(JavaParameters(port=closed_port()), PythonParameters())
    client.gateway_property = GatewayProperty(False, PythonProxyPool())
    return raised(lambda: client.send_command(COMMAND))


def refused_by_gateway_client() -> Exception:
    client = GatewayClient(gateway_parameters=GatewayParameters(port=closed_port()))
    return raised(lambda: client.send_command(COMMAND))


def refused_elsewhere() -> Exception:
    return raised(lambda: socket.create_connection(("127.0.0.1", closed_port()), timeout=5))


def test_a_refused_py4j_connection_says_the_jvm_exited() -> None:
    error = refused_by_pyspark_client()
    assert isinstance(error, ConnectionRefusedError)  # what made it blame the data dir
    assert one_line(error) == JVM_EXITED


def test_a_py4j_network_error_says_the_jvm_exited() -> None:
    error = refused_by_gateway_client()
    assert type(error).__name__ == "Py4JNetworkError"
    assert one_line(error) == JVM_EXITED
    assert str(from_spark(error)) == JVM_EXITED  # a query's failure says the same


def test_a_callback_server_that_cannot_bind_is_not_the_jvm() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        parameters = CallbackServerParameters(port=busy.getsockname()[1])
        server = CallbackServer(
            PythonProxyPool(), GatewayClient(), callback_server_parameters=parameters
        )
        error = raised(server.start)
    assert type(error).__name__ == "Py4JNetworkError"
    assert one_line(error) is None


def test_other_os_errors_keep_their_message() -> None:
    refused = one_line(refused_elsewhere())
    assert refused is not None and "Spark" not in refused
    denied = one_line(PermissionError(13, "Permission denied", "/data/log"))
    assert denied is not None
    assert denied.startswith("cannot use /data/log: Permission denied; check that the data dir")


def test_exactly_errors_are_their_message_and_bugs_have_none() -> None:
    assert one_line(ConfigError("bad window")) == "bad window"
    assert one_line(ValueError("a bug")) is None


def test_main_prints_the_jvm_line_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = refused_by_pyspark_client()

    def app(**_: object) -> None:
        raise error

    monkeypatch.setattr(exactly.cli, "cli", app)
    with pytest.raises(SystemExit) as exited:
        main(["pipeline"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == message(f"error: {JVM_EXITED}") + "\n"  # 80 columns
    assert "\n" not in JVM_EXITED and "writable" not in JVM_EXITED
