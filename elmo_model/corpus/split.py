"""The held-out split: fixed by content hash, so a text is always on the same side whatever
the order it was read in, and copies of it never straddle the split."""

from __future__ import annotations

import zlib

# Percent of the texts held out, unless asked otherwise.
DEFAULT_HELDOUT_PERCENT = 1.0


def is_heldout(text: str, percent: float) -> bool:
    """Whether ``text`` is held out when ``percent`` of all texts are (``elmo train``'s
    rule for lines too: the plain-text corpus's held-out lines are the ones the bundled model
    was evaluated on)."""
    return zlib.crc32(text.encode("utf-8")) % 10_000 < percent * 100
