"""Events: the Segment event model, its validation and normalisation, ids and the partitioner.

Everything here is pure and shared: the collector, the importer and the dedupe job agree on what
an event is, what its messageId is and which partition of ``raw`` it lives in.
"""

from __future__ import annotations

from exactly.events.ksuid import KSUID_EPOCH, ksuid, ksuid_time
from exactly.events.normalise import (
    EVENT_TYPES,
    MAX_EVENT_BYTES,
    MAX_MESSAGE_ID_LENGTH,
    Normalised,
    Receipt,
    format_millis,
    format_time,
    message_id_of,
    normalise,
    parse_millis,
    parse_time,
)
from exactly.events.partition import partition_for

__all__ = [
    "EVENT_TYPES",
    "KSUID_EPOCH",
    "MAX_EVENT_BYTES",
    "MAX_MESSAGE_ID_LENGTH",
    "Normalised",
    "Receipt",
    "format_millis",
    "format_time",
    "ksuid",
    "ksuid_time",
    "message_id_of",
    "normalise",
    "parse_millis",
    "parse_time",
    "partition_for",
]
