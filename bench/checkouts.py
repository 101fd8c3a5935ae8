"""A module of another checkout loaded beside this one's, for benches that call both in turn.

    git worktree add /tmp/base COMMIT
    before = checkouts.load_before(Path("/tmp/base/src"), "exactly.events.fields")

Only for modules that import nothing of ``exactly`` that changed between the two: their own
imports resolve to this checkout's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_before(src: Path, module: str) -> ModuleType:
    """``module`` (dotted) of the checkout whose source tree is ``src``, under the name
    ``NAME_before`` (NAME its last part), so that this checkout's stays as it is."""
    path = src.joinpath(*module.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(f"{module.rsplit('.', 1)[-1]}_before", path)
    assert spec is not None and spec.loader is not None, path
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # dataclasses look their module up
    spec.loader.exec_module(loaded)
    return loaded
