"""Held-out perplexity of several models on the same sentences, in a unit they share.

    PYTHONPATH=$PWD .venv/bin/python bench/model_perplexity.py models/default /tmp/v2model \\
        --recipe 'corpus/heldout/*.jsonl' --old-corpus '../shared/corpora/*.txt'

Models with different softmax vocabularies (30k and 50k words, each with ``<UNK>``) have
perplexities over different event spaces, so their plain (closed-vocabulary) numbers
cannot be compared. The shared unit: the words in every model's vocabulary (``<S>`` and
``</S>`` included) keep their own class, and every other target counts as one class,
"a word outside the shared vocabulary", whose probability is the model's mass over all
of its classes outside the shared set (its ``<UNK>`` included). Every model then scores
the same events on the same tokens.

Sentences: the recipe's held-out documents (``--recipe``, JSON Lines, one file a source)
cut by ``elmo-store-sentences``, and the old corpus's held-out lines (``--old-corpus``,
``is_heldout(line, 1.0)``) one line one sentence (``elmo-store-words``), as the bundled
model was trained and evaluated; both tokenizers give the same words. Each sentence is
read on its own from the model's warm initial state (the embedder's ``auto``: warm when
the model ships ``warm_state.safetensors``), with the full softmax; both directions
are scored and averaged as ``heldout_perplexity`` does (bilm-tf's number).
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from elmo_model.model import BiLM, LstmState
from elmo_model.training.lm_head import Softmax
from elmo_model.vocab import Vocabulary

OLD_CORPUS_SET = "old-corpus-heldout"

# The bundled model's plain-text corpus, beside the repository when present.
OLD_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "*.txt"


def shared_log_prob(logits: torch.Tensor, target_ids: torch.Tensor,
                    target_shared: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """Log-probability ``[N]`` of each target in the shared event space.

    ``logits`` ``[N, V]`` are one model's softmax logits; ``target_ids`` ``[N]`` the
    model's class of each target (used where ``target_shared`` is True); ``outside``
    ``[V]`` marks the model's classes outside the shared vocabulary, whose pooled mass is
    the probability of a target that is not shared (``target_shared`` False).
    """
    logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=1)
    own = logits.gather(1, target_ids[:, None]).squeeze(1)
    pooled = torch.logsumexp(logits[:, outside], dim=1)
    return torch.where(target_shared, own, pooled) - log_norm


@dataclass
class LoadedModel:
    name: str
    model: BiLM
    softmax: Softmax
    vocab: Vocabulary
    initial_state: LstmState | None


def load_packaged(model_dir: Path) -> LoadedModel:
    """A packaged model (float weights widened to float32), its full softmax, vocabulary
    and the initial state the embedder's ``auto`` picks."""
    import elmo_model
    from elmo_model.api import resolve_initial_state
    from elmo_model.options_file import find_weights
    from elmo_model.training.packaging import read_softmax

    weights = find_weights(model_dir)
    model = elmo_model.build_model(model_dir / "options.json", weights)
    vocab = Vocabulary.load(model_dir / "vocab.txt")
    softmax = Softmax(len(vocab), model.config.projection_dim)
    softmax.load_state_dict(read_softmax(model_dir))
    start, warm_path = resolve_initial_state(weights)
    state = elmo_model.load_warm_state(warm_path, model.config) if start == "warm" else None
    return LoadedModel(str(model_dir), model, softmax.eval(), vocab, state)


def recipe_sentences(pattern: str) -> dict[str, list[list[str]]]:
    """Sentences (``elmo-store-sentences``) of each held-out source file, by source name."""
    from elmo_model.tokenizers import get_tokenizer
    from elmo_model.training.data import read_texts

    tokenizer = get_tokenizer("elmo-store-sentences")
    by_source: dict[str, list[list[str]]] = {}
    for path in sorted(glob.glob(pattern)):
        sentences = by_source.setdefault(Path(path).name.split(".")[0], [])
        for text in read_texts(path):
            sentences.extend(s.words for s in tokenizer.split_sentences(text) if s.words)
    return by_source


def old_corpus_sentences(pattern: str) -> list[list[str]]:
    """The bundled model's held-out lines, one line one sentence (``elmo-store-words``)."""
    from elmo_model.corpus.split import is_heldout
    from elmo_model.tokenizers import get_tokenizer
    from elmo_model.training.data import read_texts

    tokenizer = get_tokenizer("elmo-store-words")
    words = [[t.text for t in tokenizer.tokenize(line)] for line in read_texts(pattern)
             if is_heldout(line, 1.0)]
    return [w for w in words if w]


