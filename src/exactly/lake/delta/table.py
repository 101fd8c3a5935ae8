"""A Delta table: the marker as ``txn`` actions, the commits, siblings and upkeep (the URLs and
the guarantee: :mod:`exactly.lake.delta`)."""

from __future__ import annotations

from collections.abc import Sequence, Set
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pyarrow.fs as pafs  # type: ignore[import-untyped]
from deltalake import DeltaTable, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, create_table_with_add_actions

from exactly.errors import LakeConflict, LakeError
from exactly.forget.regulations import Forgotten
from exactly.lake.base import Compaction, DataFile, LakeTable, Landing, Marker, Standing
from exactly.lake.columns import BASE_SCHEMA, PARTITION
from exactly.lake.delta.txn import END, END_PARTITIONS, commit_properties
from exactly.lake.files import FileWriter
from exactly.lake.storage import S3, located, old_files, remove
from exactly.urls import redact

LOG = "_delta_log"


class DeltaLakeTable(LakeTable):
    """A Delta table at a directory or an S3 prefix (module docstring: the guarantee)."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        partition: str | None = PARTITION,
    ) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self.partition = partition
        self.name = uri.rstrip("/").rsplit("/", 1)[-1]
        self.url = redact(f"delta://{uri}" if "://" not in uri else f"delta+{uri}")

    @classmethod
    def from_url(cls, url: str) -> DeltaLakeTable:
        scheme, _, rest = url.partition("://")
        where, _, query = rest.partition("?")
        if not where:
            raise LakeError(f"lake URL {redact(url)!r} names no table: delta://PATH")
        if scheme == "delta+s3":
            return cls(f"s3://{where}", dict(parse_qsl(query)))
        if query:
            raise LakeError(f"lake URL {redact(url)!r}: a local delta table takes no options")
        return cls(where)

    def sibling(self, name: str) -> DeltaLakeTable:
        return DeltaLakeTable(f"{self._root()}/{name}", self.storage_options, partition=None)

    def siblings(self) -> list[str]:
        """The directories beside this table that hold a Delta log."""
        filesystem, root = located(self._root(), self._s3())
        selector = pafs.FileSelector(root, allow_not_found=True)
        found = [i.base_name for i in filesystem.get_file_info(selector) if i.is_file is False]
        logs = filesystem.get_file_info([f"{root}/{name}/{LOG}" for name in found])
        missing = pafs.FileType.NotFound
        return sorted(n for n, log in zip(found, logs, strict=True) if log.type != missing)

    def _root(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[0]

    def _empty(self) -> pa.Table:
        return (BASE_SCHEMA if self.partition else pa.schema([])).empty_table()

    def _table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None

    def committed(self, query_id: str) -> int | None:
        table = self._table()
        return None if table is None else table.transaction_version(query_id)

    def end_offsets(self) -> dict[int, int] | None:
        """From the ``txn`` actions of the newest batch (in the snapshot: no history read)."""
        table = self._table()
        return None if table is None else _end_offsets(table)

    def standing(self) -> Standing:
        table = self._table()
        if table is None:
            return Standing(None, 0, None)
        return Standing(table.version(), _rows(table), _end_offsets(table))

    def schema(self) -> pa.Schema | None:
        table = self._table()
        return None if table is None else pa.schema(table.schema())

    def commit(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        table = None if key is None else self._table()
        try:
            if table is not None:  # rows replace those of their key: MERGE
                table.merge(
                    rows,
                    f's."{key}" = t."{key}"',
                    source_alias="s",
                    target_alias="t",
                    merge_schema=True,
                    commit_properties=commit_properties(marker),
                ).when_matched_update_all().when_not_matched_insert_all().execute()
                return True
            write_deltalake(
                self.uri,
                rows,
                partition_by=[self.partition] if self.partition else None,
                mode="append",
                schema_mode="merge",
                storage_options=self.storage_options or None,
                commit_properties=commit_properties(marker),
            )
        except CommitFailedError as error:
            raise LakeConflict(f"lake table {self.url}: commit failed ({error})") from error
        return True

    def file_writer(self, schema: pa.Schema, marker: Marker) -> FileWriter:
        """Files under the table's root in ``date=`` directories, the day in the path (not in
        the file), with the stats readers skip files by."""
        return FileWriter(self.uri, "", schema, marker.batch_id, self._s3(), delta_stats=True)

    def commit_files(self, files: Sequence[DataFile], schema: pa.Schema, marker: Marker) -> bool:
        adds = [
            AddAction(f.path, f.size, dict(f.partition), f.modified_ms, True, f.stats)
            for f in files
        ]
        properties = commit_properties(marker)
        table = self._table()
        try:
            if table is None:
                create_table_with_add_actions(
                    self.uri,
                    DeltaSchema.from_arrow(schema),
                    adds,
                    partition_by=[PARTITION],
                    storage_options=self.storage_options or None,
                    commit_properties=properties,
                )
            elif set(schema.names) <= set(pa.schema(table.schema()).names):
                table.create_write_transaction(
                    [*adds], "append", schema, [PARTITION], commit_properties=properties
                )
            else:  # new columns: an overwrite that removes nothing (module docstring)
                table.create_write_transaction(
                    [*adds],
                    "overwrite",
                    schema,
                    [PARTITION],
                    [(PARTITION, "in", [])],
                    commit_properties=properties,
                )
        except CommitFailedError as error:
            raise LakeConflict(f"lake table {self.url}: commit failed ({error})") from error
        return True

    def read(self) -> pa.Table:
        table = self._table()
        return self._empty() if table is None else table.to_pyarrow_table()

    def lookup(self, key: str, values: Sequence[str]) -> pa.Table:
        """A scan of deltalake's Arrow dataset filtered on ``key`` (cast: its files hold the
        text as string views, which a plain ``isin`` on the dataset cannot compare)."""
        table = self._table()
        if table is None or not values or key not in pa.schema(table.schema()).names:
            return self._empty()
        wanted = pc.field(key).cast(pa.string()).isin(pa.array(list(values), pa.string()))
        return table.to_pyarrow_dataset().to_table(filter=wanted)

    def landed_in(self, partition: int, offset: int) -> Landing | None:
        """A binary search over the versions' ``txn`` end offsets (each a snapshot load, no data
        read): about log2(versions) loads. Versions whose log was cleaned up cannot load; the
        search then names the oldest that can, "at or before"."""
        table = self._table()
        if table is None or not self._passes(table, partition, offset):
            return None
        low, high, exact = 0, table.version(), True  # high passes
        while low < high:
            middle = (low + high) // 2
            try:
                older = DeltaTable(
                    self.uri, version=middle, storage_options=self.storage_options or None
                )
            except Exception:  # noqa: BLE001 - an expired version: only later ones can say
                low, exact = middle + 1, False
                continue
            if self._passes(older, partition, offset):
                high = middle
            else:
                low = middle + 1
        return Landing(high, exact)

    @staticmethod
    def _passes(table: DeltaTable, partition: int, offset: int) -> bool:
        end = table.transaction_version(f"{END}.{partition}")
        return end is not None and end > offset

    def rows(self) -> int:
        """The ``num_records`` of the version's files (its log: no data file read)."""
        table = self._table()
        return 0 if table is None else _rows(table)

    def present(self, column: str) -> pa.Array:
        """Read only when the files' statistics say some row has a value: a table whose
        ``_rejected`` is null everywhere costs its log alone."""
        table = self._table()
        if table is None or column not in pa.schema(table.schema()).names:
            return pa.array([], pa.string())
        adds = pa.table(table.get_add_actions(flatten=True))
        nulls = f"null_count.{column}"
        if {nulls, "num_records"} <= set(adds.column_names):
            counted, total = adds.column(nulls), adds.column("num_records")
            if not counted.null_count and not total.null_count and counted.equals(total):
                return pa.array([], pa.schema(table.schema()).field(column).type)
        found = table.to_pyarrow_dataset().to_table(
            columns=[column], filter=pc.field(column).is_valid()
        )
        return found.column(column).combine_chunks()

    def dataset(self) -> pa.Table | pa.dataset.Dataset:
        """The current version as deltalake's Arrow dataset: DuckDB reads only the files and
        columns a query needs."""
        table = self._table()
        return self._empty() if table is None else table.to_pyarrow_dataset()

    def version(self) -> int | None:
        table = self._table()
        return None if table is None else table.version()

    def optimize(self) -> Compaction:
        table = self._table()
        if table is None:
            return Compaction(0, 0)
        metrics: dict[str, Any] = table.optimize.compact()
        return Compaction(int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"]))

    def vacuum(self, older_than: timedelta) -> list[str]:
        """Files under the table no version refers to: delta-rs's full vacuum finds them with
        the expired tombstones, its lite vacuum finds those tombstones alone, and only the
        difference is removed (the tombstones go when versions :meth:`expire`)."""
        table = self._table()
        if table is None:
            return []
        hours = int(older_than.total_seconds() // 3600)
        kwargs: dict[str, Any] = {"dry_run": True, "enforce_retention_duration": False}
        unreferenced = set(table.vacuum(hours, full=True, **kwargs))
        tombstones = set(table.vacuum(hours, full=False, **kwargs))
        root_uri = table.table_uri.rstrip("/")
        orphans = sorted(
            _relative(path, root_uri) for path in unreferenced - tombstones if LOG not in path
        )
        # delta-rs counts age in whole hours; the age asked for holds too
        filesystem, root = located(root_uri, self._s3())
        aged = set(old_files(filesystem, root, older_than, skip=(LOG,)))
        gone = [path for path in orphans if path in aged]
        remove(filesystem, root, gone)
        return gone

    def expire(self, retention: timedelta) -> int:
        table = self._table()
        if table is None:
            return 0
        hours = int(retention.total_seconds() // 3600)
        removed = table.vacuum(hours, dry_run=False, enforce_retention_duration=False)
        table.create_checkpoint()
        table.cleanup_metadata()
        return len(removed)

    def forget(self, forgotten: Forgotten, message_ids: Set[str]) -> int:
        """Delete the rows, then remove every trace: delta-rs records a delete's predicate in
        its commit, and earlier commits' stats hold each column's min and max. So a full
        vacuum of every file no version refers to (it commits after the delete), a checkpoint
        at that version, and every log entry and checkpoint before it removed (delta-rs's own
        log cleanup keeps 30 days unless a table property says less, and changing one
        lists the log in a way moto's S3 never answers; docs/forget.md)."""
        table = self._table()
        if table is None:
            return 0
        found = self.forgotten_ids(forgotten, message_ids)
        deleted = 0
        if found:
            predicate = " OR ".join(
                f'"{column}" IN ({", ".join(_literal(value) for value in values)})'
                for column, values in sorted(found.items())
            )
            metrics: dict[str, Any] = table.delete(predicate)
            deleted = int(metrics.get("num_deleted_rows", 0))
        # with no row left to delete, still purge: an earlier forget may have been killed
        # after its delete (a vacuum then finds its files, and commits after it)
        deleted_at = self._version()
        self._reopened().vacuum(0, dry_run=False, enforce_retention_duration=False, full=True)
        table = self._reopened()
        if found and table.version() <= deleted_at:
            raise LakeError(
                f"lake table {self.url}: the vacuum after the forget's delete committed nothing"
            )
        table.create_checkpoint()
        self._remove_log_before(table.version())
        self._remove_empty_directories()
        return deleted

    def _version(self) -> int:
        return self._reopened().version()

    def _reopened(self) -> DeltaTable:
        table = self._table()
        if table is None:
            raise LakeError(f"lake table {self.url} is gone")
        return table

    def _remove_log_before(self, version: int) -> None:
        """Every commit and checkpoint of the log before ``version`` (its checkpoint)."""
        filesystem, root = located(self.uri.rstrip("/"), self._s3())
        selector = pafs.FileSelector(f"{root}/{LOG}", allow_not_found=True)
        old = []
        for info in filesystem.get_file_info(selector):
            name = info.path.rsplit("/", 1)[-1]
            number = name.split(".", 1)[0]
            if info.type == pafs.FileType.File and number.isdigit() and int(number) < version:
                old.append(f"{LOG}/{name}")
        remove(filesystem, root, old)

    def _remove_empty_directories(self) -> None:
        """A partition directory whose files all went (a local table: S3 has no directories)."""
        if "://" in self.uri and not self.uri.startswith("file://"):
            return
        root = Path(self.uri.removeprefix("file://"))
        for directory in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir() and directory.name != LOG and not any(directory.iterdir()):
                directory.rmdir()

    def _s3(self) -> S3:
        options = {key.upper(): value for key, value in self.storage_options.items()}
        return S3(
            endpoint=options.get("AWS_ENDPOINT_URL") or options.get("AWS_ENDPOINT"),
            access_key=options.get("AWS_ACCESS_KEY_ID"),
            secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
            region=options.get("AWS_REGION"),
        )


def _relative(path: str, root_uri: str) -> str:
    """A path delta-rs reported, relative to the table's root."""
    for prefix in (root_uri, root_uri.removeprefix("file://")):
        if path.startswith(prefix):
            return path[len(prefix) :].lstrip("/")
    return path.lstrip("/")


def _end_offsets(table: DeltaTable) -> dict[int, int] | None:
    count = table.transaction_version(END_PARTITIONS)
    if count is None:
        return None
    found = {p: table.transaction_version(f"{END}.{p}") for p in range(count)}
    return {p: offset for p, offset in found.items() if offset is not None}


def _rows(table: DeltaTable) -> int:
    adds = pa.table(table.get_add_actions(flatten=True))
    counts = adds.column("num_records") if "num_records" in adds.column_names else None
    if counts is None or counts.null_count:
        return int(table.to_pyarrow_dataset().count_rows())
    return int(pc.sum(counts).as_py() or 0)


def _literal(value: str) -> str:
    """A SQL string literal of ``value`` (a quote doubled)."""
    return "'" + value.replace("'", "''") + "'"
