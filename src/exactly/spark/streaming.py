"""Running a streaming query the way every ``exactly`` streaming command does.

``copy``, ``dedupe`` and ``aggregate`` share three things, kept here once:

* :func:`checkpoint_lock`: one query per checkpoint (two would corrupt it), and a checkpoint
  whose first micro-batch was never planned made fit to start;
* :func:`run_query`: start, trigger (``--until-caught-up`` is ``Trigger.AvailableNow``), report
  each micro-batch's progress once, stop, and turn a failure into the error a task raised (a
  start that Spark's fixed wait for the Python source failed is made again);
* :data:`STOPPING`: a graceful stop for every query of the process (``exactly up`` sets it on
  SIGTERM): each query ends between two micro-batches, not inside one;
* :func:`from_spark`: that error, recovered from the text Spark wraps it in, and
  :func:`jvm_exited`: the failure that is no query's fault, the Spark JVM gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly import errors
from exactly.errors import ExactlyError, InvalidEvent, StreamError
from exactly.spark.checkpoint import planned

if TYPE_CHECKING:
    from pyspark.sql.streaming.readwriter import DataStreamWriter

Report = dict[str, Any]
_RAISED = re.compile(r"exactly\.errors\.(\w+): (.+)")
# What Spark requires to be empty when a checkpoint has no planned batch yet.
_STARTED_ONLY = ("offsets", "commits", "state")
# Set to end every running query after its current micro-batch (run_query's loop watches it).
STOPPING = threading.Event()
BETWEEN_BATCHES_WAIT = 20.0  # seconds a graceful stop waits for a micro-batch to end
# Spark starts a query's Python source in a fresh Python process and waits a fixed 10 s for it
# to connect back (``PythonWorkerFactory.createSimpleWorker``, not a setting); on a loaded
# machine, with several queries starting at once, its imports can take longer. Nothing was
# planned then, and a start again resumes from the checkpoint like any restart: tried so often,
# each after a pause drawn at random and longer each time, so that the queries of a process
# that failed together do not start together again.
RUNNER_LATE = "Python worker failed to connect back"
QUERY_STARTS = 5
START_PAUSE = (2.0, 8.0)  # seconds, times the starts made so far


@contextlib.contextmanager
def checkpoint_lock(checkpoint: Path, command: str) -> Iterator[None]:
    """Hold a lock beside the checkpoint for the whole run; a second ``command`` is refused."""
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(checkpoint.parent / f"{checkpoint.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StreamError(
                f"another {command} is running with checkpoint {checkpoint}; stop it first"
            ) from None
        clear_unplanned(checkpoint)
        yield
    finally:
        os.close(fd)


def clear_unplanned(checkpoint: Path) -> list[Path]:
    """Remove what a run killed before planning its first micro-batch left in ``checkpoint``.

    Spark writes ``offsets/0`` through a hidden temporary file and a rename. A process killed
    between the two leaves the temporary file behind; Spark's offset log ignores it, sees no
    batch, and then refuses to start because ``offsets`` is not empty
    (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). With no numbered file in ``offsets``
    nothing was planned, so nothing was written or committed either: the leftovers are safe
    to remove. Returns what was removed.
    """
    if not (checkpoint / "offsets").is_dir() or planned(checkpoint):
        return []
    removed = []
    for name in _STARTED_ONLY:
        folder = checkpoint / name
        if folder.is_dir() and any(folder.iterdir()):
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def run_query(
    writer: DataStreamWriter,
    *,
    until_caught_up: bool,
    trigger_seconds: float,
    on_batch: Callable[[Report], None] | None = None,
) -> dict[int, Report]:
    """Start the query and run it until caught up (or stopped); the progress of each batch.

    ``on_batch`` sees each micro-batch's progress report once, in order. A failure raises the
    :class:`~exactly.errors.ExactlyError` a task raised, when there is one; a query whose Python
    source did not connect back in Spark's fixed time is started again (:data:`QUERY_STARTS`).
    """
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    if until_caught_up:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(trigger_seconds * 1000)} milliseconds")
    batches: dict[int, Report] = {}

    def note() -> None:
        for report in progress.new_reports():
            batch = int(report["batchId"])
            if batch not in batches:
                batches[batch] = dict(report)
                if on_batch is not None:
                    on_batch(batches[batch])

    log = _log_file(writer)
    starts = 1
    while True:
        try:
            query = writer.start()
        except (PySparkException, Py4JError) as error:
            raise from_spark(error, log) from None
        progress = ProgressReader(query)
        try:
            while not query.awaitTermination(1):
                note()
                if STOPPING.is_set():
                    _stop_between_batches(query)
            note()
            return batches
        except (PySparkException, Py4JError) as error:
            if RUNNER_LATE not in str(error) or starts == QUERY_STARTS or STOPPING.is_set():
                raise from_spark(error, log) from None
            _say(
                f"warning: query {query.name or query.id}: its Python source did not connect "
                f"back within Spark's fixed 10 s (a loaded machine); starting it again "
                f"({starts + 1} of {QUERY_STARTS})"
            )
        finally:
            if query.isActive:
                query.stop()
        if STOPPING.wait(random.uniform(*START_PAUSE) * starts):
            return batches  # stopped meanwhile: nothing is in flight
        starts += 1


class ProgressReader:
    """A query's progress reports, each read once: :meth:`new_reports` gives those Spark added
    since the previous call.

    PySpark's ``recentProgress`` turns every report Spark keeps (up to 100) into JSON and back
    on each call: 15 ms a call with 90 kept, paid every second by each query of ``up``. This
    reads the same list from its newest end, one report at a time, and stops at the newest one
    read before; when that one has left Spark's list, the whole list is new.
    """

    def __init__(self, query: Any) -> None:
        self.query = query
        self.newest: tuple[object, object] | None = None  # (batchId, timestamp) read last

    def new_reports(self) -> list[Report]:
        """The reports added since the previous call, oldest first."""
        import json

        from pyspark.sql.streaming.listener import StreamingQueryProgress

        kept = self.query._jsq.recentProgress()  # a Java array: each item crosses py4j when read
        found: list[Report] = []
        for index in range(len(kept) - 1, -1, -1):
            report = StreamingQueryProgress.fromJson(json.loads(kept[index].json()))
            if (report["batchId"], report["timestamp"]) == self.newest:
                break
            found.append(report)
        found.reverse()
        if found:
            self.newest = (found[-1]["batchId"], found[-1]["timestamp"])
        return found


def _stop_between_batches(query: Any) -> None:
    """Stop ``query`` once no micro-batch is running (or after ``BETWEEN_BATCHES_WAIT``).

    A micro-batch stopped halfway is safe (it is replayed and its marker stops it), but a
    graceful stop should not leave work to redo. Polled often, the gap between two triggers is
    found; a batch that does not end within the wait is interrupted.
    """
    deadline = time.monotonic() + BETWEEN_BATCHES_WAIT
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive", False):
            break
        time.sleep(0.05)
    query.stop()


def _log_file(writer: DataStreamWriter) -> str | None:
    """The driver's log file (``session.spark_log``), if the session was built by exactly."""
    from exactly.spark.session import LOG_CONF

    try:
        found = writer._spark.conf.get(LOG_CONF, None)
    except Exception:  # noqa: BLE001 - only for a message
        return None
    return None if found is None else str(found)


