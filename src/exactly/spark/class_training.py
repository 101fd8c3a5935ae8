"""The class-sharing trainer: ``python -m exactly.spark.class_training ARCHIVE``.

Runs a small local query of each kind the commands run (the ``exactly`` source and sink, a
group-by, ``foreachBatch``) in a driver JVM started with ``-XX:ArchiveClassesAtExit``, waits for
that JVM to exit (it writes the archive on the way out), then moves the archive into place:
see :mod:`exactly.spark.class_sharing`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.spark.class_sharing import QUIET, lock_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def train(archive: Path) -> bool:
    """Write ``archive`` (see the module docstring); whether it is in place afterwards."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path(archive), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another trainer is at it
        if archive.is_file():
            return True
        staged = archive.with_name(f".{archive.name}.{os.getpid()}")
        try:
            try:
                written = _run_training(staged)
            except Exception:  # noqa: BLE001 - a trainer that fails for any reason leaves nothing
                written = False
            if written and staged.is_file() and staged.stat().st_size > 0:
                staged.replace(archive)
                archive.with_suffix(".failed").unlink(missing_ok=True)
                return True
        finally:
            staged.unlink(missing_ok=True)
        archive.with_suffix(".failed").touch()
        return False
    finally:
        os.close(fd)


def _run_training(staged: Path) -> bool:
    """A small query of each kind in a JVM that writes ``staged`` when it exits."""
    from pyspark import SparkContext

    from exactly.config import Settings
    from exactly.log import Record, open_log
    from exactly.spark.session import build_session

    with tempfile.TemporaryDirectory(prefix="exactly-class-sharing-") as scratch:
        work = Path(scratch)
        settings = Settings(data_dir=work / "data", spark={"class_sharing": False})
        spark = build_session(
            settings,
            app_name="exactly-class-sharing",
            master="local[2]",
            extra_java_options=f"-XX:ArchiveClassesAtExit={staged} {QUIET}",
        )
        log_url = f"sqlite://{work / 'log'}"
        with open_log(log_url) as log:
            for topic in ("source", "copy"):
                log.create_topic(topic, 2)
            for partition in range(2):
                log.append("source", partition, [Record(b'{"n": 1}', key=b"k")] * 100)
        source = (
            spark.readStream.format("exactly")
            .option("log", log_url)
            .option("topic", "source")
            .load()
        )
        copy = (
            source.writeStream.format("exactly")
            .option("log", log_url)
            .option("topic", "copy")
            .option("checkpointLocation", str(work / "copy"))
            .trigger(availableNow=True)
            .start()
        )
        copy.awaitTermination()
        counted = (
            source.groupBy("partition")
            .count()
            .writeStream.foreachBatch(_collect)
            .outputMode("update")
            .option("checkpointLocation", str(work / "count"))
            .trigger(availableNow=True)
            .start()
        )
        counted.awaitTermination()
        gateway = SparkContext._gateway
        spark.stop()
        if gateway is None:
            return False
        process = gateway.proc
        gateway.shutdown()
        with contextlib.suppress(OSError):
            process.stdin.close()  # the JVM exits on end of input, and writes the archive then
        return bool(process.wait(timeout=300) == 0)


def _collect(frame: DataFrame, batch_id: int) -> None:
    frame.collect()


if __name__ == "__main__":
    with contextlib.suppress(OSError):
        os.nice(10)
    sys.exit(0 if train(Path(sys.argv[1])) else 1)
