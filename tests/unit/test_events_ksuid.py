from __future__ import annotations

import string
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.events import KSUID_EPOCH, ksuid, ksuid_time

BASE62 = set(string.digits + string.ascii_uppercase + string.ascii_lowercase)


def test_shape_and_time() -> None:
    value = ksuid()
    assert len(value) == 27 and set(value) <= BASE62
    assert abs((ksuid_time(value) - datetime.now(UTC)).total_seconds()) < 5


def test_known_values() -> None:
    assert ksuid(at=KSUID_EPOCH, payload=bytes(16)) == "0" * 27
    assert ksuid(at=KSUID_EPOCH + 2**32 - 1, payload=b"\xff" * 16) == "aWgEPTl1tmebfsQzFP4bxwgy80V"


@given(
    st.floats(min_value=KSUID_EPOCH, max_value=KSUID_EPOCH + 2**32 - 1),
    st.floats(min_value=KSUID_EPOCH, max_value=KSUID_EPOCH + 2**32 - 1),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=16, max_size=16),
)
def test_ids_sort_by_time_as_text(at: float, other: float, p: bytes, q: bytes) -> None:
    first, second = ksuid(at=at, payload=p), ksuid(at=other, payload=q)
    if int(at) < int(other):
        assert first < second
    assert ksuid_time(first) == datetime.fromtimestamp(int(at), UTC)


def test_payload_makes_it_deterministic_and_times_clamp() -> None:
    assert ksuid(at=1.7e9, payload=b"p" * 16) == ksuid(at=1.7e9, payload=b"p" * 16)
    assert ksuid(at=0, payload=b"p" * 16) == ksuid(at=KSUID_EPOCH, payload=b"p" * 16)
    with pytest.raises(ValueError):
        ksuid(payload=b"short")
    for bad in ("", "x" * 27 + "y", "!" * 27, "z" * 27):
        with pytest.raises(ValueError):
            ksuid_time(bad)
