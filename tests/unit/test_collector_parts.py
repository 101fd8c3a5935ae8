"""The collector's pure parts: body decoding, write keys, settings, the appender's framing."""

from __future__ import annotations

import gzip
import zlib
from base64 import b64encode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.collector.body import HTTPError, decode
from exactly.collector.settings import CollectorSettings, parse_source
from exactly.collector.sources import Sources, Unauthorized, basic_username
from exactly.collector.wire import (
    encode_ack,
    encode_record,
    encode_request,
    parse_acks,
    parse_requests,
)
from exactly.errors import ConfigError
from exactly.log import Record


def test_decode_plain_gzip_deflate_and_concatenated_members() -> None:
    assert decode(b"abc", None, 10) == b"abc"
    assert decode(b"abc", b"identity", 10) == b"abc"
    assert decode(gzip.compress(b"abc", mtime=0), b"gzip", 10) == b"abc"
    assert decode(gzip.compress(b"abc", mtime=0), b" X-GZIP ", 10) == b"abc"
    assert decode(zlib.compress(b"abc"), b"deflate", 10) == b"abc"
    assert (
        decode(gzip.compress(b"ab", mtime=0) + gzip.compress(b"cd", mtime=0), b"gzip", 10)
        == b"abcd"
    )


@pytest.mark.parametrize(
    ("body", "encoding", "status"),
    [
        (gzip.compress(b"x" * 11, mtime=0), b"gzip", 413),
        (gzip.compress(b"x" * 6, mtime=0) + gzip.compress(b"y" * 6, mtime=0), b"gzip", 413),
        (gzip.compress(b"abc", mtime=0)[:-4], b"gzip", 400),
        (b"plain", b"gzip", 400),
        (b"abc", b"br", 415),
        (b"abc", b"\xff", 415),
    ],
)
def test_decode_refuses(body: bytes, encoding: bytes, status: int) -> None:
    with pytest.raises(HTTPError) as error:
        decode(body, encoding, 10)
    assert error.value.status == status


def test_sources_by_write_key() -> None:
    sources = Sources([parse_source("web=k1"), parse_source("app=k2=with=equals")])
    assert sources.source_of(b"k1") == "web"
    assert sources.source_of(b"k2=with=equals") == "app"
    with pytest.raises(Unauthorized):
        sources.source_of(b"k3")
    assert basic_username(b"Basic " + b64encode(b"k1:")) == b"k1"
    assert basic_username(b"basic " + b64encode(b"k1:ignored")) == b"k1"
    for bad in (b"Bearer x", b"Basic", b"Basic !!", b"Basic " + b64encode(b":pw")):
        with pytest.raises(Unauthorized):
            basic_username(bad)


def test_source_parsing_and_settings_round_trip_keep_the_keys() -> None:
    for bad in ("web", "web=", "=key", "we b=key"):
        with pytest.raises(ConfigError):
            parse_source(bad)
    settings = CollectorSettings(log_url="sqlite:///x", sources=(parse_source("web=s3cret"),))
    assert "s3cret" not in repr(settings)
    import os

    saved = dict(os.environ)
    try:
        os.environ.update(settings.to_environment())
        again = CollectorSettings.from_environment()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert again.sources[0].write_key.get_secret_value() == "s3cret"
    assert again.log_url == "sqlite:///x"


@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 4095), st.binary(max_size=40), st.binary(max_size=300)),
            max_size=5,
        ),
        max_size=6,
    ),
    st.integers(0, 50),
)
def test_appender_frames_round_trip_whatever_the_cut(
    requests: list[list[tuple[int, bytes, bytes]]], cut: int
) -> None:
    stream = b"".join(
        encode_request(n, body)
        for n, body in enumerate(b"".join(encode_record(*r) for r in rs) for rs in requests)
    )
    cut = min(cut, len(stream))
    buffer = bytearray(stream[: len(stream) - cut])
    merged: dict[int, list[Record]] = {}
    consumed, last = parse_requests(buffer, merged)
    del buffer[:consumed]
    buffer += stream[len(stream) - cut :]
    consumed, last_rest = parse_requests(buffer, merged)
    assert consumed == len(buffer)
    assert max(last, last_rest) == len(requests) - 1
    expected: dict[int, list[Record]] = {}
    for rs in requests:
        for partition, key, value in rs:
            expected.setdefault(partition, []).append(Record(value, key))
    assert merged == expected


@given(
    st.lists(st.tuples(st.integers(0, 2**63), st.floats(0, 10), st.text(max_size=40)), max_size=5),
    st.integers(0, 50),
)
def test_acks_round_trip_whatever_the_cut(acks: list[tuple[int, float, str]], cut: int) -> None:
    stream = b"".join(encode_ack(last, seconds, error.encode()) for last, seconds, error in acks)
    cut = min(cut, len(stream))
    buffer = bytearray(stream[: len(stream) - cut])
    found = parse_acks(buffer)
    buffer += stream[len(stream) - cut :]
    found += parse_acks(buffer)
    assert not buffer
    assert found == [(last, seconds, error.encode().decode()) for last, seconds, error in acks]