def subsample(sentences: list[list[str]], max_tokens: int, seed: int) -> list[list[str]]:
    """Sentences in a fixed random order until ``max_tokens`` words (all when 0)."""
    if max_tokens <= 0:
        return sentences
    order = np.random.default_rng(seed).permutation(len(sentences))
    kept, n = [], 0
    for i in order:
        if n >= max_tokens:
            break
        kept.append(sentences[i])
        n += len(sentences[i])
    return kept


@torch.no_grad()
def score(loaded: LoadedModel, sentences: list[list[str]], shared: set[str],
          max_batch_tokens: int = 4096) -> dict[str, float]:
    """Closed-vocabulary and shared-vocabulary perplexities (mean of both directions)."""
    from elmo_model.training.data import corpus_of, new_type_ids, sentence_ids
    from elmo_model.training.evaluation import contextual_batches
    from elmo_model.training.lm_head import perplexity

    type_ids = new_type_ids()
    lines = [sentence_ids(s, type_ids) for s in sentences]
    corpus = corpus_of(type_ids, [], lines, loaded.vocab, loaded.model.config.max_chars)
    type_shared = torch.tensor([t in shared for t in corpus.types])
    outside = torch.tensor([w not in shared for w in loaded.vocab.words])
    weight, bias = loaded.softmax.weight, loaded.softmax.bias
    p = loaded.model.config.projection_dim
    closed = shared_nll = 0.0
    count = outside_targets = 0
    for batch, top in contextual_batches(loaded.model, corpus, lines, loaded.initial_state,
                                         max_batch_tokens):
        ids = np.concatenate([lines[i] for i in batch])
        lengths = np.array([len(lines[i]) for i in batch])
        ends = np.cumsum(lengths)
        fwd = np.setdiff1d(np.arange(len(ids)), ends - 1)
        bwd = np.setdiff1d(np.arange(len(ids)), ends - lengths)
        for hidden, targets in ((top[fwd, :p], ids[fwd + 1]), (top[bwd, p:], ids[bwd - 1])):
            target_types = torch.from_numpy(targets)
            target_ids = torch.from_numpy(corpus.softmax_ids[targets])
            for start in range(0, len(targets), 1024):
                cut = slice(start, start + 1024)
                logits = F.linear(hidden[cut], weight, bias)
                closed += float(F.cross_entropy(logits, target_ids[cut], reduction="sum"))
                shared_nll -= float(shared_log_prob(logits, target_ids[cut],
                                                    type_shared[target_types[cut]],
                                                    outside).sum())
            outside_targets += int((~type_shared[target_types]).sum())
        count += len(fwd)
    return {"closed_ppl": perplexity(closed / 2, count),
            "shared_ppl": perplexity(shared_nll / 2, count),
            "tokens": count, "outside_shared_rate": outside_targets / (2 * count)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dirs", nargs="+", help="packaged model directories")
    parser.add_argument("--recipe", required=True,
                        help="the recipe's held-out JSON Lines, one file a source")
    parser.add_argument("--old-corpus", default=str(OLD_CORPUS),
                        help="the bundled model's plain-text corpus ('' to skip)")
    parser.add_argument("--max-tokens", type=int, default=15_000,
                        help="words per source, sentences drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-of", action="append", default=[], metavar="MODEL_DIR",
                        help="a model whose vocabulary bounds the shared one without being "
                        "scored (to score one model in the unit shared with another)")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(1)

    sets = recipe_sentences(args.recipe) if args.recipe else {}
    if args.old_corpus:
        sets[OLD_CORPUS_SET] = old_corpus_sentences(args.old_corpus)
    sets = {name: subsample(s, args.max_tokens, args.seed) for name, s in sets.items()}
    models = [load_packaged(Path(d)) for d in args.model_dirs]
    shared = set.intersection(*(set(m.vocab.words) for m in models),
                              *(set(Vocabulary.load(Path(d) / "vocab.txt").words)
                                for d in args.vocab_of))
    shared.discard("<UNK>")
    print(f"shared vocabulary: {len(shared)} classes (+1 for every other word); "
          + ", ".join(f"{m.name}: {len(m.vocab)}" for m in models), flush=True)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for loaded in models:
        start = time.perf_counter()
        results[loaded.name] = {}
        for name, sentences in sets.items():
            results[loaded.name][name] = score(loaded, sentences, shared)
        print(f"{loaded.name}: {time.perf_counter() - start:.0f}s", flush=True)

    header = "| set | tokens | outside shared |" + "".join(
        f" {m.name} shared | {m.name} closed |" for m in models)
    print(header)
    print("|---" * (3 + 2 * len(models)) + "|")
    for name in sets:
        first = results[models[0].name][name]
        row = f"| {name} | {first['tokens']:,} | {first['outside_shared_rate']:.1%} |"
        for m in models:
            r = results[m.name][name]
            row += f" {r['shared_ppl']:.1f} | {r['closed_ppl']:.1f} |"
        print(row)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
