"""A batch's marker and end offsets as Delta ``txn`` actions (:mod:`exactly.lake.delta`): what
each commit carries so that the table itself says which batches it holds."""

from __future__ import annotations

from collections.abc import Mapping

from deltalake import CommitProperties, Transaction

from exactly.lake.base import Marker

END = "exactly.end"  # txn app ids: exactly.end.<partition>, version = its end offset
END_PARTITIONS = "exactly.end.partitions"  # txn app id, version = how many partitions


def commit_properties(marker: Marker) -> CommitProperties:
    """The marker and its end offsets as ``txn`` actions, and in ``commitInfo`` for people."""
    return CommitProperties(
        app_transactions=[
            Transaction(marker.query_id, marker.batch_id),
            *end_transactions(marker.end_offsets),
        ],
        custom_metadata={
            "exactly.query": marker.query_id,
            "exactly.batch": marker.batch_id,
            **({END: marker.end_text} if marker.end_text is not None else {}),
        },
        max_commit_retries=5,
    )


def end_transactions(end: Mapping[int, int] | None) -> list[Transaction]:
    """The ``txn`` actions that hold a batch's end offsets (module docstring)."""
    if not end:
        return []
    count = max(end) + 1
    return [Transaction(END_PARTITIONS, count)] + [
        Transaction(f"{END}.{partition}", int(offset)) for partition, offset in end.items()
    ]
