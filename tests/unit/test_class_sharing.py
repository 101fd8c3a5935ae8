"""The class-sharing archive: named by the JVM and the jars, trained once, never half-written."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from exactly.spark import class_sharing, class_training


def fake_install(root: Path) -> tuple[Path, Path]:
    """A java binary and a Spark home with two jars, as files only."""
    java = root / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"java")
    home = root / "spark"
    (home / "jars").mkdir(parents=True)
    for name in ("spark-core.jar", "spark-sql.jar"):
        (home / "jars" / name).write_bytes(b"jar")
    return java, home


def test_the_archive_is_named_by_the_java_and_the_jars(tmp_path: Path) -> None:
    java, home = fake_install(tmp_path)
    first = class_sharing.archive_path(java, home, tmp_path / "cache")
    assert first == class_sharing.archive_path(java, home, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "exactly" / "class-sharing"

    (home / "jars" / "spark-sql.jar").write_bytes(b"a newer jar")
    after_upgrade = class_sharing.archive_path(java, home, tmp_path / "cache")
    assert after_upgrade != first

    java.write_bytes(b"another java")
    assert class_sharing.archive_path(java, home, tmp_path / "cache") != after_upgrade


def test_jars_installed_again_in_the_same_place_get_a_new_archive(tmp_path: Path) -> None:
    """A virtualenv made again at the same path holds the same jars, newer: the JVM refuses an
    archive made from the old ones ("A jar file is not the one used while building the shared
    archive file"), so their archive must not be found again."""
    import os

    java, home = fake_install(tmp_path)
    first = class_sharing.archive_path(java, home, tmp_path / "c")
    jar = home / "jars" / "spark-sql.jar"
    found = jar.stat()
    os.utime(jar, ns=(found.st_atime_ns, found.st_mtime_ns + 1_000_000_000))
    assert class_sharing.archive_path(java, home, tmp_path / "c") != first


def test_two_spark_homes_linking_the_same_jars_get_two_archives(tmp_path: Path) -> None:
    """The JVM checks the classpath as it was when the archive was made: two shims (two
    virtualenvs) linking to the same jars name different classpaths."""
    java, home = fake_install(tmp_path)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "jars").symlink_to(home / "jars")
    assert class_sharing.archive_path(java, shim, tmp_path / "c") != class_sharing.archive_path(
        java, home, tmp_path / "c"
    )


class Launches:
    """Records the trainers ``start_trainer`` would launch."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], **options: Any) -> None:
        self.commands.append(command)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    recorded = Launches()
    monkeypatch.setattr(class_sharing.subprocess, "Popen", recorded)
    return recorded


def test_a_ready_archive_is_used_and_no_trainer_starts(tmp_path: Path, launches: Launches) -> None:
    archive = tmp_path / "spark-x.jsa"
    archive.write_bytes(b"archive")
    options = class_sharing.java_options(archive)
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert "-Xlog:cds=off" in options  # the JVM's own notes must not reach the command's output
    assert launches.commands == []


def test_a_missing_archive_starts_one_trainer(tmp_path: Path, launches: Launches) -> None:
    archive = tmp_path / "cache" / "spark-x.jsa"
    assert class_sharing.java_options(archive) == ""
    assert len(launches.commands) == 1
    assert launches.commands[0][1:] == ["-m", "exactly.spark.class_training", str(archive)]


def test_no_trainer_while_one_holds_the_lock(tmp_path: Path, launches: Launches) -> None:
    import fcntl

    archive = tmp_path / "spark-x.jsa"
    fd = os.open(archive.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert class_sharing.java_options(archive) == ""
    finally:
        os.close(fd)
    assert launches.commands == []
    class_sharing.java_options(archive)
    assert len(launches.commands) == 1


def test_after_a_failed_training_no_trainer_for_a_while(tmp_path: Path, launches: Launches) -> None:
    archive = tmp_path / "spark-x.jsa"
    failed = archive.with_suffix(".failed")
    failed.touch()
    assert class_sharing.java_options(archive) == ""
    assert launches.commands == []
    long_ago = time.time() - class_sharing.RETRY_SECONDS - 1
    os.utime(failed, (long_ago, long_ago))
    class_sharing.java_options(archive)
    assert len(launches.commands) == 1


def test_training_moves_the_archive_into_place_only_when_the_jvm_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark-x.jsa"
    written: list[Path] = []

    def jvm_that_writes(staged: Path) -> bool:
        assert not archive.exists()  # nobody can map it while it is written
        staged.write_bytes(b"classes")
        written.append(staged)
        return True

    monkeypatch.setattr(class_training, "_run_training", jvm_that_writes)
    assert class_training.train(archive)
    assert archive.read_bytes() == b"classes"
    assert not written[0].exists()
    assert not archive.with_suffix(".failed").exists()


def test_a_failed_training_leaves_no_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark-x.jsa"

    def jvm_that_died(staged: Path) -> bool:
        staged.write_bytes(b"half an archive")
        return False

    monkeypatch.setattr(class_training, "_run_training", jvm_that_died)
    assert not class_training.train(archive)
    assert not archive.exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [
        "spark-x.failed"
    ]


def test_what_doctor_says_of_the_archive(tmp_path: Path) -> None:
    import fcntl

    archive = tmp_path / "class-sharing" / "spark-x.jsa"
    assert class_sharing.state(archive).startswith("not made yet")  # not even its directory
    archive.parent.mkdir()
    fd = os.open(archive.with_suffix(".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert class_sharing.state(archive).startswith("being made in the background")
    finally:
        os.close(fd)
    archive.with_suffix(".failed").touch()
    assert class_sharing.state(archive).startswith("could not be made")
    archive.write_bytes(b"x" * 2_000_000)
    assert class_sharing.state(archive) == f"ready (2 MB in {archive.parent})"
