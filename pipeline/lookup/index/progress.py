"""Progress of an index build on stderr, tqdm like the rest of the CLI: a bar of token rows
while shard files are read, mixed and added, then one line per later phase that counts
its elapsed time while it runs (LanceDB reports nothing while it builds an index)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TICK_S = 0.5


def rows_bar(total: int, enabled: bool) -> Any:
    """The bar of rows read, mixed and added (``update(n)`` per chunk)."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    # Shown after a moment: a build that stops at once (a user error) prints one line.
    return tqdm(total=total, unit="tok", unit_scale=True, desc="index: read+mix+add",
                disable=not enabled, mininterval=0.5 if tty else 30.0, dynamic_ncols=True,
                file=sys.stderr, delay=1.0)


def steps_bar(total: int, enabled: bool, description: str) -> Any:
    """A bar of a phase's steps (k-means rounds, ...) with its rate and time left."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, unit="step", desc=description, disable=not enabled,
                mininterval=0.5 if tty else 30.0, dynamic_ncols=True, file=sys.stderr,
                delay=1.0)


@contextmanager
def phase(description: str, enabled: bool) -> Iterator[None]:
    """``description`` with a spinner and its elapsed time, redrawn until the block ends;
    where stderr is not a terminal (a log), one line when it starts and one when it ends."""
    from tqdm import tqdm

    if not enabled:
        yield
        return
    if not sys.stderr.isatty():
        print(f"{description} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        yield
        print(f"{description}: done in {time.perf_counter() - started:.1f} s", file=sys.stderr,
              flush=True)
        return
    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed} {postfix}",
               file=sys.stderr, dynamic_ncols=True)
    done = threading.Event()

    def spin() -> None:
        marks = "|/-\\"
        turn = 0
        while not done.wait(TICK_S if sys.stderr.isatty() else 30.0):
            turn += 1
            bar.set_postfix_str(marks[turn % len(marks)], refresh=True)

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    started = time.perf_counter()
    try:
        yield
    finally:
        done.set()
        spinner.join()
        bar.set_postfix_str(f"done in {time.perf_counter() - started:.1f} s", refresh=True)
        bar.close()
