"""Contextual word senses: nearest occurrences of a word in context, and sense clusters.

    hits = search_senses("data/ds-top.lance", "He plays the guitar in a band", "plays", k=10)
    hits = search_senses(ix, "the Union must be preserved", "Union",
                         filters="year=1850..1870")
    result = cluster_senses("data/ds-top.lance", ["play"], k="auto")

Search tokenizes the query sentence with the dataset's tokenizer (recorded in its
descriptor), embeds it with the dataset's own model (found from the descriptor, or given
with ``model_dir`` and checked against its fingerprint), rounds the layers to the
dataset's storage dtype as stored vectors were, mixes them with the index's mix, and asks
the index for the nearest tokens by cosine. By default only occurrences of the same word
count, in any of its forms (``match="forms"``: the index's Snowball stems, so *plays*
finds *play*, *played*, *playing*); ``match="word"`` keeps only the exact word (any case)
and ``match="any"`` every token. A context that occurs twice (the same sentence text
around the same token, e.g. a corpus repeating a passage) is listed once. ``filters``
keeps only occurrences in documents whose fields pass (``doc_fields``), and every hit
carries its document's fields.

Clustering lives in ``senses.clusters``, hits in ``senses.hits``, breakdowns and exports
in ``senses.tables``: import their names from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_model.errors import ElmoUserError, SettingError
from pipeline.lookup.doc_fields import Filters, as_filters
from pipeline.lookup.index.sense_index import SenseIndex, stem_words
from pipeline.lookup.layers.mixes import mix_arrays
from pipeline.lookup.senses.hits import Hit, hits_from_table, ranked_distinct
from pipeline.tokenize import get_tokenizer, tokenizer_names
from schemas.layers import as_stored

if TYPE_CHECKING:

    from pipeline.tokenize import Tokenizer
    from schemas import DatasetDescriptor
    from schemas.mix_specs import Mix

MATCHES = ("forms", "word", "any")
# A search fetches this many times k first, and more while duplicates leave it short.
FETCH_FACTOR = 2
MAX_FETCH = 10_000


@dataclass
class QueryToken:
    tokens: list[str]
    position: int

    @property
    def word(self) -> str:
        return self.tokens[self.position]


def dataset_tokenizer(descriptor: DatasetDescriptor) -> Tokenizer:
    """The tokenizer the dataset recorded: a query must be split the way the corpus was."""
    name = (descriptor.tokenizer or {}).get("name")
    if not name:
        raise ElmoUserError("the dataset does not record its tokenizer, so a query sentence "
                            "cannot be split like its text; re-embed it with this version")
    if name not in tokenizer_names():
        raise ElmoUserError(f"the dataset was tokenized with {name!r}, which this elmo-store "
                            f"does not know (it knows {', '.join(tokenizer_names())}); use "
                            "the elmo-store version that wrote it")
    return get_tokenizer(name)


def locate_word(sentence: str, word: str, occurrence: int = 1, *,
                tokenizer: Tokenizer) -> QueryToken:
    """Tokenize ``sentence`` with ``tokenizer`` and find ``word``: the same text, else in
    any case, else the same stem (``--word play`` finds *plays*)."""
    if occurrence < 1:
        raise SettingError("occurrence", lambda name: (
            f"{name('occurrence')} must be at least 1, not {occurrence}"))
    tokens = [t.text for s in tokenizer.split_sentences(sentence) for t in s.tokens]
    if not tokens:
        raise ElmoUserError("the query sentence has no tokens")
    stem = stem_words([word])[0]
    stems = stem_words(tokens)
    found: list[int] = []
    for same in (lambda i: tokens[i] == word, lambda i: tokens[i].lower() == word.lower(),
                 lambda i: stems[i] == stem):
        found = [i for i in range(len(tokens)) if same(i)]
        if found:
            break
    if not found:
        raise ElmoUserError(f"word {word!r} is not in the sentence (its tokens: "
                            f"{' '.join(tokens)})")
    if occurrence > len(found):
        raise SettingError("occurrence", lambda name: (
            f"{word!r} occurs {len(found)} time(s) in the sentence; "
            f"{name('occurrence')} {occurrence} is out of range"))
    return QueryToken(tokens, found[occurrence - 1])


def model_files_for(descriptor: DatasetDescriptor,
                    model_dir: str | None = None) -> tuple[Path, Path]:
    """The dataset's model files ``(options, weights)``: from ``model_dir`` if given, else
    the paths the descriptor recorded; either way the fingerprint must match the dataset's."""
    import elmo_model

    if model_dir is not None:
        directory = Path(model_dir)
        options_path = directory / elmo_model.OPTIONS_FILE
        if not options_path.is_file():
            raise SettingError("model_dir", lambda name: (
                f"model not found at {directory} (no {elmo_model.OPTIONS_FILE}); pass "
                f"{name('model_dir')} DIR"))
        weights = elmo_model.find_weights(directory)
    else:
        recorded = descriptor.model.get("options")
        if not recorded:
            raise SettingError("model_dir", lambda name: (
                f"the dataset does not record its model's location; pass {name('model_dir')} "
                "DIR"))
        options_path = Path(recorded)
        # Datasets written before the weights path was recorded: the usual file names.
        weights_recorded = descriptor.model.get("weights")
        if not options_path.is_file() or (weights_recorded
                                          and not Path(weights_recorded).is_file()):
            raise SettingError("model_dir", lambda name: (
                f"the dataset's model is no longer at {options_path.parent}; pass "
                f"{name('model_dir')} DIR"))
        weights = (Path(weights_recorded) if weights_recorded
                   else elmo_model.find_weights(options_path.parent))
    if elmo_model.model_fingerprint(options_path, weights) != descriptor.model_fingerprint:
        raise SettingError("model_dir", lambda name: (
            f"the model at {options_path.parent} is not the one that embedded this dataset "
            f"(fingerprint differs); pass the right {name('model_dir')} DIR"))
    return options_path, weights


