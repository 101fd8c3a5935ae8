from __future__ import annotations

import pytest

from exactly.errors import ConfigError
from exactly.log import open_log


@pytest.mark.parametrize(
    "url", ["kafka://user:s3cret@broker:9092", "kafka://user@b1:9092,b2:9092?acks=all"]
)
def test_kafka_credentials_in_the_url_say_where_they_go(url: str) -> None:
    with pytest.raises(ConfigError) as error:
        open_log(url)
    message = str(error.value)
    assert "sasl.username" in message and "sasl.password" in message
    assert "s3cret" not in message and "\n" not in message
