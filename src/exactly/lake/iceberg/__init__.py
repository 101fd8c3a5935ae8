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
appended, with the schema update and the marker, in the same transaction. (pyiceberg's
``upsert`` does the same after comparing each matched row's columns; the rows come merged
already, so replacing those of their ids is the same result with one scan fewer.)

Guarantee: each batch's rows are in the table exactly once, under a single writer per query; a
concurrent commit (another writer, an optimize) makes ours fail rather than overwrite it.
"""

from __future__ import annotations

from exactly.lake.iceberg.table import IcebergTable

__all__ = ["IcebergTable"]
