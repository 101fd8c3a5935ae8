"""Python's cyclic garbage collector paused around work that builds many short-lived objects.

CPython collects its youngest generation every 700 new container objects, and every hundred of
those it runs a full collection, which traverses every live object (a Spark worker's modules
included). A read of 10,000 records, a sink task's rows or a claim of a million ids allocate
tuples by the hundred thousand, all freed by reference counting once used: the collections find
nothing, yet cost as much as the work itself (a read task's records: 3.2 µs each with them, 1.6
without; two full collections were a third of a 2M-id redis claim). The work paused here builds
no reference cycles, so nothing waits for the collector meanwhile; the pause ends with the batch
or the task, and the collector catches up at its next allocation.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """The collector off for the ``with`` block (left as it was if someone paused it already)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
