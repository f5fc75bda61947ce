"""A kill at a phase boundary, for the tests that kill a writer at every phase: one of the
writer's steps replaced by a wrapper that ends the process with SIGKILL (no cleanup of any
kind runs) as its n-th call starts ("before") or right after it returns ("after")."""

from __future__ import annotations

import os
import signal
from typing import Any

from helpers import REPO

# The line a child script starts with so that it can import this module.
ON_PATH = f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r})\n"


def kill_at(owner: Any, name: str, when: str, nth: int, match: str = "") -> None:
    """Replace ``owner.name`` so that its ``nth`` call kills the process ``when`` ("before"
    or "after" it runs); ``match``: only calls with an argument naming it count."""
    real, calls = getattr(owner, name), [0]

    def killed(*args: Any, **kwargs: Any) -> Any:
        if match and not any(match in str(a) for a in args):
            return real(*args, **kwargs)
        calls[0] += 1
        if when == "before" and calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if when == "after" and calls[0] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, killed)
