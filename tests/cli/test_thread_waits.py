"""Index, senses and serve commands make OpenMP's idle threads sleep (``pipeline.cli``):
the setting only counts if faiss and torch are not loaded before the command is known.
An index build fixes glibc's mmap threshold, as the embedding workers do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.cli import PASSIVE_WAIT_COMMANDS, fixed_mmap_threshold, quiet_thread_waits
from pipeline.write import process_memory


def test_search_commands_wait_passively_unless_the_user_chose() -> None:
    for command in PASSIVE_WAIT_COMMANDS:
        env: dict[str, str] = {}
        quiet_thread_waits(command, env)
        assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    quiet_thread_waits("index", chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}
    embedding: dict[str, str] = {}
    quiet_thread_waits("embed", embedding)  # the model's many small steps keep the default
    assert embedding == {}


def test_the_parser_loads_no_openmp_library() -> None:
    code = ("import sys; import pipeline.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('faiss', 'torch') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env)
    assert out.stdout.strip() == "[]"


def test_only_an_index_build_fixes_the_mmap_threshold(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    calls: list[int] = []
    monkeypatch.setattr(process_memory, "fix_mmap_threshold", lambda: calls.append(1) or True)
    assert fixed_mmap_threshold("index") and calls == [1]
    assert not fixed_mmap_threshold("embed") and calls == [1]
