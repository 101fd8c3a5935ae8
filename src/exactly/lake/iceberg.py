"""Apache Iceberg tables through ``pyiceberg`` and its SQL catalog.

URLs:

* ``iceberg://DIR`` — the embedded form: the catalog in the SQLite file ``DIR/catalog.db``, the
  warehouse (data and metadata files) in ``DIR/warehouse``;
* ``iceberg+postgresql://USER@HOST[:PORT]/DB?warehouse=URI`` — a shared catalog in PostgreSQL
  (its ``iceberg_tables`` table, through psycopg); the warehouse must be given, and options not
  named below are libpq's (``sslmode``, ``options=-csearch_path=...``).

Options (query parameters of either): ``namespace`` (default ``exactly``), ``table`` (default
``events``), ``warehouse`` (a directory, ``file://DIR`` or ``s3://BUCKET/KEY``), ``catalog``
(the catalog's name, default ``exactly``), and pyiceberg's ``s3.*`` properties
(``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.region``).

The marker: each batch's commit is one new metadata file swapped in by the catalog
(compare-and-set on the table's metadata location), holding the appended snapshot, whose summary
carries ``exactly.query`` and ``exactly.batch``, and the table property ``exactly.batch.<query
id>`` = the batch id, which :meth:`committed` reads, with ``exactly.end`` = the batch's end
offsets, which :meth:`end_offsets` reads (the summary is kept for telling which
snapshot a batch landed in; compactions add snapshots without it). New columns are added in the
same transaction. The table is partitioned by ``date`` (identity).

Files the executors wrote (:meth:`commit_files`) join the table by ``add_files`` in that same
transaction instead of ``append``: schema update, the files' snapshot with the summary, and the
property are one new metadata file.

A sibling (:meth:`~IcebergTable.sibling`, the segment layout's tables) is the table of that
name in the same namespace and catalog (one catalog, one connection pool, for all of them),
unpartitioned. Its ``users`` and ``accounts`` commit with a key as an overwrite whose filter is
the batch's keys (``id IN (...)``): the stored rows of those keys deleted and the merged rows
appended, with the schema update and the marker, in the same transaction.

Guarantee: each batch's rows are in the table exactly once, under a single writer per query; a
concurrent commit (another writer, an optimize) makes ours fail rather than overwrite it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pyarrow as pa  # type: ignore[import-untyped]
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import In
from pyiceberg.table import Table, Transaction

from exactly.errors import LakeConflict, LakeError
from exactly.lake.base import Compaction, DataFile, LakeTable, Landing, Marker, end_offsets_from
from exactly.lake.columns import BASE_SCHEMA, PARTITION
from exactly.lake.files import FileWriter
from exactly.lake.storage import S3, located, old_files, remove
from exactly.urls import redact

# a keyed commit's overwrite of ids none of which is stored yet (new users) is expected
warnings.filterwarnings("ignore", "Delete operation did not match any records", UserWarning)
MARKER = "exactly.batch."  # table property prefix; the query id follows
END = "exactly.end"  # the newest batch's end offsets: summary and table property


class IcebergTable(LakeTable):
    """An Iceberg table in a SQL catalog (module docstring: URLs, marker, guarantee)."""

    def __init__(
        self,
        catalog_uri: str,
        warehouse: str,
        *,
        namespace: str = "exactly",
        table: str = "events",
        catalog: str = "exactly",
        properties: dict[str, str] | None = None,
        url: str = "",
        partition: str | None = PARTITION,
        shared: SqlCatalog | None = None,
    ) -> None:
        self.namespace, self.name = namespace, table
        self.properties = dict(properties or {})
        self.warehouse, self.catalog_uri, self.partition = warehouse, catalog_uri, partition
        self.url = redact(url or f"iceberg:{catalog_uri}")
        self.owns_catalog = shared is None
        self.catalog = shared or SqlCatalog(
            catalog, uri=catalog_uri, warehouse=warehouse, **self.properties
        )

    @classmethod
    def from_url(cls, url: str) -> IcebergTable:
        scheme, _, rest = url.partition("://")
        where, _, query = rest.partition("?")
        options = dict(parse_qsl(query))
        known = {"namespace", "table", "warehouse", "catalog"}
        unknown = [k for k in options if k not in known and not k.startswith("s3.")]
        libpq = {k: options[k] for k in unknown} if scheme == "iceberg+postgresql" else {}
        if unknown and not libpq:
            raise LakeError(
                f"lake URL {redact(url)!r}: unknown options {', '.join(unknown)} (known: "
                f"{', '.join(sorted(known))}, s3.*)"
            )
        properties = {k: v for k, v in options.items() if k.startswith("s3.")}
        names = {"namespace": "exactly", "table": "events", "catalog": "exactly"}
        names.update({k: options[k] for k in names if k in options})
        if scheme == "iceberg":
            if not where:
                raise LakeError(f"lake URL {redact(url)!r} names no directory: iceberg://DIR")
            directory = Path(where)
            directory.mkdir(parents=True, exist_ok=True)
            warehouse = options.get("warehouse") or (directory / "warehouse").resolve().as_uri()
            catalog_uri = f"sqlite:///{(directory / 'catalog.db').resolve()}"
        elif scheme == "iceberg+postgresql":
            if "warehouse" not in options:
                raise LakeError(
                    f"lake URL {redact(url)!r}: a PostgreSQL catalog needs ?warehouse=URI "
                    "(s3://BUCKET/KEY or a directory every writer and reader sees)"
                )
            warehouse = options["warehouse"]
            catalog_uri = f"postgresql+psycopg://{where}"
            if libpq:
                catalog_uri += f"?{urlencode(libpq)}"
        else:
            raise LakeError(f"lake URL {redact(url)!r}: use iceberg://DIR or iceberg+postgresql://")
        if "://" not in warehouse:
            warehouse = Path(warehouse).resolve().as_uri()
        return cls(
            catalog_uri,
            warehouse,
            namespace=names["namespace"],
            table=names["table"],
            catalog=names["catalog"],
            properties=properties,
            url=url,
        )

    @property
    def identifier(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def sibling(self, name: str) -> IcebergTable:
        return IcebergTable(
            self.catalog_uri,
            self.warehouse,
            namespace=self.namespace,
            table=name,
            properties=self.properties,
            url=_with_table(self.url, name),
            partition=None,
            shared=self.catalog,
        )

    def siblings(self) -> list[str]:
        try:
            return sorted(name for _, name in self.catalog.list_tables(self.namespace))
        except NoSuchNamespaceError:
            return []

    def _empty(self) -> pa.Table:
        return (BASE_SCHEMA if self.partition else pa.schema([])).empty_table()

    def _table(self) -> Table | None:
        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _create(self, schema: pa.Schema) -> Table:
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception:  # a sibling created it at the same moment
            if not self.catalog.namespace_exists(self.namespace):
                raise
        table = self.catalog.create_table_if_not_exists(self.identifier, schema=schema)
        if self.partition and table.spec().is_unpartitioned():
            with table.update_spec() as spec:
                spec.add_identity(self.partition)
        return table

    def committed(self, query_id: str) -> int | None:
        table = self._table()
        found = None if table is None else table.properties.get(MARKER + query_id)
        return None if found is None else int(found)

    def end_offsets(self) -> dict[int, int] | None:
        table = self._table()
        return None if table is None else end_offsets_from(table.properties.get(END))

    def landed_in(self, partition: int, offset: int) -> Landing | None:
        """The first snapshot, in commit order, whose summary's end offsets pass the record (the
        snapshots are in the table's metadata: nothing is read from the data files)."""
        table = self._table()
        if table is None:
            return None
        snapshots = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)
        for index, snapshot in enumerate(snapshots):
            summary = snapshot.summary
            text = None if summary is None else summary.additional_properties.get(END)
            end = end_offsets_from(text)
            if end is not None and end.get(partition, 0) > offset:
                # the oldest kept snapshot may be later than the one that landed it
                return Landing(
                    snapshot.snapshot_id, exact=index > 0 or snapshot.parent_snapshot_id is None
                )
        return None

    def schema(self) -> pa.Schema | None:
        table = self._table()
        return None if table is None else table.schema().as_arrow()

    def commit(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        table = self._table() or self._create(rows.schema)
        if key is None:
            return self._commit(
                table,
                rows.schema,
                marker,
                lambda transaction, summary: transaction.append(rows, snapshot_properties=summary),
            )
        keys = In(term=key, literals=tuple(sorted(set(rows.column(key).to_pylist()))))
        return self._commit(  # rows replace those of their key: delete and append, one commit
            table,
            rows.schema,
            marker,
            lambda transaction, summary: transaction.overwrite(
                rows, overwrite_filter=keys, snapshot_properties=summary
            ),
        )

    def file_writer(self, schema: pa.Schema, marker: Marker) -> FileWriter:
        """Files under the table's ``location()/data/`` in ``date=`` directories, the day also
        in the file (``add_files`` reads the partition from its stats), without field ids
        (the table's name mapping resolves columns by name). Creates the table, empty, first:
        its location is where the files go."""
        table = self._table() or self._create(schema)
        return FileWriter(
            table.location().rstrip("/"),
            "data",
            schema,
            marker.batch_id,
            self._s3(),
            partition_in_file=True,
        )

    def commit_files(self, files: Sequence[DataFile], schema: pa.Schema, marker: Marker) -> bool:
        table = self._table() or self._create(schema)
        location = table.location().rstrip("/")
        paths = [f"{location}/{file.path}" for file in files]
        return self._commit(
            table,
            schema,
            marker,
            # each name is new (a uuid), and a replay stops at the marker: no duplicate check
            lambda transaction, summary: transaction.add_files(
                paths, snapshot_properties=summary, check_duplicate_files=False
            ),
        )

    def _commit(
        self,
        table: Table,
        schema: pa.Schema,
        marker: Marker,
        add: Callable[[Transaction, dict[str, str]], None],
    ) -> bool:
        """One transaction: ``schema``'s new columns, ``add``'s snapshot with the marker in its
        summary, and the marker's table properties."""
        summary = {"exactly.query": marker.query_id, "exactly.batch": str(marker.batch_id)}
        if marker.end_text is not None:
            summary[END] = marker.end_text
        try:
            with table.transaction() as transaction:
                known = set(table.schema().column_names)
                new = [field for field in schema if field.name not in known]
                if new:
                    with transaction.update_schema() as update:
                        update.union_by_name(pa.schema(new))
                add(transaction, summary)
                properties = {MARKER + marker.query_id: str(marker.batch_id)}
                if marker.end_text is not None:
                    properties[END] = marker.end_text
                transaction.set_properties(properties)
        except CommitFailedException as error:
            raise LakeConflict(f"lake table {self.url}: commit failed ({error})") from error
        return True

    def read(self) -> pa.Table:
        table = self._table()
        return self._empty() if table is None else table.scan().to_arrow()

    def lookup(self, key: str, values: Sequence[str]) -> pa.Table:
        table = self._table()
        if table is None or not values or key not in table.schema().column_names:
            return self._empty()
        return table.scan(row_filter=In(term=key, literals=tuple(values))).to_arrow()

    def version(self) -> int | None:
        table = self._table()
        snapshot = None if table is None else table.current_snapshot()
        return None if snapshot is None else snapshot.snapshot_id

    def optimize(self) -> Compaction:
        """Each day holding more than one data file rewritten as one, all days in one
        transaction (a concurrent append makes it fail: run it again)."""
        table = self._table()
        if table is None:
            return Compaction(0, 0)
        files = table.inspect.files().select(["partition"]).to_pylist()
        per_day: dict[Any, int] = {}
        for row in files:
            day = row["partition"][PARTITION]
            per_day[day] = per_day.get(day, 0) + 1
        days = [day for day, count in per_day.items() if count > 1 and day is not None]
        if not days:
            return Compaction(0, 0)
        try:
            with table.transaction() as transaction:
                for day in days:
                    where = f"{PARTITION} = '{day.isoformat()}'"
                    content = table.scan(row_filter=where).to_arrow()
                    transaction.overwrite(content, overwrite_filter=where)
        except CommitFailedException as error:
            raise LakeConflict(f"lake table {self.url}: optimize lost to a commit") from error
        return Compaction(sum(per_day[day] for day in days), len(days))

    def vacuum(self, older_than: timedelta) -> list[str]:
        """Data files under the table's ``data/`` that no snapshot refers to."""
        table = self._table()
        if table is None:
            return []
        referenced = set(table.inspect.all_files().column("file_path").to_pylist())
        location = table.location().rstrip("/")
        filesystem, root = located(location, self._s3())
        found = old_files(filesystem, f"{root}/data", older_than)
        gone = [path for path in found if f"{location}/data/{path}" not in referenced]
        remove(filesystem, f"{root}/data", gone)
        return [f"data/{path}" for path in gone]

    def expire(self, retention: timedelta) -> int:
        table = self._table()
        if table is None:
            return 0
        before = len(table.snapshots())
        cutoff = int((datetime.now(UTC) - retention).timestamp() * 1000)
        current = table.current_snapshot()
        old = [
            snapshot.snapshot_id
            for snapshot in table.snapshots()
            if snapshot.timestamp_ms < cutoff
            and (current is None or snapshot.snapshot_id != current.snapshot_id)
        ]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
        table = self._table()
        return before - (0 if table is None else len(table.snapshots()))

    def close(self) -> None:
        engine = getattr(self.catalog, "engine", None)
        if engine is not None and self.owns_catalog:
            engine.dispose()

    def _s3(self) -> S3:
        return S3(
            endpoint=self.properties.get("s3.endpoint"),
            access_key=self.properties.get("s3.access-key-id"),
            secret_key=self.properties.get("s3.secret-access-key"),
            region=self.properties.get("s3.region"),
        )


def _with_table(url: str, name: str) -> str:
    """``url`` naming the table ``name`` (its ``table`` option set)."""
    base, _, query = url.partition("?")
    options = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "table"]
    return f"{base}?{urlencode([*options, ('table', name)], safe=':/')}"
