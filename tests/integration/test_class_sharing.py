"""The driver JVM really maps the class-sharing archive the test session prepared, and gets the
options of ``[spark] jit``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.spark.class_sharing import prepare

SESSION = """
from exactly.config import Settings
from exactly.spark.session import build_session
spark = build_session(Settings(), master="local[1]")
assert spark.range(10).count() == 10
print(spark.sparkContext.getConf().get("spark.driver.extraJavaOptions"))
"""


def driver_options(tmp_path: Path, **env: str) -> str:
    """The driver's Java options; with ``-Xshare:on`` a JVM that cannot map its archive fails."""
    result = subprocess.run(
        [sys.executable, "-c", SESSION],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "JDK_JAVA_OPTIONS": "-Xshare:on",
            "EXACTLY_DATA_DIR": str(tmp_path),
            **env,
        },
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.spark
def test_the_driver_maps_the_archive(tmp_path: Path) -> None:
    archive = prepare()
    assert archive is not None
    options = driver_options(tmp_path)
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-XX:TieredStopAtLevel=1" in options  # [spark] jit = "quick", the default


@pytest.mark.spark
def test_class_sharing_can_be_turned_off(tmp_path: Path) -> None:
    options = driver_options(
        tmp_path, EXACTLY_SPARK__CLASS_SHARING="false", EXACTLY_SPARK__JIT="full"
    )
    assert "SharedArchiveFile" not in options
    assert "TieredStopAtLevel" not in options
