"""Segment's ``integrations`` object: which destinations an event asks to be sent to.

Every Segment call may carry ``"integrations": {"All": false, "crm": true}``. The rule, as
Segment's SDKs apply it (docs/delivery.md, "Choosing events"): for destination ``d``,

- ``integrations[d]`` is ``false``: not sent;
- ``integrations[d]`` is absent or null and ``integrations.All`` is ``false``: not sent;
- anything else (``true``, an object of options, no object at all): sent.

Keys match destination names exactly (case counts), as in Segment. A destination with
``ignore_integrations = true`` takes every event its other settings choose.

The rule is written twice, once in Python (:func:`takes`, for ``exactly transform`` and the
tests) and once as a Spark column (:func:`taken`, for the route query), and a test holds them
equal. The Spark column reads ``integrations`` as ``map<string,string>``, where JSON ``false``
is the text ``false``: a string ``"false"`` therefore also means false, in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column

ALL = "All"


def _false(value: Any) -> bool:
    return value is False or value == "false"


def takes(integrations: Any, destination: str) -> bool:
    """Whether an event whose ``integrations`` is this lets ``destination`` have it."""
    if not isinstance(integrations, dict):
        return True
    value = integrations.get(destination)
    if value is None:
        return not _false(integrations.get(ALL))
    return not _false(value)


def taken(integrations: Column, destination: str) -> Column:
    """:func:`takes` as a Spark condition over a ``map<string,string>`` column (never null)."""
    from pyspark.sql import functions as F

    value = F.try_element_at(integrations, F.lit(destination))
    every = F.try_element_at(integrations, F.lit(ALL))
    refused = value.eqNullSafe("false") | (value.isNull() & every.eqNullSafe("false"))
    return ~F.coalesce(refused, F.lit(False))
