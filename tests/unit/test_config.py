from __future__ import annotations

from pathlib import Path

import pytest

from exactly.cli import hoist_global_options
from exactly.config import load_settings
from exactly.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("EXACTLY_CONFIG", "EXACTLY_DATA_DIR", "EXACTLY_LOG__URL", "EXACTLY_SPARK__MASTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_defaults_live_in_the_data_dir(tmp_path: Path) -> None:
    settings = load_settings()
    assert settings.data_dir == Path(".exactly")
    assert settings.log_url == f"sqlite://{tmp_path / '.exactly' / 'log'}"
    assert settings.spark.master == "local[*]"


def test_precedence_flag_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exactly.toml").write_text(
        'data_dir = "from-file"\n[log]\nurl = "kafka://file:1"\n[spark]\nmaster = "local[1]"\n'
    )
    monkeypatch.setenv("EXACTLY_LOG__URL", "kafka://env:1")
    settings = load_settings()
    assert settings.data_dir == tmp_path.resolve() / "from-file"  # the file's directory
    assert settings.log_url == "kafka://env:1"
    assert settings.spark.master == "local[1]"
    assert load_settings(log_url="kafka://flag:1").log_url == "kafka://flag:1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[log\n", "not valid TOML"),
        ('[log]\nmax_record_bytes = "big"\n', "log.max_record_bytes"),
        ("[lgo]\nurl = 1\n", "lgo"),
        ('[dedupe]\nscope = "tenant"\n', "dedupe.scope"),
        ('[dedupe]\nscop = "workspace"\n', "dedupe.scop"),
        ('[dedupe]\nwindow = "5x"\n', "dedupe.window.*'5x' is not a duration"),
        ('[dedupe]\nmax_bytes = "lots"\n', "dedupe.max_bytes.*'lots' is not a size"),
        ('[collector.sources]\n"web\\n" = "k"\n', "collector.sources"),
        ('[collector.sources]\nweb = "k"\napp = "k"\n', "same write key"),
        ('[collector]\nsources = "web"\n', "NAME=WRITE_KEY"),
        ('[spark]\njit = "fast"\n', "spark.jit"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(path)


def test_dedupe_scope_per_source_unless_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EXACTLY_DEDUPE__SCOPE", raising=False)
    assert load_settings().dedupe.scope == "source"
    (tmp_path / "exactly.toml").write_text('[dedupe]\nscope = "workspace"\n')
    assert load_settings().dedupe.scope == "workspace"
    monkeypatch.setenv("EXACTLY_DEDUPE__SCOPE", "source")
    assert load_settings().dedupe.scope == "source"


def test_dedupe_store_and_bounds_from_the_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_settings().dedupe.store == "rocksdb"
    (tmp_path / "exactly.toml").write_text(
        '[dedupe]\nstore = "redis://r1:6379,r2:6379/0?buckets=64"\nwindow = "7d"\nmax_keys = 5\n'
    )
    dedupe = load_settings().dedupe
    assert (dedupe.store, dedupe.window, dedupe.max_keys) == (
        "redis://r1:6379,r2:6379/0?buckets=64",
        "7d",
        5,
    )
    monkeypatch.setenv("EXACTLY_DEDUPE__STORE", "spark-state")
    monkeypatch.setenv("EXACTLY_DEDUPE__MIN_WINDOW", "12h")
    dedupe = load_settings().dedupe
    assert (dedupe.store, dedupe.min_window, dedupe.window) == ("spark-state", "12h", "7d")
    monkeypatch.setenv("EXACTLY_DEDUPE__REDIS", "redis://r1:6379/0")  # gone: in the store URL
    with pytest.raises(ConfigError, match=r"dedupe\.redis"):
        load_settings()


def test_relative_paths_in_the_file_follow_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path.resolve() / "a"
    home.mkdir()
    (home / "exactly.toml").write_text(
        'data_dir = "data"\n[log]\nurl = "sqlite://log"\n'
        '[aggregate]\nurl = "sqlite://db/aggregates.db"\n[dedupe]\nstore = "rocksdb://ids"\n'
        '[delivery]\njobdb = "sqlite://jobs"\narchive = "old"\n[lake]\nurl = "delta://lake/ev"\n'
    )
    elsewhere = tmp_path / "b"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(Path("../a/exactly.toml"))
    assert settings.data_dir == home / "data"
    assert settings.log_url == f"sqlite://{home / 'log'}"
    assert settings.aggregate_url == f"sqlite://{home / 'db' / 'aggregates.db'}"
    assert settings.dedupe.store == f"rocksdb://{home / 'ids'}"
    assert settings.jobdb_url == f"sqlite://{home / 'jobs'}"
    assert settings.archive_url == str(home / "old")
    assert settings.lake_url == f"delta://{home / 'lake' / 'ev'}"
    # a flag or a variable is the user's own: relative to where the command runs
    assert load_settings(Path("../a/exactly.toml"), data_dir=Path("d")).data_dir == Path("d")
    monkeypatch.setenv("EXACTLY_DELIVERY__ARCHIVE", "env-archive")
    assert load_settings(Path("../a/exactly.toml")).archive_url == "env-archive"


def test_the_default_data_dir_is_beside_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path.resolve() / "a"
    home.mkdir()
    (home / "exactly.toml").write_text(
        '[aggregate]\nurl = "sqlite:///abs/aggregates.db"\n[dedupe]\nstore = "rocksdb"\n'
        '[delivery]\njobdb = "postgresql://user@host/jobs"\narchive = "file://old"\n'
    )
    monkeypatch.chdir(tmp_path)
    settings = load_settings(home / "exactly.toml")
    assert settings.data_dir == home / ".exactly"
    assert settings.log_url == f"sqlite://{home / '.exactly' / 'log'}"
    assert settings.aggregate_url == "sqlite:///abs/aggregates.db"  # absolute: as written
    assert settings.dedupe.store == "rocksdb"  # the default place, under the data dir
    assert settings.lake_url == f"delta://{home / '.exactly' / 'lake' / 'events'}"
    assert settings.jobdb_url == "postgresql://user@host/jobs"  # a server: as written
    assert settings.archive_url == f"file://{home / 'old'}"
    assert load_settings().data_dir == Path(".exactly")  # no file: the working directory


def test_missing_explicit_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.toml")


def test_global_options_hoisted() -> None:
    assert hoist_global_options(["log", "read", "t", "--log", "kafka://x:1", "--limit", "2"]) == [
        "--log",
        "kafka://x:1",
        "log",
        "read",
        "t",
        "--limit",
        "2",
    ]
    assert hoist_global_options(["log", "stat", "--data-dir=/d"]) == [
        "--data-dir=/d",
        "log",
        "stat",
    ]


def test_collector_sources_from_the_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "exactly.toml"
    path.write_text('[collector.sources]\nweb = "k1"\n')
    keys = {n: k.get_secret_value() for n, k in load_settings(path).collector.sources.items()}
    assert keys == {"web": "k1"}
    monkeypatch.setenv("EXACTLY_COLLECTOR__SOURCES", "web=k2,ios=k=3")
    keys = {n: k.get_secret_value() for n, k in load_settings(path).collector.sources.items()}
    assert keys == {"web": "k2", "ios": "k=3"}
    monkeypatch.setenv("EXACTLY_COLLECTOR__SOURCES", "web\n=k")
    with pytest.raises(ConfigError, match="not allowed"):
        load_settings(path)


HOOK = 'name = "orders-hook"\nurl = "https://hooks.example.com/orders"\n'
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_destinations_with_defaults_and_durations(tmp_path: Path) -> None:
    path = tmp_path / "exactly.toml"
    path.write_text(
        f'[[destinations]]\n{HOOK}secret = "{SECRET}"\nevents = ["Order Completed"]\n'
        'max_in_flight = 16\nexpire = "1h30m"\n[destinations.backoff]\nmin = "2s"\nmax = "5m"\n'
        '[destinations.headers]\nAuthorization = "Bearer t"\n'
        '[[destinations]]\nname = "all"\nurl = "http://127.0.0.1:9/x"\ntimeout = 2.5\n'
    )
    settings = load_settings(path)
    orders, every = settings.destinations
    assert (orders.name, orders.max_in_flight, orders.window) == ("orders-hook", 16, 5400.0)
    assert (orders.backoff.minimum, orders.backoff.maximum, orders.backoff.coefficient) == (
        2.0,
        300.0,
        2.0,
    )
    assert orders.headers == {"Authorization": "Bearer t"}
    assert len(orders.signing_keys()) == 1
    assert orders.matches("web", "Order Completed") and not orders.matches("web", "Viewed")
    assert (every.timeout, every.window, every.backoff.minimum, every.rate) == (
        2.5,
        86400.0,
        5,
        None,
    )
    assert every.ordered is False and every.signing_keys() == ()
    assert every.matches(None, None)
    assert settings.jobdb_url.startswith("sqlite://")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'name = "a b"\nurl = "http://x"\n',
            r"destinations\[0\] \(a b\)\.name in .*: .*not allowed",
        ),
        ('name = "h"\nurl = "ftp://x"\n', r"destinations\[0\] \(h\)\.url in .*: .*http"),
        (f'{HOOK}secret = "abc"\n', r"destinations\[0\] \(orders-hook\)\.secret in .*: .*whsec_"),
        (f'{HOOK}secret = "whsec_!!"\n', r"\.secret in .*: .*base64"),
        (f'{HOOK}timeout = "10 parsecs"\n', r"\.timeout in .*: .*not a duration"),
        (f'{HOOK}expire = "-1s"\n', r"\.expire in "),
        (f"{HOOK}max_in_flight = 0\n", r"\.max_in_flight in "),
        (f"{HOOK}rate = 0\n", r"\.rate in "),
        (f'{HOOK}colour = "red"\n', r"\.colour in "),
        (f'{HOOK}[destinations.headers]\nwebhook-id = "x"\n', r"\.headers in .*: .*set by exactly"),
        (
            f'{HOOK}[destinations.backoff]\nmin = "5m"\nmax = "5s"\n',
            r"\.backoff in .*: .*below min",
        ),
        (
            f'{HOOK}[destinations.backoff]\nmin = "soon"\n',
            r"\.backoff\.min in .*: .*not a duration",
        ),
        ('url = "http://x"\n', r"destinations\[0\]\.name in "),
        (f"{HOOK}[[destinations]]\n{HOOK}", r"destinations in .*: .*two destinations"),
    ],
)
def test_bad_destination_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"[[destinations]]\n{text}")
    with pytest.raises(ConfigError, match=message) as caught:
        load_settings(path)
    assert "\n" not in str(caught.value)


def test_a_removed_redis_variable_says_what_replaced_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXACTLY_DEDUPE__REDIS", "redis://127.0.0.1:6379")
    with pytest.raises(ConfigError, match=r"dedupe.redis: not a setting any more.*dedupe.store"):
        load_settings()


def test_lake_columns_are_checked_when_loaded(tmp_path: Path) -> None:
    path = tmp_path / "exactly.toml"
    path.write_text('[lake]\ncolumns = { revenue = "properties.revenue money" }\n')
    with pytest.raises(ConfigError, match=r"lake\.columns.*KIND one of"):
        load_settings(path)
    path.write_text('[lake]\nretention = "forever"\n')
    with pytest.raises(ConfigError, match=r"lake\.retention"):
        load_settings(path)
    path.write_text("[lake]\nmax_columns = 2000\n")  # PostgreSQL stops at 1,600
    with pytest.raises(ConfigError, match=r"lake\.max_columns.*1600"):
        load_settings(path)
    path.write_text('[lake]\nlayout = "wide"\n')
    with pytest.raises(ConfigError, match=r"lake\.layout.*'events' or 'segment'"):
        load_settings(path)
