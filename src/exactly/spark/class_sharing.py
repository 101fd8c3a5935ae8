"""A shorter start for the driver JVM: Spark's classes mapped from an archive (Java's AppCDS).

A streaming command's JVM spends most of its start-up loading, parsing and verifying some
thousands of Spark classes, the same ones every time. Java's class data sharing maps them
from an archive instead (``bench/startup.py`` measures the gain). The archive belongs to one
JVM binary and one set of Spark jars, so it is named by a digest of both and kept under
``~/.cache/exactly/class-sharing/``.

When a command finds no archive, it starts as before and launches a trainer in the background
(``python -m exactly.spark.class_training ARCHIVE``, niced, in its own session): a small local
query through the ``exactly`` source and sink, a group-by and ``foreachBatch``, in a JVM started
with ``-XX:ArchiveClassesAtExit``. The trainer stops Spark, waits for its JVM to exit (the JVM
writes the archive on the way out) and only then moves the archive into place, so no command ever
maps a half-written file. One trainer at a time (a lock beside the archive); a trainer that
fails leaves nothing, and the next command tries again after :data:`RETRY_SECONDS`. A stale
or unreadable archive costs nothing but the time saved: the JVM checks it and falls back to
loading classes (``-Xshare:auto``). Turn it off with ``[spark] class_sharing = false``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

RETRY_SECONDS = 3_600.0  # after a failed training, how long before a command tries again
PREPARE_WAIT = 600.0  # seconds prepare() waits for a trainer another process started
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off -Xlog:class+path=off"


def archive_path(java: Path, spark_home: Path | None, cache: Path | None = None) -> Path:
    """Where the archive for this JVM and these Spark jars lives (it may not exist yet)."""
    import pyspark

    home = spark_home or Path(pyspark.__file__).parent
    jars = (home / "jars").resolve()  # exactly's local SPARK_HOME links to the installed jars
    digest = hashlib.sha256()
    for path in [java.resolve(), java.resolve().parent.parent / "lib" / "modules"]:
        with contextlib.suppress(OSError):
            stat = path.stat()
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update(f"{home}\n{jars}\n".encode())  # the classpath as the JVM sees it, and its jars
    with contextlib.suppress(OSError):
        for jar in sorted(jars.iterdir()):  # the JVM checks each jar's size and time
            found = jar.stat()
            digest.update(f"{jar.name}:{found.st_size}:{found.st_mtime_ns}\n".encode())
    root = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "exactly" / "class-sharing" / f"spark-{digest.hexdigest()[:16]}.jsa"


def archive_for(java: Path) -> Path:
    """The archive for ``java`` and the Spark of ``SPARK_HOME``; unset, of the local shim a
    session would set it to (``home.py``), else of the installed PySpark."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return archive_path(java, Path(home))
    from exactly.spark.home import spark_home

    return archive_path(java, spark_home())


def state(archive: Path) -> str:
    """What a user should know of ``archive``: ready, being made, or failed lately."""
    if archive.is_file():
        return f"ready ({archive.stat().st_size / 1e6:.0f} MB in {archive.parent})"
    if _locked(lock_path(archive)):
        return "being made in the background; later starts will be faster"
    failed = archive.with_suffix(".failed")
    if failed.exists():
        return f"could not be made ({failed}); started without it, retried hourly"
    return "not made yet; the next Spark command starts making it"


def prepare() -> Path | None:
    """Make the archive for this machine's Java and Spark now, in the foreground (~40 s once).

    For a test session that starts many JVMs; None if it could not be made (no Java, say).
    """
    from exactly.errors import ExactlyError
    from exactly.spark.java import use_java

    try:
        java = use_java()
    except ExactlyError:
        return None
    archive = archive_for(java.java)
    if not archive.is_file():
        subprocess.run(
            [sys.executable, "-m", "exactly.spark.class_training", str(archive)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=_trainer_env(),
            check=False,
        )
    deadline = time.monotonic() + PREPARE_WAIT
    while not archive.is_file() and _locked(lock_path(archive)) and time.monotonic() < deadline:
        time.sleep(1)  # a trainer a command started is at it: wait for its archive
    return archive if archive.is_file() else None


def _trainer_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("EXACTLY_", "JDK_JAVA"))}


def java_options(archive: Path) -> str:
    """The driver's options to use ``archive``; empty (and a trainer started) if it is missing."""
    if archive.is_file():
        return f"-XX:SharedArchiveFile={archive} {QUIET}"
    start_trainer(archive)
    return ""


def start_trainer(archive: Path) -> None:
    """Launch the background trainer, unless one runs or one failed recently."""
    failed = archive.with_suffix(".failed")
    with contextlib.suppress(OSError):
        if time.time() - failed.stat().st_mtime < RETRY_SECONDS:
            return
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        if _locked(lock_path(archive)):
            return
        subprocess.Popen(
            [sys.executable, "-m", "exactly.spark.class_training", str(archive)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=_trainer_env(),
        )
    except OSError:
        return  # no cache dir or no process: start as before, every time


def lock_path(archive: Path) -> Path:
    return archive.with_suffix(".lock")


def _locked(path: Path) -> bool:
    """Whether another process holds the trainer's lock (not when it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
