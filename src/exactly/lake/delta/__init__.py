"""Delta Lake tables through ``deltalake`` (delta-rs): ``delta://PATH``, ``delta+s3://BUCKET/KEY``.

The marker is Delta's own idempotent-write action: each commit carries a ``txn`` action with
app id = the query id and version = the batch id (``CommitProperties(app_transactions=...)``),
and :meth:`DeltaTable.transaction_version` reads the last one back from the log. The rows, the
new columns (``schema_mode="merge"``) and the ``txn`` are one commit: one JSON file of the log
written with put-if-absent, so a reader sees all of it or none. The batch's end offsets go in
the same commit as more ``txn`` actions (app id ``exactly.end.<partition>``, version = the
offset; ``exactly.end.partitions``, version = how many), so :meth:`end_offsets` reads them from
the snapshot like the marker (the history is slow to read, and log cleanup forgets it); the
``commitInfo`` carries ``exactly.query``, ``exactly.batch`` and ``exactly.end`` for people.
The table is partitioned by ``date``.

A sibling (:meth:`~DeltaLakeTable.sibling`, the segment layout's tables) is the directory of
that name beside it, unpartitioned. Its ``users`` and ``accounts`` commit with a key through
delta-rs's MERGE (``when_matched_update_all``, ``when_not_matched_insert_all``,
``merge_schema`` for new columns), the ``txn`` actions in that commit.

Files the executors wrote (:meth:`commit_files`) are committed as their ``add`` actions with the
same ``txn`` actions through ``create_write_transaction`` (``create_table_with_add_actions`` for
the first batch). delta-rs changes a table's schema there only in an overwrite, so a batch that
adds columns commits as one whose partition filter (``date in ()``) matches no file: it removes
nothing, and its ``metaData``, ``add`` and ``txn`` actions are one log entry.

Guarantee: each batch's rows are in the table exactly once, under a single writer per query
(the query's checkpoint lock); a replayed batch finds its ``txn`` and commits nothing. Files of a
batch killed before its commit are in no version: no reader sees them, :meth:`vacuum` removes
them.

On S3 (``delta+s3://BUCKET/KEY?AWS_ENDPOINT_URL=...``), query options are delta-rs storage
options; unset ones come from the ``AWS_*`` variables. Delta's S3 commits need an atomic
put-if-absent, which S3 (and moto) give.
"""

from __future__ import annotations

from exactly.lake.delta.table import DeltaLakeTable

__all__ = ["DeltaLakeTable"]
