"""An Iceberg table in a SQL catalog: the marker, the commits, siblings and upkeep (the URLs
and the guarantee: :mod:`exactly.lake.iceberg`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence, Set
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import AlwaysFalse, BooleanExpression, In, NotNull, Or
from pyiceberg.table import Table, Transaction

from exactly.errors import LakeConflict
from exactly.forget.regulations import Forgotten
from exactly.lake.base import (
    Compaction,
    DataFile,
    LakeTable,
    Landing,
    Marker,
    Standing,
    end_offsets_from,
)
from exactly.lake.columns import BASE_SCHEMA, PARTITION
from exactly.lake.files import FileWriter
from exactly.lake.iceberg.urls import where, with_table
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
        found = where(url)
        return cls(
            found.catalog_uri,
            found.warehouse,
            namespace=found.namespace,
            table=found.table,
            catalog=found.catalog,
            properties=found.properties,
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
            url=with_table(self.url, name),
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
        return _committed(self._table(), query_id)

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
        ends = [
            None if s.summary is None else s.summary.additional_properties.get(END)
            for s in snapshots
        ]
        for index, snapshot in enumerate(snapshots):
            end = end_offsets_from(ends[index])
            if end is not None and end.get(partition, 0) > offset:
                # the oldest kept snapshot may be later than the one that landed it
                exact = index > 0 or snapshot.parent_snapshot_id is None
                # a keyed commit (users) is a delete and an append, each with the end offsets:
                # the rows are in the transaction's last snapshot
                while index + 1 < len(snapshots) and ends[index + 1] == ends[index]:
                    index += 1
                return Landing(snapshots[index].snapshot_id, exact=exact)
        return None

    def schema(self) -> pa.Schema | None:
        table = self._table()
        return None if table is None else table.schema().as_arrow()

    def commit_shaped(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        """The marker read from the table loaded for the commit: one catalog read and one
        metadata file fewer per table (a table changed in between fails the commit's swap)."""
        table = self._table()
        # 1. the marker
        last = _committed(table, marker.query_id)
        if last is not None and marker.batch_id <= last:
            return False
        # 3. one transaction: new columns, rows and marker
        return self._commit_rows(table or self._create(rows.schema), rows, marker, key)

    def commit(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        return self._commit_rows(self._table() or self._create(rows.schema), rows, marker, key)

    def _commit_rows(self, table: Table, rows: pa.Table, marker: Marker, key: str | None) -> bool:
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

    def rows(self) -> int:
        """The current snapshot's ``total-records`` (its metadata: no data file read)."""
        table = self._table()
        return 0 if table is None else _rows(table)

    def standing(self) -> Standing:
        table = self._table()
        if table is None:
            return Standing(None, 0, None)
        snapshot = table.current_snapshot()
        version = None if snapshot is None else snapshot.snapshot_id
        return Standing(version, _rows(table), end_offsets_from(table.properties.get(END)))

    def present(self, column: str) -> pa.Array:
        table = self._table()
        if table is None or column not in table.schema().column_names:
            return pa.array([], pa.string())
        scan = table.scan(row_filter=NotNull(term=column), selected_fields=(column,))
        return scan.to_arrow().column(column).combine_chunks()

    def version(self) -> int | None:
        table = self._table()
        snapshot = None if table is None else table.current_snapshot()
        return None if snapshot is None else snapshot.snapshot_id

    def optimize(self) -> Compaction:
        """Each day holding more than one data file rewritten as one, all days in one
        transaction (a concurrent append makes it fail: run it again); a table of Segment's
        layout, which has no partition, rewritten whole once it has more than one file."""
        table = self._table()
        if table is None:
            return Compaction(0, 0)
        if self.partition is None:
            return self._optimize_whole(table)
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

    def _optimize_whole(self, table: Table) -> Compaction:
        count = len(table.inspect.files())
        if count <= 1:
            return Compaction(0, 0)
        try:
            with table.transaction() as transaction:
                transaction.overwrite(table.scan().to_arrow())
        except CommitFailedException as error:
            raise LakeConflict(f"lake table {self.url}: optimize lost to a commit") from error
        return Compaction(count, 1)

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

    def forget(self, forgotten: Forgotten, message_ids: Set[str]) -> int:
        """Delete the rows (copy-on-write), then leave no file that held them: the current
        snapshot's manifests keep deleted files' entries with 16-character bounds of each
        column, so an empty append drops them from it, every older snapshot is expired, and
        each file the current metadata does not refer to is removed (pyiceberg removes none;
        docs/forget.md, "What was measured")."""
        table = self._table()
        if table is None:
            return 0
        found = self.forgotten_ids(forgotten, message_ids)
        removed = 0
        if found:
            before = _rows(table)
            condition: BooleanExpression = AlwaysFalse()
            for column, values in sorted(found.items()):
                condition = Or(condition, In(term=column, literals=tuple(values)))
            table.delete(condition)
            table = self._table()
            assert table is not None
            removed = before - _rows(table)
        # with no row left to delete, still purge: an earlier forget may have been killed
        # after its delete
        for attempt in (1, 2):
            table.append(table.schema().as_arrow().empty_table())
            table = self._table()
            assert table is not None
            if not _holds_deleted(table) or attempt == 2:
                break
            table.overwrite(table.scan().to_arrow())  # a manifest mixes live and deleted: anew
            table = self._table()
            assert table is not None
        cutoff = datetime.now(UTC) + timedelta(seconds=1)
        table.maintenance.expire_snapshots().older_than(cutoff).commit()
        table = self._table()
        assert table is not None
        self._remove_unreferenced(table)
        return removed

    def _remove_unreferenced(self, table: Table) -> None:
        """Every file under the table's location its current metadata does not refer to."""
        location = table.location().rstrip("/")
        keep = {_below(table.metadata_location, location)}
        for snapshot in table.metadata.snapshots:
            keep.add(_below(snapshot.manifest_list, location))
            for manifest in snapshot.manifests(table.io):
                keep.add(_below(manifest.manifest_path, location))
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    keep.add(_below(entry.data_file.file_path, location))
        for statistics in [*table.metadata.statistics, *table.metadata.partition_statistics]:
            keep.add(_below(statistics.statistics_path, location))
        filesystem, root = located(location, self._s3())
        listed = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
        files = [i.path[len(root) :].lstrip("/") for i in listed if i.type == pafs.FileType.File]
        remove(filesystem, root, sorted(path for path in files if path not in keep))

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


def _committed(table: Table | None, query_id: str) -> int | None:
    """The last batch of ``query_id`` in ``table``'s properties."""
    found = None if table is None else table.properties.get(MARKER + query_id)
    return None if found is None else int(found)


def _rows(table: Table) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    total = snapshot.summary.additional_properties.get("total-records")
    return int(total) if total is not None else int(table.scan().to_arrow().num_rows)


def _below(path: str, location: str) -> str:
    """``path`` relative to the table's ``location``, whichever scheme each is written with."""
    for prefix in (
        location,
        location.removeprefix("file://"),
        location.replace("file://", "file:"),
    ):
        if path.startswith(prefix):
            return path[len(prefix) :].lstrip("/")
    return path.rsplit("://", 1)[-1]


def _holds_deleted(table: Table) -> bool:
    """Whether a manifest of the current snapshot still lists a deleted file (with its
    bounds)."""
    from pyiceberg.manifest import ManifestEntryStatus

    snapshot = table.current_snapshot()
    if snapshot is None:
        return False
    return any(
        entry.status == ManifestEntryStatus.DELETED
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
    )
