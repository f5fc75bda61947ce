"""Training data: texts cut into sentences of words, the fixed held-out split, and the
per-step windows of the parallel text streams that truncated back-propagation reads.

A text is a non-empty line of a plain-text file, or the ``text`` of a JSON Lines record
(the corpus recipe's documents, ``python -m elmo_model.corpus``). The tokenizer cuts each
text into sentences exactly as ``elmo embed`` will cut documents (one line is one sentence
for ``elmo-store-words``), and a whole text is held out or not, by its content hash, so no
document straddles the split. Every sentence becomes ``<S> w1 .. wn </S>``; each epoch
shuffles the sentences, concatenates them and cuts the result into ``batch_size`` long
streams read in windows of ``unroll_steps`` tokens. The backward LM gets its own shuffle
of the sentences, reversed, as bilm-tf's reversed dataset does, so both directions
always continue the text they were reading.
"""

from __future__ import annotations

import collections
import concurrent.futures
import glob
import itertools
import json
import multiprocessing
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN, token_char_ids
from elmo_model.corpus.split import is_heldout
from elmo_model.errors import ElmoUserError
from elmo_model.model import BiLM
from elmo_model.tokenizers import TRAIN_DEFAULT, Tokenizer, get_tokenizer, tokenizer_names
from elmo_model.training.config import TrainParams
from elmo_model.vocab import Vocabulary


@dataclass
class Corpus:
    """Every line as type ids (``<S>`` ... ``</S>``) over all token strings seen.

    The char CNN reads every type, so rare words keep their spelling as input; only the
    softmax target maps them to ``<UNK>`` (``softmax_ids``).
    """

    types: list[str]
    train: list[np.ndarray]
    heldout: list[np.ndarray]
    char_ids: np.ndarray = field(repr=False)  # [n_types, max_chars] int16
    softmax_ids: np.ndarray = field(repr=False)  # [n_types] int64 vocabulary id per type
    # The file name (a source, in the corpus recipe) of each held-out line; empty when
    # not known (a corpus built by other code).
    heldout_files: list[str] = field(default_factory=list)

    @property
    def n_train_tokens(self) -> int:
        return sum(len(x) for x in self.train)


def read_texts(pattern: str) -> Iterator[str]:
    """The texts of the files ``pattern`` matches, in path order: each non-empty, stripped
    line of a plain-text file, and each record's non-empty ``text`` in a ``.jsonl`` file."""
    for _, text in read_file_texts(pattern):
        yield text


