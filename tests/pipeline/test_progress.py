"""The embed bar counts stored tokens as workers make them (per model unit), so it moves
before the first item commits: one big item, read through the driver's progress events."""

from __future__ import annotations

import io
from itertools import pairwise
from pathlib import Path
from typing import ClassVar

import pytest
from helpers import config, write_toy_corpus

from pipeline.write import embed, executors
from pipeline.write.embed import TokenProgress, embed_corpus


class RecordedProgress(TokenProgress):
    """The driver's bar, keeping every value it showed and when items committed."""

    made: ClassVar[list[RecordedProgress]] = []

    def __init__(self, bar: object, item_bytes: dict[int, int] | None = None) -> None:
        super().__init__(bar, item_bytes)
        self.events: list[tuple[str, int]] = []
        self.made.append(self)

    def report(self, snapshot: dict[int, int], committed: set[int]) -> None:
        super().report(snapshot, committed)
        self.events.append(("report", self.tokens))

    def commit(self, item: int, tokens: int) -> None:
        super().commit(item, tokens)
        self.events.append(("commit", self.tokens))


def run_one_big_item(tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch,
                     **kw: object) -> tuple[list[tuple[str, int]], int, TokenProgress]:
    monkeypatch.setattr(executors, "PROGRESS_POLL_S", 0.01)
    monkeypatch.setattr(RecordedProgress, "made", [])
    monkeypatch.setattr(embed, "TokenProgress", RecordedProgress)
    sources = write_toy_corpus(tmp_path / "corpus", n_lines=600)
    # One item (the corpus is far below --item-tokens), cut into many 16-token model units.
    summary = embed_corpus(config(model, [sources], tmp_path / "out", min_items=1,
                                  unit_tokens=16, progress=True, **kw))
    assert summary.items_written == 1
    (bar,) = RecordedProgress.made
    return bar.events, summary.tokens, bar


def check_moves_before_commit(events: list[tuple[str, int]], tokens: int) -> None:
    first_commit = next(k for k, (kind, _) in enumerate(events) if kind == "commit")
    before = [n for kind, n in events[:first_commit] if kind == "report"]
    assert any(0 < n < tokens for n in before), events[:first_commit]
    assert before == sorted(before)  # a bar only moves forward
    assert events[-1] == ("commit", tokens)  # ends exactly at the stored tokens


def test_local_bar_moves_before_the_first_commit(tmp_path: Path, tiny_model_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 one_torch_thread: None) -> None:
    events, tokens, bar = run_one_big_item(tmp_path, tiny_model_dir, monkeypatch)
    check_moves_before_commit(events, tokens)
    assert bar.bar.n == bar.bar.total == tokens
    assert bar.running == {}  # nothing of the committed item is kept


@pytest.mark.slow
def test_ray_bar_moves_before_the_first_commit(tmp_path: Path, tiny_model_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    events, tokens, bar = run_one_big_item(tmp_path, tiny_model_dir, monkeypatch,
                                           executor="ray", actors=1, cpus_per_actor=1.0)
    check_moves_before_commit(events, tokens)
    assert bar.running == {}


def test_stale_reports_after_a_commit_are_ignored() -> None:
    from tqdm import tqdm

    with tqdm(total=10, disable=True) as raw:
        progress = TokenProgress(raw)
        progress.report({3: 40, 4: 5}, committed=set())
        progress.commit(3, 50)
        progress.report({3: 45, 4: 7}, committed={3})  # asked before item 3 committed
        assert progress.running == {4: 7}
        assert progress.tokens == 57


def test_total_follows_the_corpus_density_and_ends_without_a_jump() -> None:
    """Ten items of 640 bytes, 100 tokens each (6.4 bytes a token, denser than the
    5-byte first guess): the total is corrected when the first item commits, and the bar
    then reaches it step by step, never jumping at the end (the 2.58M total for 2.02M
    tokens that went from 78% to 100%)."""
    from tqdm import tqdm

    item_bytes = {i: 640 for i in range(10)}
    with tqdm(total=sum(item_bytes.values()) // 5, file=io.StringIO()) as raw:
        progress = TokenProgress(raw, item_bytes)
        progress.report({0: 60}, committed=set())
        assert raw.total == 1280  # the first guess, before anything is measured
        shares = []
        for i in range(10):
            progress.report({i: 50}, committed=set(range(i)))
            shares.append(raw.n / raw.total)
            progress.commit(i, 100)
            assert raw.total == 1000  # 100 committed per 640 bytes, the rest alike
            shares.append(raw.n / raw.total)
        assert raw.n == raw.total == 1000  # at its total, before finish() is asked
        assert shares == sorted(shares)
        # Once measured, every step is the 50 tokens it made: 5%, the last one too.
        measured = shares[1:]
        assert max(b - a for a, b in pairwise(measured)) <= 0.05 + 1e-9
    # An item denser than measured raises the total rather than passing it.
    with tqdm(total=256, file=io.StringIO()) as raw:
        progress = TokenProgress(raw, {0: 640, 1: 640})
        progress.commit(0, 100)
        progress.report({1: 150}, committed={0})
        assert raw.total == raw.n == 250
