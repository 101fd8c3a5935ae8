"""Secret rotation: ``secret`` may list several ``whsec_`` keys and every request is signed with
each (Standard Webhooks: space-separated signatures), so a receiver verifying with the official
``standardwebhooks`` library accepts it while it knows only the old key or only the new one."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from exactly.config import load_settings
from exactly.delivery.settings import DestinationSettings
from exactly.delivery.signing import request_headers, signature
from exactly.errors import ConfigError


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


OLD, NEW, OTHER = secret(), secret(), secret()


def signed(destination: DestinationSettings, body: bytes) -> dict[str, str]:
    return request_headers(
        message_id="msg-1",
        body=body,
        timestamp=int(time.time()),
        keys=destination.signing_keys(),
        extra={},
    )


def load(tmp_path: Path, secret_line: str) -> DestinationSettings:
    config = tmp_path / "exactly.toml"
    config.write_text(
        f'[[destinations]]\nname = "hook"\nurl = "http://127.0.0.1:9/ok"\n{secret_line}\n'
    )
    return load_settings(config).destinations[0]


def test_a_request_signed_with_old_and_new_verifies_with_either(tmp_path: Path) -> None:
    destination = load(tmp_path, f"secret = {json.dumps([OLD, NEW])}")
    body = b'{"messageId":"msg-1"}'
    headers = signed(destination, body)
    signatures = headers["webhook-signature"].split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    for known in (OLD, NEW):  # the receiver before and after it rolls its key
        Webhook(known).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(body + b" ", headers)


def test_one_secret_as_before_and_none_unsigned(tmp_path: Path) -> None:
    one = load(tmp_path, f"secret = {json.dumps(NEW)}")
    assert len(one.signing_keys()) == 1
    body = b"{}"
    headers = signed(one, body)
    assert " " not in headers["webhook-signature"]
    Webhook(NEW).verify(body, headers)
    unsigned = load(tmp_path, "")
    assert unsigned.signing_keys() == ()
    assert "webhook-signature" not in signed(unsigned, body)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("secret = []", "give 1 to 10 secrets, not 0"),
        ("secret = [1]", "a 'whsec_...' string or a list of them"),
        (f"secret = {json.dumps([OLD] * 11)}", "give 1 to 10 secrets, not 11"),
        (f"secret = {json.dumps([OLD, 'whsec_' + OLD[-20:]])}", "decodes to"),
        (f"secret = {json.dumps([OLD, OLD[6:]])}", "must start with 'whsec_'"),
    ],
    ids=["none", "not-text", "eleven", "short-key", "no-prefix"],  # OLD is random: not in ids
)
def test_a_wrong_list_of_secrets_is_refused_without_showing_them(
    tmp_path: Path, line: str, says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load(tmp_path, line)
    message = str(refused.value)
    assert message.startswith("setting destinations[0] (hook).secret") and says in message
    assert OLD[6:20] not in message and "\n" not in message


def test_secrets_are_never_printed(tmp_path: Path) -> None:
    destination = load(tmp_path, f"secret = {json.dumps([OLD, NEW])}")
    shown = repr(destination) + str(destination) + destination.model_dump_json()
    assert OLD[6:] not in shown and NEW[6:] not in shown


@pytest.mark.parametrize("size", [0, 1, 24, 32, 63, 64, 65, 200])
def test_the_signature_is_hmac_sha256_for_a_key_of_any_length(size: int) -> None:
    """The pads are hashed once per key and copied per request: the same digest as the
    standard library's HMAC, keys longer than SHA-256's block (hashed first) included."""
    key, body = os.urandom(size), os.urandom(300)
    expected = hmac.digest(key, b"msg-1.1700000000." + body, hashlib.sha256)
    assert (
        signature(key, "msg-1", 1_700_000_000, body) == "v1," + base64.b64encode(expected).decode()
    )
    assert signature(key, "msg-1", 1_700_000_000, body) == signature(
        key, "msg-1", 1_700_000_000, body
    )  # the cached pads are copied, never updated
