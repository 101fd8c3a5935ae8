"""Lake tables for tests: each backend's URL over a fresh place, and a planted uncommitted file.

Backends (:data:`CASES`): the three of :data:`exactly.lake.BACKENDS` on local directories and
a per-test PostgreSQL schema; Iceberg with its catalog in PostgreSQL; Delta and Iceberg with
their files on moto's S3 server. :data:`FILE_CASES`: those whose batches executors write as files.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pyarrow.fs as pafs  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from exactly.lake import BACKENDS, LakeTable
from exactly.lake.columns import event_rows
from tests.archives import MotoServer

CASES = (*BACKENDS, "iceberg+postgresql", "delta+s3", "iceberg+s3")
S3_CASES = ("delta+s3", "iceberg+s3")
FILE_CASES = tuple(case for case in CASES if case != "postgresql")  # executors write files


@contextlib.contextmanager
def lake_url(case: str, tmp_path: Path, s3: MotoServer | None = None) -> Iterator[str]:
    """A URL of an empty lake table of ``case``; skips when its server is absent."""
    from tests.aggregate_db import postgres_missing, postgres_schema
    from tests.conftest import require

    if case == "delta":
        yield f"delta://{tmp_path / 'lake' / 'events'}"
    elif case == "iceberg":
        yield f"iceberg://{tmp_path / 'lake'}"
    elif case == "postgresql":
        require(postgres_missing())
        with postgres_schema() as url:
            yield f"{url}&table=events"
    elif case == "iceberg+postgresql":
        require(postgres_missing())
        with postgres_schema() as url:
            base = url.removeprefix("postgresql://")
            yield f"iceberg+postgresql://{base}&warehouse={tmp_path / 'warehouse'}"
    elif case == "delta+s3":
        assert s3 is not None
        yield (
            f"delta+s3://{s3.bucket()}/lake/events?AWS_ENDPOINT_URL={s3.endpoint}"
            "&AWS_ALLOW_HTTP=true&AWS_REGION=us-east-1"
        )
    elif case == "iceberg+s3":
        assert s3 is not None
        yield (
            f"iceberg://{tmp_path / 'lake'}?warehouse=s3://{s3.bucket()}/lake"
            f"&s3.endpoint={s3.endpoint}&s3.region=us-east-1"
            "&s3.access-key-id=testing&s3.secret-access-key=testing"
        )
    else:
        raise AssertionError(f"no test table for the lake case {case!r}: add one here")


def plant_uncommitted(table: LakeTable, values: list[bytes]) -> str | None:
    """A valid Parquet file of ``values``'s rows where the table's data files go, committed in
    no version (as a batch killed before its commit leaves): its path relative to the table's
    data root, or None for a backend without files."""
    from exactly.lake.delta import DeltaLakeTable
    from exactly.lake.iceberg import IcebergTable
    from exactly.lake.storage import located

    name = f"date={date(2026, 1, 1).isoformat()}/part-00000-{uuid.uuid4()}.parquet"
    if isinstance(table, DeltaLakeTable):
        root_uri, relative = table.uri, name
        filesystem, root = located(root_uri, table._s3())
    elif isinstance(table, IcebergTable):
        found = table._table()
        assert found is not None
        root_uri, relative = found.location(), f"data/{name}"
        filesystem, root = located(root_uri, table._s3())
    else:
        return None
    rows = event_rows(values)
    with filesystem.open_output_stream(f"{root}/{relative}") as stream:
        pq.write_table(rows.drop_columns(["date"]), stream)
    return relative


def exists(table: LakeTable, relative: str) -> bool:
    from exactly.lake.delta import DeltaLakeTable
    from exactly.lake.iceberg import IcebergTable
    from exactly.lake.storage import located

    if isinstance(table, DeltaLakeTable):
        filesystem, root = located(table.uri, table._s3())
    else:
        assert isinstance(table, IcebergTable)
        found = table._table()
        assert found is not None
        filesystem, root = located(found.location(), table._s3())
    return bool(filesystem.get_file_info(f"{root}/{relative}").type != pafs.FileType.NotFound)