def embed_query(index: SenseIndex, query: QueryToken, model_dir: str | None = None,
                embedder: Any = None, descriptor: DatasetDescriptor | None = None
                ) -> np.ndarray:
    """The query token's mixed vector, computed as the stored vectors were."""
    import elmo_model
    if descriptor is None:
        descriptor = index.dataset_descriptor()
    if embedder is None:
        options, weights = model_files_for(descriptor, model_dir)
        embedder = elmo_model.load(options, weights, mode="stateless", device="auto")
    layers = embedder.embed([query.tokens])[0][:, query.position, :]  # [L+1, 2P]
    return query_vector(layers, index.mix, descriptor)


def query_vector(layers: np.ndarray, mix: Mix, descriptor: DatasetDescriptor) -> np.ndarray:
    """The mixed vector of one token's ``[L+1, 2P]`` layers, as the stored ones were made."""
    # Round like the stored rows, so that a sentence from the corpus finds itself at 0.
    rows = [as_stored(layers[k][None, :], descriptor.dtype) for k in range(layers.shape[0])]
    return mix_arrays(rows, mix)[0]


def nearest_distinct(index: SenseIndex, vector: np.ndarray, k: int,
                     words: Sequence[str] | None = None, forms: bool = False,
                     exact: bool = False, where: str | None = None) -> list[Hit]:
    """The ``k`` nearest occurrences with no context twice: asks the index for more
    rows while repeated contexts leave fewer than ``k`` distinct ones. ``where``: a
    further prefilter (``SenseIndex.fields_where``). Hits carry their documents' fields."""
    if k < 1:
        raise SettingError("k", lambda name: f"{name('k')} must be at least 1")
    fetch = min(MAX_FETCH, max(k * FETCH_FACTOR, k + 8))
    while True:
        hits = hits_from_table(index.search(vector, k=fetch, words=words, exact=exact,
                                            forms=forms, where=where), index.documents())
        distinct = ranked_distinct(hits, k)
        if len(distinct) == k or len(hits) < fetch or fetch >= MAX_FETCH:
            return distinct
        fetch = min(MAX_FETCH, fetch * 4)


def check_search(k: int, match: str) -> None:
    """``search_senses``' own settings, checked before anything is opened."""
    if match not in MATCHES:
        raise ElmoUserError(f"match must be one of {', '.join(MATCHES)}, not {match!r}")
    if k < 1:
        raise SettingError("k", lambda name: f"{name('k')} must be at least 1")


def search_senses(index: str | SenseIndex, sentence: str, word: str, k: int = 10,
                  match: str = "forms", occurrence: int = 1, model_dir: str | None = None,
                  embedder: Any = None, exact: bool = False, *,
                  filters: Filters = None) -> list[Hit]:
    """Occurrences nearest in meaning to ``word`` as used in ``sentence``.

    ``match``: ``forms`` (default: the same word in any of its forms), ``word`` (the same
    word, any case) or ``any`` (every token). ``filters``: only occurrences in documents
    whose fields pass, e.g. ``["president=Abraham Lincoln", "year=1861..1865"]``
    (``doc_fields.as_filters``)."""
    check_search(k, match)
    ix = index if isinstance(index, SenseIndex) else SenseIndex(index)
    conditions = as_filters(filters)
    # Before the model loads too: an unknown field is a typo to fix.
    where = ix.fields_where(conditions) if conditions else None
    descriptor = ix.dataset_descriptor()
    query = locate_word(sentence, word, occurrence,
                        tokenizer=dataset_tokenizer(descriptor))
    words = None if match == "any" else [query.word]
    # The word's rows and their IVF now: the CLI's model is still loading meanwhile.
    ix.prepare_search(words, "token_stem" if match == "forms" else "token_lower", where)
    vector = embed_query(ix, query, model_dir, embedder, descriptor)
    return nearest_distinct(ix, vector, k, words=words, forms=match == "forms", exact=exact,
                            where=where)


