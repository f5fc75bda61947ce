"""The query's model in a process of its own, started first thing (``elmo senses search``):
importing torch (about 1 of a CLI search's CPU seconds, most of its start) and loading the
weights then overlap this process's own start (its imports, the tokenizer, the index, the
word's rows), so that a search waits for the longer of the two instead of their sum.

The child starts importing torch at once; the model's files follow (``load``) when the
index has named them, so the slowest part need not wait for the index to be opened.

The vectors are the in-process embedder's: the same ``elmo_model.load`` and ``embed`` calls
run in the child, with the same torch settings (the environment is inherited), and come
back as arrays. A load that fails raises its own error at the first ``embed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _serve(conn: Any) -> None:
    """The child: import the loader, then load what ``load`` names (or send the load's
    error), say so, then embed what comes."""
    try:
        import elmo_model.api  # torch: the long part, before the files are known

        files = _receive(conn)
        if files is None:
            return
        embedder = elmo_model.api.load(*files, mode="stateless", device="auto")
    except BaseException as error:  # sent back: the parent raises it
        conn.send(("error", error))
        return
    conn.send(("ready", None))
    while (sentences := _receive(conn)) is not None:
        try:
            conn.send(("ok", embedder.embed(sentences)))
        except Exception as error:  # sent back: the parent raises it
            conn.send(("error", error))


def _receive(conn: Any) -> Any:
    try:
        return conn.recv()
    except EOFError:  # the parent has gone
        return None


class ModelProcess:
    """``elmo_model.load(options, weights, mode="stateless")`` in a child process, started
    at construction: given the files then, it loads at once; else it imports torch and
    waits for ``load``. ``embed`` as the embedder's. ``close`` (or leaving a ``with``)
    ends the child, also while it still loads: a user error found meanwhile does not wait
    for the model."""

    def __init__(self, options: str | Path | None = None,
                 weights: str | Path | None = None) -> None:
        import multiprocessing

        # spawn: a fresh interpreter, not a fork of this one's threads and locks.
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._loading = self._ready = False
        if options is not None:
            self.load(options, weights)

    def load(self, options: str | Path, weights: str | Path | None) -> None:
        """The model to load (once): ``elmo_model.load``'s first two arguments."""
        if self._loading:
            raise RuntimeError("the query's model process loads one model")
        self._conn.send((str(options), None if weights is None else str(weights)))
        self._loading = True

    def embed(self, sentences: Sequence[Sequence[str]]) -> list[Any]:
        if not self._loading:
            raise RuntimeError("ModelProcess.load first: no model was named")
        if not self._ready:
            self._answer()
            self._ready = True
        self._conn.send([list(s) for s in sentences])
        return self._answer()

    def _answer(self) -> Any:
        try:
            status, value = self._conn.recv()
        except EOFError:
            self._process.join(5)
            raise RuntimeError(f"the query's model process stopped (exit code "
                               f"{self._process.exitcode})") from None
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        # Ended, not asked to end: it holds nothing to keep, and its own exit (torch's
        # teardown) took 0.5 s that a search waited for before printing its hits.
        self._conn.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()

    def __enter__(self) -> ModelProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
