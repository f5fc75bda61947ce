"""Per-item state does not outlive the item: after a run of many items the driver's bar
and the worker's progress hold nothing of any committed item, so what the driver keeps
does not grow with the corpus (peak RSS itself is measured in BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from helpers import config, write_toy_corpus

from pipeline import embed, executors
from pipeline.embed import TokenProgress, embed_corpus


class KeptProgress(TokenProgress):
    made: ClassVar[list[KeptProgress]] = []

    def __init__(self, bar: object) -> None:
        super().__init__(bar)
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
    monkeypatch.setattr(embed, "TokenProgress", KeptProgress)
    monkeypatch.setattr(KeptProgress, "made", [])
    monkeypatch.setattr(executors, "PROGRESS_POLL_S", 0.001)
    sources = write_toy_corpus(tmp_path / "corpus", n_lines=400)
    summary = embed_corpus(config(tiny_model_dir, [sources], tmp_path / "out", n_shards=12,
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
