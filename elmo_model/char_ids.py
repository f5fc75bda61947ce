"""Token strings -> ELMo character ids.

Each token becomes ``max_chars`` (50) ids: begin-of-word, the token's UTF-8 bytes
(truncated to ``max_chars - 2``), end-of-word, then padding. The biLM's sentence
boundaries ``<S>`` and ``</S>`` are tokens made of a special id between the word
markers. Every id is shifted by +1 so that 0 means "no token here" (the mask).

This is the encoding the bilm-tf models were trained with: 256 byte values plus five
specials (ids 256..260 before the shift), 262 rows in the char embedding after it.
"""

from __future__ import annotations

import numpy as np

MAX_CHARS = 50
BEGIN_SENTENCE = 256
END_SENTENCE = 257
BEGIN_WORD = 258
END_WORD = 259
PADDING = 260
N_CHARACTERS = 262  # 261 symbols + the 0 mask row

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


def _special_token(marker: int, max_chars: int) -> np.ndarray:
    ids = np.full(max_chars, PADDING, dtype=np.int64)
    ids[0], ids[1], ids[2] = BEGIN_WORD, marker, END_WORD
    return ids + 1


def token_char_ids(token: str, max_chars: int = MAX_CHARS) -> np.ndarray:
    """Char ids of one token, shape ``[max_chars]``, int64, already shifted by +1.

    ``"<S>"`` and ``"</S>"`` map to the sentence-boundary ids, as in bilm-tf; any other
    string is encoded by its UTF-8 bytes, so every Unicode token has an encoding.
    """
    if token == BOS_TOKEN:
        return _special_token(BEGIN_SENTENCE, max_chars)
    if token == EOS_TOKEN:
        return _special_token(END_SENTENCE, max_chars)
    raw = token.encode("utf-8", errors="surrogatepass")[: max_chars - 2]
    ids = np.full(max_chars, PADDING, dtype=np.int64)
    ids[0] = BEGIN_WORD
    ids[1 : 1 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    ids[1 + len(raw)] = END_WORD
    return ids + 1


def batch_char_ids(sentences: list[list[str]], max_chars: int = MAX_CHARS) -> np.ndarray:
    """Char ids for a batch of tokenized sentences, shape ``[B, T, max_chars]``.

    ``T`` is the longest sentence; positions past a sentence's end are all 0 (masked).
    No sentence-boundary tokens are added: the model adds them itself.
    """
    longest = max((len(s) for s in sentences), default=0)
    out = np.zeros((len(sentences), longest, max_chars), dtype=np.int64)
    for row, sentence in enumerate(sentences):
        for col, token in enumerate(sentence):
            out[row, col] = token_char_ids(token, max_chars)
    return out
