"""Controls in the shared SQL: one row per destination in ``jobdb_destinations``.

Operators' commands (``exactly deliveries pause|resume|expire``) write a row while the director
runs; the director reads the rows every second, applies them and reports its breaker there, so
``exactly deliveries`` and the console can show a destination as paused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from exactly.delivery.jobdb.base import CONTROL_FIELDS, Control
from exactly.delivery.jobdb.sql.schema import SQLSchema
from exactly.errors import JobDBError


class Controls(SQLSchema):
    """:meth:`controls` and :meth:`set_control` over ``jobdb_destinations``."""

    _controls_created = False

    def _create_controls(self, cursor: Any) -> None:
        if self._controls_created:
            return
        t = self.types
        self._create_table(
            cursor,
            "jobdb_destinations",
            f"CREATE TABLE IF NOT EXISTS jobdb_destinations (name {t['text']} PRIMARY KEY, "
            f"held {t['id']} NOT NULL, expire_before {t['real']}, expire_asked {t['real']}, "
            f"expired {t['id']}, failing_since {t['real']}, breaker_open {t['id']} NOT NULL, "
            f"updated_at {t['real']} NOT NULL, expired_partitions {t['body']})",
        )
        try:  # a table made before several directors answered an expiry
            self._execute(cursor, "SELECT expired_partitions FROM jobdb_destinations WHERE 1 = 0")
            cursor.fetchall()
            self._connection.commit()
        except Exception:  # noqa: BLE001 (no such column, in each dialect's words)
            self._connection.rollback()
            self._execute(
                cursor, f"ALTER TABLE jobdb_destinations ADD COLUMN expired_partitions {t['body']}"
            )
            self._connection.commit()
        self._controls_created = True

    def controls(self) -> dict[str, Control]:
        """Every destination's :class:`Control` that was ever set, by name."""
        with self._mutex:
            cursor = self._cursor()
            self._create_controls(cursor)
            self._execute(
                cursor, f"SELECT name, {', '.join(CONTROL_FIELDS)} FROM jobdb_destinations"
            )
            rows = cursor.fetchall()
            self._connection.commit()
        return {
            str(name): Control(
                str(name),
                held=bool(held),
                expire_before=_real(before),
                expire_asked=_real(asked),
                expired=None if expired is None else int(expired),
                expired_partitions=tuple(json.loads(answered or "[]")),
                failing_since=_real(since),
                breaker_open=bool(breaker),
            )
            for name, held, before, asked, expired, answered, since, breaker in rows
        }

    def set_control(self, destination: str, **fields: Any) -> None:
        """Set some of ``destination``'s control fields (:data:`CONTROL_FIELDS`), durably."""
        unknown = set(fields) - set(CONTROL_FIELDS)
        if unknown:
            raise JobDBError(
                f"no control named {sorted(unknown)[0]!r}; the controls are "
                f"{', '.join(CONTROL_FIELDS)}"
            )
        values = {
            name: int(value)
            if isinstance(value, bool)
            else json.dumps(sorted(value))
            if isinstance(value, (tuple, list, set))
            else value
            for name, value in fields.items()
        }
        with self._mutex:
            cursor = self._cursor()
            self._create_controls(cursor)
            for _ in range(3):  # two writers may insert the same new row at once
                try:
                    self._upsert_control(cursor, destination, values)
                    self._connection.commit()
                    return
                except Exception:  # noqa: BLE001 (each driver's duplicate key error)
                    self._connection.rollback()
            self._upsert_control(cursor, destination, values)
            self._connection.commit()

    def answer_expiry(
        self, destination: str, asked: float, partitions: Sequence[int], count: int
    ) -> None:
        """A director has expired ``count`` jobs of ``destination`` in ``partitions`` for the
        ask made at ``asked``: add both to the row, in one transaction (several directors answer
        the same ask, each for its partitions); nothing if a newer ask replaced it."""
        with self._mutex:
            cursor = self._cursor()
            self._create_controls(cursor)
            try:
                self._begin(cursor)
                self._execute(
                    cursor,
                    "SELECT expire_asked, expired, expired_partitions FROM jobdb_destinations "
                    f"WHERE name = ?{self._for_update}",
                    (destination,),
                )
                row = cursor.fetchone()
                if row is not None and row[0] is not None and float(row[0]) == asked:
                    answered = set(json.loads(row[2] or "[]")) | set(partitions)
                    self._execute(
                        cursor,
                        "UPDATE jobdb_destinations SET expired = ?, expired_partitions = ?, "
                        "updated_at = ? WHERE name = ?",
                        (
                            int(row[1] or 0) + count,
                            json.dumps(sorted(answered)),
                            time.time(),
                            destination,
                        ),
                    )
                self._connection.commit()
            except BaseException:
                self._connection.rollback()
                raise

    def _upsert_control(self, cursor: Any, destination: str, values: dict[str, Any]) -> None:
        self._begin(cursor)
        now = time.time()
        self._execute(cursor, "SELECT name FROM jobdb_destinations WHERE name = ?", (destination,))
        if cursor.fetchone() is None:
            self._execute(
                cursor,
                "INSERT INTO jobdb_destinations (name, held, breaker_open, updated_at) "
                "VALUES (?, 0, 0, ?)",
                (destination, now),
            )
        if values:
            assignments = ", ".join(f"{name} = ?" for name in values)
            self._execute(
                cursor,
                f"UPDATE jobdb_destinations SET {assignments}, updated_at = ? WHERE name = ?",
                (*values.values(), now, destination),
            )


def _real(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
