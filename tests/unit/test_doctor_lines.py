"""How ``exactly doctor`` tells a finding: one line in 80 columns, the fix kept whole."""

from __future__ import annotations

import socket
import string
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.cli.probes import Finding, Probe, compact, reason, run_probes

PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "


def test_a_line_as_it_reads() -> None:
    assert Finding("log", True, "sqlite:///d/log", "reachable").line() == (
        "✓ log       sqlite:///d/log reachable"
    )
    failed = Finding("jobdb", False, "mysql://h:1/x", "refused", "start it or fix [delivery] jobdb")
    assert failed.line() == "✗ jobdb     mysql://h:1/x: refused; start it or fix [delivery] jobdb"
    assert Finding("config", False, "", "setting x: bad").line() == "✗ config    setting x: bad"


def test_a_long_finding_goes_on_under_what_was_checked_and_nothing_is_cut() -> None:
    what = "postgresql://" + "very-long-host-name." + "example:5432/analytics"
    text = Finding("aggregate", False, what, "refused", "start it or fix [aggregate] url").line()
    lines = text.splitlines()
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines)
    assert lines[0] == f"✗ aggregate {what}: refused;"
    assert lines[1] == "    start it or fix [aggregate] url"


@given(
    st.text(alphabet=PRINTABLE, max_size=200),
    st.text(alphabet=PRINTABLE, max_size=200),
    st.text(alphabet=PRINTABLE, max_size=40),
    st.booleans(),
)
def test_every_line_fits_unless_one_word_is_longer(
    what: str, said: str, fix: str, ok: bool
) -> None:
    finding = Finding("name", ok, what, said, fix)
    longest = max((len(word) for word in f"{what} {said} {fix}".split()), default=0)
    for line in finding.line().splitlines():
        assert len(line) <= max(80, 4 + longest + 2)
    shown = " ".join(finding.line().split())
    assert " ".join(what.split()) in shown  # nothing cut


def test_compact_hides_credentials_and_options() -> None:
    assert compact("postgresql://app:pw@db:5432/x?sslmode=require") == "postgresql://db:5432/x"
    assert compact("kafka://b1:9093,b2:9093?sasl.password=s") == "kafka://b1:9093,b2:9093"
    assert compact("redis://:pw@cache:6379/0") == "redis://cache:6379/0"
    assert compact("sqlite:///srv/x/log") == "sqlite:///srv/x/log"
    assert compact("/srv/archive") == "/srv/archive"


def test_reasons_in_a_few_words() -> None:
    assert reason(ConnectionRefusedError(111, "Connection refused")) == "refused"
    quoted = OSError(
        "could not list topics on the Kafka log at kafka://h:9?sasl.username=app&sasl.password="
        "*** (KafkaError{str=Broker transport failure})"
    )
    assert reason(quoted) == (
        "could not list topics on the Kafka log at kafka://h:9 (KafkaError{str=Broker transport "
        "failure})"
    )
    assert reason(socket.gaierror(-2, "Name or service not known")) == "no such host"
    assert reason(OSError('could not translate host name "x" to address')) == "no such host"
    assert reason(TimeoutError("timed out")) == "timed out"
    assert reason(OSError('password authentication failed for user "app"')) == (
        "wrong user or password"
    )
    assert reason(ValueError("something\n  else")) == "something else"


def test_the_modules_probes_need_are_imported_before_they_run_in_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # two probe threads importing at once deadlocked once on Python's module locks in CI
    (tmp_path / "probe_needs_this.py").write_text(
        "import threading\nIMPORTED_IN = threading.current_thread()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "probe_needs_this", raising=False)

    def run() -> str:
        import probe_needs_this  # type: ignore[import-not-found]

        return probe_needs_this.IMPORTED_IN.name

    probes = [Probe("x", "x", "fix", run, ("probe_needs_this", "no_such_module_here"))]
    [finding] = run_probes(probes)
    assert finding.ok and finding.said == threading.current_thread().name
