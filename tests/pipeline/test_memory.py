"""What keeps a worker's memory flat, checked without timing or RSS (those are measured
in BENCHMARKS.md): per-item state does not outlive its item, and a worker's large
allocations stay on their own mmap, returned whole when freed, instead of fragmenting
the heap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from helpers import REPO, config, write_toy_corpus

from pipeline.write import embed, executors
from pipeline.write.embed import TokenProgress, embed_corpus


class KeptProgress(TokenProgress):
    made: ClassVar[list[KeptProgress]] = []

    def __init__(self, bar: object, item_bytes: dict[int, int] | None = None) -> None:
        super().__init__(bar, item_bytes)
        self.most_running = 0
        self.made.append(self)

    def report(self, snapshot: dict[int, int], committed: set[int]) -> None:
        super().report(snapshot, committed)
        self.most_running = max(self.most_running, len(self.running))


def test_no_per_item_progress_is_kept_after_commit(tmp_path: Path, tiny_model_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   one_torch_thread: None) -> None:
    workers: list[object] = []  # the local executor's worker (close() lets go of it)
    real_make = embed.make_executor

    def keep(cfg: object, settings: object) -> object:
        executor = real_make(cfg, settings)  # type: ignore[arg-type]
        workers.append(executor.worker)  # type: ignore[union-attr]
        return executor

    monkeypatch.setattr(embed, "make_executor", keep)
    fixed: list[bool] = []
    real_fix = executors.fix_mmap_threshold
    monkeypatch.setattr(executors, "fix_mmap_threshold",
                        lambda: fixed.append(real_fix()) or fixed[-1])
    monkeypatch.setattr(embed, "TokenProgress", KeptProgress)
    monkeypatch.setattr(KeptProgress, "made", [])
    monkeypatch.setattr(executors, "PROGRESS_POLL_S", 0.001)
    sources = write_toy_corpus(tmp_path / "corpus", n_lines=400)
    summary = embed_corpus(config(tiny_model_dir, [sources], tmp_path / "out", min_items=12,
                                  unit_tokens=32, progress=True))
    assert summary.items_written >= 10
    (bar,) = KeptProgress.made
    assert bar.running == {}
    assert bar.tokens == summary.tokens
    # Never more items tracked than run at once (two in flight, plus one reported just
    # before its commit).
    assert bar.most_running <= executors.IN_FLIGHT_PER_ACTOR + 1
    (worker,) = workers
    assert worker.progress.snapshot() == {}  # type: ignore[attr-defined]
    assert fixed == [True]  # the worker process fixed its mmap threshold before any item


# Run in a fresh process (a heap with little free room): glibc serves a block from its heap
# when the heap's free top can hold it, whatever the threshold.
MALLOC = """
import ctypes, sys
from pipeline.write import process_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
"""
ONE_BLOCK = MALLOC + """
# What glibc does by itself after freeing blocks of a few MB: raise the threshold.
assert libc.mallopt(process_memory._M_MMAP_THRESHOLD, 256 << 20)
if sys.argv[1] == "fixed":
    assert process_memory.fix_mmap_threshold()
before = libc.mallinfo2().hblks
libc.malloc(64 << 20)
print(libc.mallinfo2().hblks - before)
"""


@pytest.mark.parametrize(("how", "mmapped"), [("raised", "0"), ("fixed", "1")])
def test_large_allocations_stay_on_mmap_once_fixed(how: str, mmapped: str) -> None:
    done = subprocess.run([sys.executable, "-c", ONE_BLOCK, how], capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == mmapped


KEEP_HEAP_TOP = MALLOC + """
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    assert process_memory.fix_mmap_threshold()
else:  # the mmap threshold alone, which freezes the trim threshold at 128 KiB
    assert libc.mallopt(process_memory._M_MMAP_THRESHOLD, process_memory.MMAP_THRESHOLD_BYTES)
block = libc.malloc(900 << 10)  # below the mmap threshold: from the heap, at its top
libc.free(block)
print(int(libc.mallinfo2().keepcost >= 900 << 10))
"""


@pytest.mark.parametrize(("how", "kept"), [("threshold only", "0"), ("fixed", "1")])
def test_freed_heap_top_is_kept_for_the_next_batch(how: str, kept: str) -> None:
    """A batch's sub-MiB temporaries, freed, stay in the heap for the next batch instead
    of going back to the kernel and returning as fresh zeroed pages."""
    done = subprocess.run([sys.executable, "-c", KEEP_HEAP_TOP, how], capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.strip() == kept
