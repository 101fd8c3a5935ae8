"""The CLI's layout helpers: 80 columns, paths relative to the data dir, counts as ``2,000``."""

from __future__ import annotations

from pathlib import Path

from exactly.cli.output import WIDTH, count, fit, message, place, wrap


def test_counts_have_thousands_separators() -> None:
    assert [count(n) for n in (0, 999, 2_000, 1_234_567)] == ["0", "999", "2,000", "1,234,567"]


def test_a_long_value_goes_on_a_line_of_its_own() -> None:
    assert fit("log", "sqlite log") == "log sqlite log"
    long = "/" + "a" * 90
    assert fit("data dir", long) == f"data dir\n  {long}"


def test_wrap_breaks_between_words_only() -> None:
    path = "/srv/" + "analytics-pipeline/" * 3 + "data"
    text = wrap("warning: " + "word " * 20 + path + " end", "  ")
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert any(path in line for line in lines)  # never cut, not even at its hyphens


def test_a_message_is_broken_at_its_clauses_and_loses_nothing() -> None:
    url = "sqlite:///srv/" + "analytics-pipeline/" * 3 + "data/log"
    said = (
        f"error: topic 'raw' does not exist in {url}; "
        "create it with: exactly log create raw --partitions N"
    )
    lines = message(said).splitlines()
    assert lines == [
        "error: topic 'raw' does not exist in",
        f"  {url};",
        "  create it with: exactly log create raw --partitions N",
    ]
    assert " ".join(message(said).split()) == said
    assert message("short; and whole") == "short; and whole"
    path = "/" + "a" * 90
    assert message(f"cannot read {path}: gone") == f"cannot read\n  {path}:\n  gone"  # whole
    words = "  a line of its own indentation " * 4
    assert all(line.startswith("  ") for line in message(words.rstrip()).splitlines())
    assert message("first\nsecond") == "first\nsecond"


def test_embedded_stores_are_shown_relative_to_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert place(f"sqlite://{data / 'log'}", data) == "sqlite log"
    assert place(f"rocksdb://{data / 'dedupe' / 'raw'}", data) == "rocksdb dedupe/raw"
    assert place(f"sqlite://{tmp_path / 'elsewhere.db'}", data) == (
        f"sqlite {tmp_path / 'elsewhere.db'}"
    )
    assert place("postgresql://ana:hunter2@db/shop", data) == "postgresql://ana:***@db/shop"
    assert place("kafka://127.0.0.1:9092", data) == "kafka://127.0.0.1:9092"
