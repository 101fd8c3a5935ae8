"""The SparkSession `exactly` uses.

Java as found by ``java.py``, its driver started from an archive of Spark's classes when one is
ready (``class_sharing.py``); Python workers on this interpreter (so they import ``exactly``),
starting faster in local mode (``home.py``); the RocksDB state store with changelog checkpointing
(small, incremental state commits for dedupe and aggregates); a quiet terminal (:func:`start_jvm`:
Spark's log, WARN and above, in ``DATA_DIR/logs/spark-APP.log``, configured by
``DATA_DIR/spark/log4j2.properties``; whatever else the JVM prints in ``spark-APP.stderr.log``
beside it; both on the terminal too with ``--verbose``); scratch space and default checkpoints
under the data dir; and the ``exactly`` data source registered.

On a master that is not local, the ``exactly`` package is shipped to the executors as a zip
(``SparkContext.addPyFile``), so a worker needs only PySpark's own Python dependencies (pyarrow,
pandas) and the clients of the backends it writes to (see docs/cluster.md), never ``exactly``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import sys
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.config import Settings
from exactly.errors import EnvironmentProblem
from exactly.spark import class_sharing
from exactly.spark.home import spark_home
from exactly.spark.java import use_java
from exactly.spark.settings import JIT_OPTIONS

if TYPE_CHECKING:
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Checkpoint files written through Hadoop's FileSystem API, not its FileContext (Spark's
# default). Without Hadoop's native library, the FileContext path starts a `readlink` process
# for each side of every rename and a `chmod` for every file it creates: about 24 processes a
# micro-batch, 80 ms of each commit. Through FileSystem only the `chmod`s remain: a micro-batch
# costs 0.7x the CPU (docs/pace.md, "Checkpoint files"). The files are the same, so either
# reads the other's checkpoints; a run holds its checkpoint's lock, so the non-atomic
# exists-then-rename of this manager meets no second writer.
CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
LOG_CONF = "spark.exactly.log"  # the driver's log file (spark_log), for messages
VERBOSE = "EXACTLY_VERBOSE"  # set (``--verbose``): the JVM's output on the terminal too
# Everything at WARN and above, from every component, goes to a rotating file (spark_log) so that
# a failure's cause is kept; nothing goes to the console, where a failure reaches the user as the
# query's own one-line error. (With no console appender Spark's Logging prints no "Setting default
# log level" either.)
LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:exactly.spark.log}
appender.file.filePattern = ${sys:exactly.spark.log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{yyyy-MM-dd HH:mm:ss.SSS} %p [%t] %c: %m%n%ex
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 4
"""
# --verbose: WARN and above on the console too, Spark's task-failure reports included.
LOG4J_VERBOSE = (
    LOG4J
    + """\
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""
)
STDERR_KEPT = 10 << 20  # a JVM output file larger than this is started afresh


def spark_log(settings: Settings, app_name: str) -> Path:
    """The file a Spark application's driver logs to: WARN and above, rotated at 10 MB, four
    old files kept (``.1`` .. ``.4``); an error a part prints names it."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", app_name)
    return settings.data_dir.resolve() / "logs" / f"spark-{name}.log"


def jvm_output(settings: Settings, app_name: str) -> Path:
    """The file the driver JVM's own output goes to (:func:`start_jvm`), beside its log."""
    log = spark_log(settings, app_name)
    return log.with_name(f"{log.stem}.stderr.log")


def verbose() -> bool:
    """Whether the JVM's output goes to the terminal: ``--verbose`` (or ``EXACTLY_VERBOSE``)."""
    return os.environ.get(VERBOSE, "").strip().lower() not in ("", "0", "false", "no")


def build_session(
    settings: Settings,
    app_name: str = "exactly",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    extra_java_options: str = "",
    quiet: bool | None = None,
) -> SparkSession:
    """Start (or return the running) SparkSession configured from ``settings``.

    ``master`` overrides ``spark.master`` of the settings; ``conf`` adds or overrides Spark
    settings; ``extra_java_options`` go to the driver JVM after exactly's own. ``quiet`` (default:
    unless ``--verbose``) keeps the JVM's output off the terminal, in files (:func:`start_jvm`).
    """
    quiet = not verbose() if quiet is None else quiet
    java = use_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = master or settings.spark.master
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback, no warning
        home = None if "SPARK_HOME" in os.environ else spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)  # Python workers start faster: see home.py
    from pyspark.sql import SparkSession

    from exactly.spark.datasource import register

    scratch = settings.data_dir.resolve() / "spark"
    log4j = _log4j_file(scratch, LOG4J if quiet else LOG4J_VERBOSE)
    log = spark_log(settings, app_name)
    log.parent.mkdir(parents=True, exist_ok=True)
    java_options = (
        f"-Dderby.system.home={scratch / 'derby'} -Dlog4j2.configurationFile={log4j} "
        f"-Dexactly.spark.log={log}"
    )
    if settings.spark.class_sharing:
        java_options += f" {class_sharing.java_options(class_sharing.archive_for(java.java))}"
    if JIT_OPTIONS[settings.spark.jit]:
        java_options += f" {JIT_OPTIONS[settings.spark.jit]}"
    java_options = f"{java_options} {extra_java_options}".strip()
    options = {
        "spark.app.name": app_name,
        "spark.master": master,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.local.dir": str(scratch / "tmp"),
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.sql.streaming.checkpointLocation": str(scratch / "checkpoints"),
        "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER,
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.driver.extraJavaOptions": java_options,
        LOG_CONF: str(log),
        **(conf or {}),
    }
    start_jvm(options, jvm_output(settings, app_name) if quiet else None)
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    query_context_loggers()
    if not master.startswith("local"):
        session.sparkContext.addPyFile(str(package_zip(scratch)))
    register(session)
    return session


QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def query_context_loggers() -> None:
    """Make PySpark's two query-context loggers :class:`PySparkLogger` s, once, in this thread.

    A Spark error with a query context logs itself through ``PySparkLogger.getLogger``, which
    swaps the process-wide logger class around ``logging.getLogger``. Two errors raised at once
    in two threads (three queries fail together when the JVM goes) can interleave the swaps and
    create the logger as a plain ``Logger``; from then on every such error raises ``TypeError:
    Logger._log() got an unexpected keyword argument 'file'`` instead of itself. Created here
    first, they are only looked up later; a plain one left by such a race is replaced.
    """
    from pyspark.logger import PySparkLogger

    for name in QUERY_CONTEXT_LOGGERS:
        if not isinstance(logging.Logger.manager.loggerDict.get(name), PySparkLogger):
            logging.Logger.manager.loggerDict.pop(name, None)
            PySparkLogger.getLogger(name)


def start_jvm(options: Mapping[str, str], output: Path | None) -> None:
    """Start the driver JVM with ``options``, its output in the file ``output`` (None: on the
    terminal), unless this process has one already (it keeps the output it was started with).

    What the JVM prints besides Spark's log never reaches the terminal then: the launcher scripts'
    and ``spark-submit``'s messages, the JDK's "WARNING: Using incubator modules" (Spark adds
    ``--add-modules=jdk.incubator.vector`` to every JVM it starts), a ``JDK_JAVA_OPTIONS`` note,
    what a library prints before log4j reads its configuration, and the output of Python workers
    (which Spark copies to its own stderr). If the JVM does not start, the last line it printed
    comes back as the one-line error.
    """
    from pyspark import SparkConf, SparkContext

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        conf = SparkConf(loadDefaults=False).setAll(list(options.items()))
        SparkContext._ensure_initialized(gateway=_launch(conf, output))


def _launch(conf: SparkConf, output: Path | None) -> Any:
    from pyspark.java_gateway import launch_gateway

    if output is None:
        return launch_gateway(conf)  # type: ignore[no-untyped-call]
    output.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if output.stat().st_size > STDERR_KEPT:
            output.unlink()
    with output.open("ab") as sink:  # the JVM keeps its own copy of the descriptor
        sink.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} JVM started\n".encode())
        sink.flush()
        try:
            return launch_gateway(  # type: ignore[no-untyped-call]
                conf, popen_kwargs={"stdout": sink, "stderr": sink}
            )
        except Exception as error:
            raise EnvironmentProblem(
                f"Spark's JVM did not start: {last_line(output)} (see {output})"
            ) from error


def last_line(path: Path) -> str:
    """The last line of ``path`` that says something, in short."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "it printed nothing"
    said = [line.strip() for line in lines if line.strip() and not line.startswith("--- ")]
    if not said:
        return "it printed nothing"
    return said[-1] if len(said[-1]) <= 200 else said[-1][:197] + "..."


def _log4j_file(scratch: Path, text: str) -> Path:
    path = scratch / ("log4j2.properties" if text == LOG4J else "log4j2-verbose.properties")
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}")
        staged.write_text(text)
        staged.replace(path)
    return path


def package_zip(directory: Path) -> Path:
    """``exactly``'s Python files as a zip under ``directory``, named by their digest (so a
    changed package is shipped under a new name and executors never run a stale copy)."""
    import exactly

    return tree_zip(directory, Path(exactly.__file__).resolve().parent, "exactly")


def tree_zip(directory: Path, root: Path, name: str) -> Path:
    """``root`` (a package directory, or one module's file) as a zip under ``directory`` that
    puts it on a Python worker's path, named ``NAME-DIGEST.zip``."""
    paths = sorted(root.rglob("*")) if root.is_dir() else [root]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                info = zipfile.ZipInfo(str(path.relative_to(root.parent)), (1980, 1, 1, 0, 0, 0))
                archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    path = directory / f"{name}-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}")
        staged.write_bytes(data)
        staged.replace(path)
    return path


# A micro-batch's read tasks: one per this many offsets, up to one per core (``read_options``).
READ_TASK_RECORDS = 5_000


def read_tasks(spark: SparkSession) -> int:
    """The read tasks a job's micro-batch needs at most: one per core of the application.

    A read task costs a Python worker's round trip whatever it reads, so more tasks than cores
    only add that cost (``bench/spark_batch_cost.py``).
    """
    return max(1, spark.sparkContext.defaultParallelism)


def read_options(spark: SparkSession) -> dict[str, str]:
    """The ``exactly`` source's task options every job sets: at most a read task per core
    (:func:`read_tasks`), and one per :data:`READ_TASK_RECORDS` offsets below that.

    A second task costs a Python worker's round trip (the aggregate job's micro-batches of 2,000
    events took 0.73x the CPU with one, ``bench/read_task_records.py``) and saves at most half
    of the batch's read time, so a batch of a few thousand records is cheaper read by one: with
    four queries each running a micro-batch a second, ``up`` at a trickle of events pays those
    round trips every second.
    """
    return {"readTasks": str(read_tasks(spark)), "readTaskRecords": str(READ_TASK_RECORDS)}


def own_session(spark: SparkSession) -> SparkSession:
    """A clone of ``spark``: its registrations (the ``exactly`` source), and settings of its
    own, as the session ``foreachBatch`` hands a batch function. A batch job that changes a
    setting for itself (ANSI off, as the route's choosing does) changes it there only."""
    from pyspark.sql import SparkSession

    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())
