"""The local SPARK_HOME shim (``spark/home.py``): links to one installation's Spark, one shim per
installation, made in a temporary cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.spark.home import spark_home


def test_the_shim_links_the_installed_spark_without_its_zip(tmp_path: Path) -> None:
    import pyspark

    installed = Path(pyspark.__file__).parent
    home = spark_home(cache=tmp_path)
    assert home is not None and home.parent == tmp_path / "exactly"
    for name in ("bin", "jars", "sbin"):
        assert (home / name).resolve() == (installed / name).resolve()
    assert not (home / "python" / "lib" / "pyspark.zip").exists()
    assert spark_home(cache=tmp_path) == home  # made once, found again


def test_two_installations_never_share_a_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two virtualenvs with the same PySpark: each its own shim, neither repointed by the
    other (a JVM starting meanwhile would find jars its class-sharing archive does not know)."""
    import pyspark

    first = spark_home(cache=tmp_path)
    assert first is not None
    jars = (first / "jars").resolve()
    other = tmp_path / "venv-b" / "pyspark"
    for name in ("bin", "jars", "sbin", "python/lib"):
        (other / name).mkdir(parents=True)
    monkeypatch.setattr(pyspark, "__file__", str(other / "__init__.py"))
    second = spark_home(cache=tmp_path)
    assert second is not None and second != first
    assert (second / "jars").resolve() == (other / "jars").resolve()
    assert (first / "jars").resolve() == jars