def read_file_texts(pattern: str) -> Iterator[tuple[str, str]]:
    """``read_texts`` with the path of the file each text comes from."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise ElmoUserError(f"no files match {pattern!r}")
    for path in paths:
        records = path.endswith((".jsonl", ".ndjson"))
        try:
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    line = line.strip()
                    if not line:
                        continue
                    if not records:
                        yield path, line
                        continue
                    text = _record_text(line, path, number)
                    if text:
                        yield path, text
        except UnicodeDecodeError as error:
            raise ElmoUserError(f"{path}: not UTF-8 text ({error})") from None


def _record_text(line: str, path: str, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ElmoUserError(f"{path}:{number}: not a JSON record ({error.msg}); JSON Lines "
                            "files hold one object per line with a \"text\" field") from None
    text = record.get("text") if isinstance(record, dict) else None
    if not isinstance(text, str):
        raise ElmoUserError(f"{path}:{number}: the record has no \"text\" string field")
    return text.strip()


def load_corpus(pattern: str, params: TrainParams, max_chars: int = 50,
                vocab: Vocabulary | None = None, tokenizer: Tokenizer | None = None,
                workers: int | None = None, progress: bool = False
                ) -> tuple[Corpus, Vocabulary]:
    """Cut the texts into sentences of words (``tokenizer``, default
    :data:`~elmo_model.tokenizers.TRAIN_DEFAULT`), split off the held-out texts, and build
    (or reuse) the vocabulary.

    Cutting is nine tenths of the loading time (137 s for the default model's 16.7M
    tokens on one core), so ``workers`` processes cut chunks of texts in parallel
    (default: one per CPU, at most 16; 1 cuts here). The chunks come back in order and
    ids are numbered here, so the corpus is the same for any number of workers. With
    ``progress``, a bar on stderr follows the text cut (in bytes of the files)."""
    tokenizer = tokenizer or get_tokenizer(TRAIN_DEFAULT)
    type_ids = new_type_ids()
    train_tokens: list[list[str]] = []
    train, heldout, heldout_files = [], [], []
    paths = glob.glob(pattern) if progress else []
    # no bar before the error a pattern that matches nothing gets from read_file_texts
    bar = _CutProgress(paths) if paths else None
    for path, text, sentence_words in _cut_texts(pattern, tokenizer, workers):
        if bar is not None:
            bar.update(len(text))
        held = is_heldout(text, params.heldout_percent)
        for tokens in sentence_words:
            if not tokens:
                continue
            ids = sentence_ids(tokens, type_ids)
            if held:
                heldout.append(ids)
                heldout_files.append(os.path.basename(path))
            else:
                train.append(ids)
                train_tokens.append(tokens)
    if bar is not None:
        bar.close()
    if not train:
        raise ElmoUserError(f"{pattern}: no training text (all texts empty or held out)")
    if vocab is None:
        vocab = Vocabulary.build(train_tokens, params.n_tokens_vocab)
    corpus = corpus_of(type_ids, train, heldout, vocab, max_chars)
    corpus.heldout_files = heldout_files
    return corpus, vocab


class _CutProgress:
    """A bar over the corpus files' bytes, advanced by each text's length as it is cut
    (JSON keys and escapes are not counted, so it closes at the total)."""

    def __init__(self, paths: list[str]) -> None:
        from tqdm import tqdm

        total = sum(os.path.getsize(path) for path in paths)
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="cutting the corpus",
                        mininterval=1.0, dynamic_ncols=True, file=sys.stderr)

    def update(self, n: int) -> None:
        self.bar.update(min(n, self.bar.total - self.bar.n))

    def close(self) -> None:
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


CUT_CHUNK_CHARS = 1 << 20  # text per task sent to a cutting process
MAX_CUT_WORKERS = 16


def _sentence_words(tokenizer: Tokenizer, text: str) -> list[list[str]]:
    return [sentence.words for sentence in tokenizer.split_sentences(text)]


def _cut_chunk(tokenizer_name: str, texts: list[str]) -> list[list[list[str]]]:
    """In a cutting process: each text's sentences as lists of words."""
    tokenizer = get_tokenizer(tokenizer_name)
    return [_sentence_words(tokenizer, text) for text in texts]


def _text_chunks(pattern: str) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    size = 0
    for path, text in read_file_texts(pattern):
        chunk.append((path, text))
        size += len(text)
        if size >= CUT_CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _cut_texts(pattern: str, tokenizer: Tokenizer, workers: int | None
               ) -> Iterator[tuple[str, str, list[list[str]]]]:
    """``(path, text, sentences' words)`` for every text, in path and line order."""
    if workers is None:
        workers = min(os.cpu_count() or 1, MAX_CUT_WORKERS)
    registered = tokenizer.name in tokenizer_names() and get_tokenizer(tokenizer.name) is tokenizer
    chunks = _text_chunks(pattern)
    head = list(itertools.islice(chunks, 2))
    # Here: one worker, a tokenizer built elsewhere, or text too short to repay starting
    # processes.
    if workers <= 1 or not registered or len(head) < 2:
        for chunk in itertools.chain(head, chunks):
            for path, text in chunk:
                yield path, text, _sentence_words(tokenizer, text)
        return
    # fork, not spawn: spawn re-runs the caller's main script in every child, which a
    # script without an `if __name__ == "__main__"` guard does not survive. The children
    # run only the tokenizer's pure-Python code, never torch's threads or locks.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: collections.deque = collections.deque()
        for chunk in itertools.chain(head, chunks):
            pending.append((chunk, pool.submit(_cut_chunk, tokenizer.name,
                                               [text for _, text in chunk])))
            while len(pending) > 2 * workers:  # bounded read-ahead
                yield from _finished(*pending.popleft())
        while pending:
            yield from _finished(*pending.popleft())


