"""The SparkSession `exactly` uses: Java found for it, quiet logs, scratch space in the data dir."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exactly.config import Settings
from exactly.spark.java import use_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def build_session(settings: Settings, app_name: str = "exactly") -> SparkSession:
    """Start (or return the running) SparkSession configured from ``settings``."""
    use_java()
    from pyspark.sql import SparkSession

    scratch = settings.data_dir.resolve() / "spark"
    session = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.local.dir", str(scratch / "tmp"))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.sql.streaming.checkpointLocation", str(scratch / "checkpoints"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={scratch / 'derby'}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
