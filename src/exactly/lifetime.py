"""Processes that do not outlive the process that started them.

A collector worker or a part of ``exactly up`` whose parent is SIGKILLed would otherwise live on,
an orphan holding the port or the checkpoint lock the parent's restart needs. On Linux the kernel
can signal a process when its parent dies (``PR_SET_PDEATHSIG``); elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies.

    ``parent``: the parent's pid when known (say, in a ``preexec_fn``); if the parent is already
    gone (this process was adopted), ``sig`` comes at once.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if (parent is not None and os.getppid() != parent) or os.getppid() == 1:
        os.kill(os.getpid(), sig)
