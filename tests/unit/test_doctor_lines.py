"""How ``exactly doctor`` tells a finding: one line in 80 columns, the fix kept whole."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from exactly.cli.probes import Finding, compact, reason, shorten


def test_a_line_as_it_reads() -> None:
    assert Finding("log", True, "sqlite:///d/log", "reachable").line() == (
        "✓ log       sqlite:///d/log reachable"
    )
    failed = Finding("jobdb", False, "mysql://h:1/x", "refused", "start it or fix [delivery] jobdb")
    assert failed.line() == "✗ jobdb     mysql://h:1/x: refused; start it or fix [delivery] jobdb"
    assert Finding("config", False, "", "setting x: bad").line() == "✗ config    setting x: bad"


def test_a_long_line_keeps_the_fix_and_shortens_what_was_checked() -> None:
    what = "postgresql://" + "very-long-host-name." * 4 + "example:5432/analytics"
    line = Finding("aggregate", False, what, "refused", "start it or fix [aggregate] url").line()
    assert len(line) == 80
    assert line.startswith("✗ aggregate postgresql://ver…")
    assert line.endswith("analytics: refused; start it or fix [aggregate] url")


@given(
    st.text(max_size=200),
    st.text(max_size=200),
    st.text(max_size=40),
    st.booleans(),
)
def test_every_line_fits(what: str, said: str, fix: str, ok: bool) -> None:
    assert len(Finding("name", ok, what, said, fix).line()) <= max(80, 12 + 2 + len(fix) + 24)


@given(st.text(), st.integers(min_value=0, max_value=100))
def test_shorten(text: str, room: int) -> None:
    short = shorten(text, room)
    assert len(short) <= room
    if len(" ".join(text.split())) <= room:
        assert short == " ".join(text.split())


def test_compact_hides_credentials_and_options() -> None:
    assert compact("postgresql://app:pw@db:5432/x?sslmode=require") == "postgresql://db:5432/x"
    assert compact("kafka://b1:9093,b2:9093?sasl.password=s") == "kafka://b1:9093,b2:9093"
    assert compact("redis://:pw@cache:6379/0") == "redis://cache:6379/0"
    assert compact("sqlite:///srv/x/log") == "sqlite:///srv/x/log"
    assert compact("/srv/archive") == "/srv/archive"


def test_reasons_in_a_few_words() -> None:
    assert reason(ConnectionRefusedError(111, "Connection refused")) == "refused"
    assert reason(socket.gaierror(-2, "Name or service not known")) == "no such host"
    assert reason(OSError('could not translate host name "x" to address')) == "no such host"
    assert reason(TimeoutError("timed out")) == "timed out"
    assert reason(OSError('password authentication failed for user "app"')) == (
        "wrong user or password"
    )
    assert reason(ValueError("something\n  else")) == "something else"
