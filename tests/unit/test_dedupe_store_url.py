"""``exactly dedupe --store``: names get their default place, URLs are taken as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.dedupe import BACKENDS, open_store
from exactly.dedupe.job import STORES, DedupePlan, store_kind, store_url
from exactly.dedupe.spark_state import SparkState
from exactly.errors import ConfigError

DATA, CHECKPOINT = Path("/d"), Path("/c/dedupe")


@pytest.mark.parametrize(
    ("store", "url"),
    [
        ("rocksdb", "rocksdb:///d/dedupe/raw/rocksdb"),
        ("rocksdb:", "rocksdb:///d/dedupe/raw/rocksdb"),
        ("rocksdb:///elsewhere", "rocksdb:///elsewhere"),
        ("spark-state", "spark-state:///c/dedupe"),
        ("spark-state:", "spark-state:///c/dedupe"),
        ("redis://h1:6379,h2:6379/0", "redis://h1:6379,h2:6379/0?namespace=exactly:dedupe:raw"),
        ("redis://h1/0?buckets=64", "redis://h1/0?buckets=64&namespace=exactly:dedupe:raw"),
        ("rediss://:pw@h1/0?namespace=mine", "rediss://:pw@h1/0?namespace=mine"),
    ],
)
def test_a_store_names_its_place(store: str, url: str) -> None:
    assert store_url(store, DATA, "raw", CHECKPOINT) == url
    assert store_kind(url) == store_kind(store)


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("redis", "needs its servers"),
        ("redis:", "needs its servers"),
        ("memcached://h1", "dedupe store 'memcached://h1': use rocksdb"),
        ("redis://:secret@h1/0?x=1", "redis store URL 'redis://:***@h1/0?x=1&namespace="),
    ],
)
def test_a_bad_store_is_one_line(store: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        open_store(store_url(store, DATA, "raw", CHECKPOINT))
    assert message in str(refused.value)
    assert "\n" not in str(refused.value) and "secret" not in str(refused.value)


@pytest.mark.parametrize("store", ["rocksdb", "redis://h1/0", "spark-state", "spark-state:///c"])
def test_spark_state_is_a_mode_of_the_job_not_a_store(store: str) -> None:
    """The store family holds real stores; ``[dedupe] store = "spark-state"`` picks the job's
    other mode, whose plan keeps Spark's state (the window, the scope) and no claim store."""
    assert "spark-state" not in BACKENDS and (*BACKENDS, "spark-state") == STORES
    plan = DedupePlan("sqlite:///l", store, DATA, CHECKPOINT)
    if store_kind(store) == "spark-state":
        assert plan.mode == "spark-state"
        seen = plan.seen_ids()
        assert isinstance(seen, SparkState) and seen.window == plan.window
        assert seen.checkpoint == (CHECKPOINT if store == "spark-state" else Path("/c"))
        with pytest.raises(ConfigError, match="no claim store"):
            plan.open_store()
        with pytest.raises(ConfigError, match="no store to open"):
            open_store(plan.store_url)
    else:
        assert plan.mode == "claim"