def _say(line: str) -> None:
    from exactly.text import message

    print(message(line), file=sys.stderr, flush=True)


def from_spark(error: BaseException, log: str | None = None) -> ExactlyError:
    """The ExactlyError a Python task or planner raised, recovered from Spark's exception text.

    Spark wraps a Python exception in Java exceptions and reports it as text; the first
    ``exactly.errors.Name: message`` line in it is the cause a user can act on. Any other
    failure is named by its first line, and ``log`` (the driver's log file, which keeps the
    stack traces) is named with it.
    """
    if isinstance(error, ExactlyError):
        return error
    if jvm_exited(error):
        return StreamError(JVM_EXITED)
    text = str(error)
    found = _RAISED.search(text)
    if found is not None:
        kind = getattr(errors, found.group(1), None)
        if isinstance(kind, type) and issubclass(kind, ExactlyError):
            message = found.group(2).strip()
            return InvalidEvent("invalid", message) if kind is InvalidEvent else kind(message)
    first = next((line.strip() for line in text.splitlines() if line.strip()), repr(error))
    where = "" if log is None else f" (stack traces in {log})"
    return StreamError(f"the streaming query failed: {first}{where}")


JVM_EXITED = (
    "the Spark JVM exited (killed?); see DATA_DIR/logs/spark-*.log and run the command again "
    "(a streaming query resumes from its checkpoint)"
)


def jvm_exited(error: BaseException) -> bool:
    """Whether ``error`` means the Spark JVM is gone: py4j lost, or could not reopen, its socket.

    py4j reports a lost connection as ``Py4JNetworkError`` (as it does a callback server of
    Python's own that cannot bind its port: not the JVM) but lets a refused reconnection (the JVM
    no longer listens) through as a plain ``ConnectionRefusedError``, an ``OSError`` that would
    otherwise read as a file problem; it is recognised by being raised inside py4j.
    """
    from py4j.protocol import Py4JNetworkError

    if isinstance(error, Py4JNetworkError):
        return "callback server" not in str(error)
    if not isinstance(error, ConnectionError):
        return False
    frame = error.__traceback__
    while frame is not None:
        if str(frame.tb_frame.f_globals.get("__name__", "")).startswith("py4j."):
            return True
        frame = frame.tb_next
    return False
