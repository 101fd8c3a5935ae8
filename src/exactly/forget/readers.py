"""What every reader of ``events`` that lands or sends skips: forgotten people's records.

On the embedded log a forget rewrites their records as stubs (:mod:`.stub`); on Kafka, which
rewrites nothing, their records stay until retention removes them. So the lake query, the route
query and backfill drop, on the executors, a stub and any record whose ``userId`` or
``anonymousId`` has a keyed hash a regulation holds (Spark's own ``hmac``, the same HMAC-SHA256
as :func:`~exactly.forget.regulations.digest`). With no regulation the filter is the stub check
alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exactly.forget.regulations import ANONYMOUS, USER, Forgotten, Regulations
from exactly.forget.stub import not_stub

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from exactly.log import Log


class Following:
    """A driver's view of the regulations of the log at ``log_url``, opened on first use and
    read again at most every second."""

    def __init__(self, log_url: str, key: bytes | None) -> None:
        self.log_url = log_url
        self.key = key
        self._log: Log | None = None
        self._regulations: Regulations | None = None

    def forgotten(self) -> Forgotten | None:
        if self.key is None:
            return None
        if self._regulations is None:
            from exactly.log import open_log

            self._log = open_log(self.log_url)
            self._regulations = Regulations(self._log)
        self._regulations.refresh(at_most_every=1.0)
        return self._regulations.forgotten(self.key)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = self._regulations = None


def kept(records: DataFrame, forgotten: Forgotten | None) -> DataFrame:
    """``records`` (a ``value`` column) without stubs and forgotten people's records."""
    return records.where(keeps(records["value"], forgotten))


def keeps(value: Column, forgotten: Forgotten | None) -> Column:
    """Whether a record's ``value`` is neither a stub nor a forgotten person's event."""
    from pyspark.sql import functions as F

    condition = not_stub(value)
    if not forgotten:
        return condition
    assert forgotten is not None
    text = value.cast("string")
    theirs = F.lit(False)
    for kind, field in ((USER, "$.userId"), (ANONYMOUS, "$.anonymousId")):
        hashes = sorted(forgotten.hashes.get(kind, ()))
        if not hashes:
            continue
        message = F.concat(F.lit(f"{kind}:"), F.get_json_object(text, field)).cast("binary")
        digest = F.lower(F.hex(F.hmac(F.lit(bytearray(forgotten.key)), message)))
        theirs = theirs | F.coalesce(digest.isin(hashes), F.lit(False))
    return condition & ~theirs
