"""``exactly deliveries [--json]`` after a real ``exactly deliver``: every column of issue 13's
Visibility per destination (queued, retrying, succeeded, discarded, expired, oldest queued age,
rate, last error)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import EXECUTING, NewJob, Transition
from tests.receiver import Receiver


def run_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "exactly", "--config", str(config), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})


def jobs(name: str, url: str, count: int) -> list[NewJob]:
    return [
        NewJob("web", name, b'{"messageId":"%s-%d"}' % (name.encode(), n), f"{name}-{n}")
        for n in range(count)
    ]


def test_deliveries_shows_every_figure_per_destination(tmp_path: Path) -> None:
    with Receiver() as receiver:
        urls = {
            "hook": f"{receiver.url}/ok",
            "refusing": f"{receiver.url}/status/404",
            "later": f"{receiver.url}/ok",
            "busy": f"{receiver.url}/status/503",
        }
        text = f'data_dir = "{tmp_path / "data"}"\n'
        for name, url in urls.items():
            text += f'[[destinations]]\nname = "{name}"\nurl = "{url}"\n'
            text += "rate = 50\n" if name == "hook" else ""
        config = tmp_path / "exactly.toml"
        config.write_text(text)
        jobdb = f"sqlite://{tmp_path / 'data' / 'jobdb'}"
        with open_jobdb(jobdb) as db:
            db.add(jobs("hook", urls["hook"], 30), query_id="q", batch_id=0)
            db.add(jobs("refusing", urls["refusing"], 2), query_id="q", batch_id=1)
        delivered = run_cli(config, "deliver", "--until-drained")
        assert delivered.returncode == 0, delivered.stderr
    with open_jobdb(jobdb) as db:  # what deliver has not touched yet, and a job mid-retry
        db.add(jobs("later", urls["later"], 4), query_id="q", batch_id=2)
        db.add(jobs("busy", urls["busy"], 3), query_id="q", batch_id=3)
        busy = db.pending("web/busy")
        retry_at = time.time() + 600
        db.record([Transition(job.id, EXECUTING, 1) for job in busy])
        db.record(
            [Transition(busy[0].id, "awaiting-retry", 1, retry_at=retry_at, status_code=503)]
            + [Transition(job.id, "expired", 1, error_type="timeout") for job in busy[1:]]
        )
    time.sleep(1.1)  # the queued jobs are a second old
    result = run_cli(config, "deliveries", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["destination"]: row for row in json.loads(result.stdout)}
    assert rows["hook"]["states"] == {"succeeded": 30} and rows["hook"]["queued"] == 0
    assert rows["hook"]["rate_per_second"] == 0.5  # 30 in the last minute
    assert rows["hook"]["rate_limit"] == 50 and rows["refusing"]["rate_limit"] is None
    assert rows["hook"]["last_error"] is None and rows["hook"]["oldest_pending_seconds"] is None
    assert rows["refusing"]["states"] == {"discarded": 2}
    assert rows["refusing"]["last_error"].startswith("404: status 404")
    assert rows["later"]["queued"] == 4 and rows["later"]["states"] == {"awaiting-scheduling": 4}
    assert rows["later"]["oldest_pending_seconds"] >= 1.0
    assert rows["busy"]["states"] == {"awaiting-retry": 1, "expired": 2}
    assert rows["busy"]["last_error"] == "timeout"  # the latest
    assert rows["busy"]["rate_per_second"] == 0.0
    table = run_cli(config, "deliveries")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "retrying" in line)
    for column in ("destination", "queued", "succeeded", "discarded", "expired", "oldest queued"):
        assert column in header
    flow = next(line for line in lines if "rate" in line)
    assert "destination" in flow and "sending" in flow and "last error" in flow
    states, rates = "\n".join(lines).split("\n\n")  # the two tables: by state, then the flow

    def row(name: str, table: str) -> list[str]:
        line = next(line for line in table.splitlines() if line.startswith(name + " "))
        return re.split(r" {2,}", line.strip())

    assert row("hook", states)[1:] == ["0", "0", "30", "0", "0", "-"]
    assert row("hook", rates)[1:3] == ["0.5/s (max 50)", "yes"]
    assert row("refusing", states)[1:] == ["0", "0", "0", "2", "0", "-"]
    assert row("refusing", rates)[3].startswith("404: status 404")
    assert row("refusing", rates)[2] == "yes"
    assert row("later", states)[1:6] == ["4", "0", "0", "0", "0"]
    assert re.fullmatch(r"\d+s", row("later", states)[6])  # an age
    assert row("busy", states)[1:6] == ["0", "1", "0", "0", "2"]
    assert row("busy", rates)[1] == "0.0/s"
