"""What each destination takes of a micro-batch, and in what shape: the route query's columns.

For destination ``i`` and each event, on the executors:

- ``chosen_i``: its ``sources`` and ``events`` lists and its ``filter`` (:mod:`.filters`) are
  true; an event not chosen is counted as ``filtered``;
- ``take_i``: chosen, and the event's Segment ``integrations`` object lets it have it
  (:mod:`.integrations`, unless ``ignore_integrations``); chosen but not taken is ``skipped``;
- ``shaped_i``: for a destination with a ``transform`` (:mod:`.transforms`), its outcome on
  each event taken: a body, dropped, or failed with a line.

The filtered and skipped counts come from an :class:`~pyspark.sql.Observation` of the same job
that collects the taken events, so an event nobody takes never leaves the executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exactly.delivery.filters import Filters, compile_filters
from exactly.delivery.integrations import taken
from exactly.delivery.jobdb.base import RouteCounts
from exactly.delivery.transforms import Transform, column, resolve, ship

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation, SparkSession

    from exactly.delivery.settings import DestinationSettings


@dataclass(frozen=True)
class Choosing:
    """The destinations' filters and transforms, compiled and shipped once per run."""

    destinations: tuple[DestinationSettings, ...]
    filters: Filters
    transforms: dict[int, Transform] = field(default_factory=dict)

    @classmethod
    def compile(cls, spark: SparkSession, destinations: Sequence[DestinationSettings]) -> Choosing:
        """Check every filter and transform (ConfigError naming the first refused), and ship
        the transforms' modules to the executors."""
        filters = compile_filters(spark, destinations)
        transforms = {
            index: resolve(index, destination)
            for index, destination in enumerate(destinations)
            if destination.transform is not None
        }
        ship(spark, list(transforms.values()))
        return cls(tuple(destinations), filters, transforms)

    def parse(self, records: DataFrame) -> DataFrame:
        """The batch's events as the filters' fields, with ``value``, ``partition``, ``offset``
        (the route and backfill have dropped forgotten people's records: ``forget.readers``)."""
        from pyspark.sql import functions as F

        event = F.from_json(F.col("value").cast("string"), self.filters.schema)
        if "fields" in records.columns:  # read by the source where it could (``source_reading``)
            event = F.coalesce(F.col("fields"), event)
        return records.select(event.alias("e"), "value", "partition", "offset").select(
            *self.filters.columns("e"), "value", "partition", "offset"
        )

    def source_reading(self) -> dict[str, str]:
        """The source's options that read the filters' fields in its Python worker
        (``Filters.source_fields``), keeping every value (the payload); none when it cannot."""
        fields = self.filters.source_fields
        return {} if fields is None else {"fields": fields.option, "keepValues": "true"}

    def chosen(self, index: int) -> Column:
        """Whether destination ``index``'s lists and filter take the event (never null)."""
        from pyspark.sql import functions as F

        destination = self.destinations[index]
        takes = F.lit(True)
        if destination.sources is not None:
            takes = takes & F.col("sourceId").isin(*destination.sources)
        if destination.events is not None:
            takes = takes & F.col("event").isin(*destination.events)
        condition = self.filters.conditions[index]
        if condition is not None:
            takes = takes & F.expr(condition)
        return F.coalesce(takes, F.lit(False))

    def wanted(self, index: int) -> Column:
        """Whether the event's integrations object lets destination ``index`` have it."""
        from pyspark.sql import functions as F

        destination = self.destinations[index]
        if destination.ignore_integrations:
            return F.lit(True)
        return taken(F.col("integrations"), destination.name)

    def observed(self, parsed: DataFrame, observation: Observation) -> DataFrame:
        """``parsed`` with ``chosen_i`` and ``wanted_i`` per destination, each evaluated once
        per event, counting the events filtered and skipped of each."""
        from pyspark.sql import functions as F

        count = len(self.destinations)
        flagged = parsed.select(
            "*",
            *(self.chosen(index).alias(f"chosen_{index}") for index in range(count)),
            *(self.wanted(index).alias(f"wanted_{index}") for index in range(count)),
        )
        tallies: list[Column] = []
        for index in range(count):
            chosen, wanted = F.col(f"chosen_{index}"), F.col(f"wanted_{index}")
            tallies.append(F.sum((~chosen).cast("long")).alias(f"filtered_{index}"))
            tallies.append(F.sum((chosen & ~wanted).cast("long")).alias(f"skipped_{index}"))
        return flagged.observe(observation, *tallies)

    def taken(self, observed: DataFrame) -> DataFrame:
        """The events of :meth:`observed` some destination takes, with ``take_i`` per
        destination and ``shaped_i`` per destination with a transform."""
        from pyspark.sql import functions as F

        takes = [
            (F.col(f"chosen_{index}") & F.col(f"wanted_{index}")).alias(f"take_{index}")
            for index in range(len(self.destinations))
        ]
        anyone = F.lit(False)
        for index in range(len(self.destinations)):
            anyone = anyone | F.col(f"take_{index}")
        flagged = observed.select("*", *takes).where(anyone)
        shaped = [
            column(transform, F.col("value"), F.col(f"take_{index}")).alias(f"shaped_{index}")
            for index, transform in self.transforms.items()
        ]
        return flagged.select("*", *shaped) if shaped else flagged

    def counts(self, observation: Observation) -> dict[str, RouteCounts]:
        """Per destination, what the observation counted (dropped comes from the outcomes)."""
        found = observation.get
        return {
            destination.name: RouteCounts(
                filtered=int(found.get(f"filtered_{index}") or 0),
                skipped=int(found.get(f"skipped_{index}") or 0),
            )
            for index, destination in enumerate(self.destinations)
        }
