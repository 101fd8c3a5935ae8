"""What a cluster needs from the driver: the package shipped as a zip, rocksdb refused."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from exactly.dedupe.driver import refuse_local_store
from exactly.errors import ConfigError
from exactly.spark.session import package_zip


def test_the_package_zip_holds_exactly_with_its_data_and_is_named_by_content(
    tmp_path: Path,
) -> None:
    first = package_zip(tmp_path)
    assert package_zip(tmp_path) == first  # same content, same name: made once
    names = zipfile.ZipFile(first).namelist()
    assert "exactly/__init__.py" in names
    assert "exactly/console/page.html" in names
    assert not [name for name in names if "__pycache__" in name]


def test_the_redis_store_and_the_console_page_load_from_the_zip(tmp_path: Path) -> None:
    path = package_zip(tmp_path)
    probe = (
        f"import sys; sys.path.insert(0, {str(path)!r})\n"
        "import exactly.dedupe.redis.transaction as transaction\n"
        f"assert transaction.__file__.startswith({str(path)!r}), transaction.__file__\n"
        "from importlib import resources\n"
        "assert '<html' in (resources.files('exactly.console') / 'page.html').read_text()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("master", ["spark://10.1.2.3:7077", "yarn", "k8s://https://api:443"])
def test_rocksdb_is_refused_on_a_master_that_is_not_local(master: str) -> None:
    with pytest.raises(ConfigError, match='use store = "redis://'):
        refuse_local_store("rocksdb", master)


def test_other_stores_and_local_masters_pass() -> None:
    refuse_local_store("rocksdb", "local[2]")
    refuse_local_store("redis", "spark://10.1.2.3:7077")
    refuse_local_store("spark-state", "yarn")
