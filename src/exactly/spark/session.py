"""The SparkSession `exactly` uses.

Java as found by ``java.py``, its driver started from an archive of Spark's classes when one is
ready (``class_sharing.py``); Python workers on this interpreter (so they import ``exactly``),
starting faster in local mode (``home.py``); the RocksDB state store with changelog checkpointing
(small, incremental state commits for dedupe and aggregates); quiet logs (errors only on the
console, WARN and above in ``DATA_DIR/logs/spark-APP.log``, configured by
``DATA_DIR/spark/log4j2.properties``); scratch space and default checkpoints under the data dir;
and the ``exactly`` data source registered.

On a master that is not local, the ``exactly`` package is shipped to the executors as a zip
(``SparkContext.addPyFile``), so a worker needs only PySpark's own Python dependencies (pyarrow,
pandas) and the clients of the backends it writes to (see docs/cluster.md), never ``exactly``.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.config import Settings
from exactly.spark import class_sharing
from exactly.spark.home import spark_home
from exactly.spark.java import use_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LOG_CONF = "spark.exactly.log"  # the driver's log file (spark_log), for messages
# The console gets errors only, and not Spark's task-failure reports: the query's own failure
# says what went wrong and retried tasks are normal. Everything at WARN and above, from every
# component, goes to a rotating file (spark_log) so that a failure's cause is kept.
LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
rootLogger.appenderRef.stderr.level = error
rootLogger.appenderRef.file.ref = file
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
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
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""
QUIET_ON_CONSOLE = (  # to the file only
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.datasources.v2",
    "org.apache.spark.sql.execution.streaming",
    "org.apache.spark.util.Utils",
)
LOG4J += "".join(
    f"logger.quiet{n}.name = {name}\nlogger.quiet{n}.additivity = false\n"
    f"logger.quiet{n}.appenderRef.file.ref = file\n"
    for n, name in enumerate(QUIET_ON_CONSOLE)
)


def spark_log(settings: Settings, app_name: str) -> Path:
    """The file a Spark application's driver logs to: WARN and above, rotated at 10 MB, four
    old files kept (``.1`` .. ``.4``); an error a part prints names it."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", app_name)
    return settings.data_dir.resolve() / "logs" / f"spark-{name}.log"


def build_session(
    settings: Settings,
    app_name: str = "exactly",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    extra_java_options: str = "",
) -> SparkSession:
    """Start (or return the running) SparkSession configured from ``settings``.

    ``master`` overrides ``spark.master`` of the settings; ``conf`` adds or overrides Spark
    settings; ``extra_java_options`` go to the driver JVM after exactly's own.
    """
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
    log4j = _log4j_file(scratch)
    log = spark_log(settings, app_name)
    log.parent.mkdir(parents=True, exist_ok=True)
    java_options = (
        f"-Dderby.system.home={scratch / 'derby'} -Dlog4j2.configurationFile={log4j} "
        f"-Dexactly.spark.log={log}"
    )
    if settings.spark.class_sharing:
        java_options += f" {class_sharing.java_options(class_sharing.archive_for(java.java))}"
    java_options = f"{java_options} {extra_java_options}".strip()
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.local.dir", str(scratch / "tmp"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.sql.streaming.checkpointLocation", str(scratch / "checkpoints"))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.driver.extraJavaOptions", java_options)
        .config(LOG_CONF, str(log))
    )
    for key, value in (conf or {}).items():
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


def _log4j_file(scratch: Path) -> Path:
    path = scratch / "log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}")
        staged.write_text(LOG4J)
        staged.replace(path)
    return path


def package_zip(directory: Path) -> Path:
    """``exactly``'s Python files as a zip under ``directory``, named by their digest (so a
    changed package is shipped under a new name and executors never run a stale copy)."""
    import exactly

    root = Path(exactly.__file__).resolve().parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                info = zipfile.ZipInfo(str(path.relative_to(root.parent)), (1980, 1, 1, 0, 0, 0))
                archive.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    data = buffer.getvalue()
    path = directory / f"exactly-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}")
        staged.write_bytes(data)
        staged.replace(path)
    return path


def read_tasks(spark: SparkSession) -> int:
    """The read tasks a job's micro-batch needs at most: one per core of the application.

    A read task costs a Python worker's round trip whatever it reads, so more tasks than cores
    only add that cost (``bench/spark_batch_cost.py``).
    """
    return max(1, spark.sparkContext.defaultParallelism)