def _finished(chunk: list[tuple[str, str]], future: concurrent.futures.Future
              ) -> Iterator[tuple[str, str, list[list[str]]]]:
    for (path, text), words in zip(chunk, future.result(), strict=True):
        yield path, text, words


def new_type_ids() -> dict[str, int]:
    """Type ids of a new corpus: ``<S>`` 0 and ``</S>`` 1, every other type numbered as
    :func:`sentence_ids` meets it."""
    return {BOS_TOKEN: 0, EOS_TOKEN: 1}


def sentence_ids(tokens: list[str], type_ids: dict[str, int]) -> np.ndarray:
    """``<S> tokens </S>`` as type ids (``type_ids`` numbers the types not seen yet)."""
    ids = [0] + [type_ids.setdefault(t, len(type_ids)) for t in tokens] + [1]
    return np.array(ids, dtype=np.int64)


def corpus_of(type_ids: dict[str, int], train: list[np.ndarray], heldout: list[np.ndarray],
              vocab: Vocabulary, max_chars: int) -> Corpus:
    """The :class:`Corpus` of sentences encoded by :func:`sentence_ids` with ``type_ids``:
    each type's characters and its softmax class under ``vocab``."""
    types = list(type_ids)
    char_ids = np.stack([token_char_ids(t, max_chars) for t in types]).astype(np.int16)
    softmax_ids = np.array(vocab.ids(types), dtype=np.int64)
    return Corpus(types, train, heldout, char_ids, softmax_ids)


class StreamBatches:
    """Epoch-deterministic windows: step -> (forward ids, backward ids), each ``[B, U + 1]``.

    Row ``r`` of step ``s`` continues row ``r`` of step ``s - 1`` (state is carried).
    The backward array holds the backward stream in *reading* order (text reversed).
    """

    def __init__(self, corpus: Corpus, params: TrainParams) -> None:
        self.lines = corpus.train
        self.batch_size = params.batch_size
        self.unroll = params.unroll_steps
        self.seed = params.seed
        total = sum(len(x) for x in self.lines)
        self.stream_length = total // self.batch_size
        self.steps_per_epoch = (self.stream_length - 1) // self.unroll
        if self.steps_per_epoch < 1:
            raise ElmoUserError(f"corpus too small: {total} tokens for batch_size "
                                f"{self.batch_size} x unroll_steps {self.unroll}")
        self._epoch = -1
        self._forward = self._backward = np.empty((0, 0), np.int64)

    def _streams(self, epoch: int, direction: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch, direction])
        ids = np.concatenate([self.lines[i] for i in rng.permutation(len(self.lines))])
        if direction == 1:
            ids = ids[::-1]  # each line reversed and the lines in reverse order
        return ids[: self.batch_size * self.stream_length].reshape(self.batch_size, -1)

    def window(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._forward, self._backward = self._streams(epoch, 0), self._streams(epoch, 1)
            self._epoch = epoch
        start = index * self.unroll
        cut = slice(start, start + self.unroll + 1)
        return self._forward[:, cut], self._backward[:, cut]


def embed_types(model: BiLM, corpus: Corpus, ids: np.ndarray) -> torch.Tensor:
    """Token vectors ``[len(ids), P]`` for type ids, on the model's device, running the
    char CNN once per distinct type."""
    device = next(model.parameters()).device
    unique, inverse = np.unique(ids, return_inverse=True)
    chars = torch.from_numpy(corpus.char_ids[unique].astype(np.int64)).to(device)
    return model.token_embedding(chars)[torch.from_numpy(inverse.reshape(-1)).to(device)]
