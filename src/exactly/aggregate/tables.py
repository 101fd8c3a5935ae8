"""The aggregate tables a job may fill: created once, then checked at every start.

Beside the aggregate tables every database keeps ``exactly_tables(name, definition, checkpoint,
created_at)``: what each table counts and which job (by its checkpoint) fills it. At start
(:meth:`TableChecks.prepare`) a table with another definition, one another job fills, one exactly
did not create, or one new to a job that already counted batches (it would miss them) is refused
with one line saying what to do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from exactly.aggregate.spec import BATCHES_TABLE, TABLES_TABLE, TableSpec
from exactly.aggregate.sql import SQLDatabase, quote, utc_now
from exactly.errors import ConfigError


class TableChecks(SQLDatabase):
    """Creating and checking the aggregate tables and their registry."""

    def prepare(self, specs: Sequence[TableSpec], checkpoint: str, fresh: bool) -> None:
        """Create what is missing; refuse a changed table or one another job fills.

        ``fresh``: the job's checkpoint has no batch yet. A table new to a job that already
        counted batches would miss them, so it is refused too.
        """

        def work(connection: Any) -> None:
            cursor = connection.cursor()
            self._begin(cursor)
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} (query_id TEXT NOT NULL, "
                "batch_id BIGINT NOT NULL, checkpoint TEXT NOT NULL, topic TEXT NOT NULL, "
                "end_offsets TEXT, events BIGINT NOT NULL, committed_at TEXT NOT NULL, "
                "PRIMARY KEY (query_id, batch_id))"
            )
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLES_TABLE} (name TEXT PRIMARY KEY, "
                "definition TEXT NOT NULL, checkpoint TEXT NOT NULL, created_at TEXT NOT NULL)"
            )
            p = self.placeholder
            cursor.execute(f"SELECT name, definition, checkpoint FROM {TABLES_TABLE}")
            known = {name: (definition, owner) for name, definition, owner in cursor.fetchall()}
            mine = [name for name, (_, owner) in known.items() if owner == checkpoint]
            for spec in specs:
                self._check_table(cursor, spec, known.get(spec.name), checkpoint, fresh, mine)
                if spec.name not in known:
                    cursor.execute(f"CREATE TABLE {quote(spec.name)} ({self._columns_sql(spec)})")
                    cursor.execute(
                        f"INSERT INTO {TABLES_TABLE} VALUES ({p}, {p}, {p}, {p})",
                        (spec.name, spec.definition(), checkpoint, utc_now()),
                    )
            connection.commit()

        self._retrying(work, min(self.retry_seconds, 30.0))

    def _check_table(
        self,
        cursor: Any,
        spec: TableSpec,
        known: tuple[str, str] | None,
        checkpoint: str,
        fresh: bool,
        mine: list[str],
    ) -> None:
        name = spec.name
        if known is None:
            if self._existing_columns(cursor, name) is not None:
                raise ConfigError(
                    f"aggregate table {name!r} exists in {self.describe()} but exactly did not "
                    "create it: name the table differently, or drop it"
                )
            if not fresh and mine:
                raise ConfigError(
                    f"aggregate table {name!r} is new, but this job (checkpoint {checkpoint}) "
                    "has counted events already, which the new table would miss: count it with "
                    "a new --checkpoint into a new database (--db), or drop the job's tables "
                    f"({', '.join(mine)}) and its checkpoint to recount everything"
                )
            return
        definition, owner = known
        if definition != spec.definition():
            raise ConfigError(
                f"aggregate table {name!r} was created with another definition "
                f"({_summary(definition)}; the config now says {_summary(spec.definition())}): "
                f"give the new definition another table name, or drop table {name} and its row "
                f"in {TABLES_TABLE} and recount with a new --checkpoint"
            )
        if owner != checkpoint:
            raise ConfigError(
                f"aggregate table {name!r} is filled by the job with checkpoint {owner}: run "
                "with that --checkpoint, or use another database (--db) for this one"
            )

    def tables(self) -> dict[str, tuple[str, str]]:
        """Registered tables: name -> (definition, checkpoint); empty if none were created."""

        def work(connection: Any) -> dict[str, tuple[str, str]]:
            cursor = connection.cursor()
            if self._existing_columns(cursor, TABLES_TABLE) is None:
                connection.rollback()
                return {}
            cursor.execute(f"SELECT name, definition, checkpoint FROM {TABLES_TABLE}")
            found = {str(n): (str(d), str(c)) for n, d, c in cursor.fetchall()}
            connection.rollback()
            return found

        return self._retrying(work, min(self.retry_seconds, 30.0))


def _summary(definition: str) -> str:
    data = json.loads(definition)
    keys = ", ".join(f"{name} = {expr} ({kind})" for name, kind, expr in data["keys"])
    measures = ", ".join(f"{name} = {f}({arg}) ({kind})" for name, kind, f, arg in data["measures"])
    return f"group by {keys}; {measures}"
