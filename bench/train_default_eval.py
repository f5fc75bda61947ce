"""Numbers for a packaged model's card: held-out perplexity (zeros vs warm initial state)
and embedding throughput through ``ElmoEmbedder``.

    .venv/bin/python bench/train_default_eval.py models/default '../shared/corpora/*.txt'

Perplexity uses the weights as shipped (e.g. float16, widened to float32) and the same
fixed held-out lines as training, cut by the tokenizer the model declares. Throughput:
``default_model_throughput.tokens_per_second`` (stateless, token cache on and cold at the
start of the timed pass, real tokens only) over held-out text; torch threads as given.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# The suite's one embedding-throughput timing (run as a script, bench/ is on the path).
from default_model_throughput import tokens_per_second


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("corpus")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--skip-perplexity", action="store_true")
    args = parser.parse_args()

    import torch

    import elmo_model
    from elmo_model.tokenizers import get_tokenizer, model_tokenizer
    from elmo_model.training.config import read_split_options
    from elmo_model.training.data import load_corpus
    from elmo_model.training.evaluation import heldout_perplexity
    from elmo_model.training.lm_head import Softmax
    from elmo_model.training.packaging import read_softmax
    from elmo_model.vocab import Vocabulary

    model_dir = Path(args.model_dir)
    results: dict[str, object] = {}
    torch.set_num_threads(1)
    model = elmo_model.build_model(model_dir / "options.json",
                                   model_dir / "weights.safetensors")
    _, params = read_split_options(model_dir / "options.json")
    vocab = Vocabulary.load(model_dir / "vocab.txt")
    tokenizer = get_tokenizer(model_tokenizer(str(model_dir)))
    corpus, _ = load_corpus(args.corpus, params, vocab=vocab, tokenizer=tokenizer)
    if not args.skip_perplexity:
        softmax = Softmax(len(vocab), model.config.projection_dim)
        softmax.load_state_dict(read_softmax(model_dir))
        warm = elmo_model.load_warm_state(model_dir / "warm_state.safetensors", model.config)
        for name, state in (("zeros", None), ("warm", warm)):
            start = time.perf_counter()
            ppl = heldout_perplexity(model, softmax, corpus, initial_state=state)
            results[f"perplexity_{name}"] = {k: round(v, 2) for k, v in ppl.items()}
            print(name, results[f"perplexity_{name}"],
                  f"{time.perf_counter() - start:.1f}s", flush=True)

    sentences: list[list[str]] = []
    n = 0
    for line in corpus.heldout:
        tokens = [corpus.types[i] for i in line[1:-1]]
        sentences.append(tokens)
        n += len(tokens)
        if n >= args.tokens:
            break
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for dtype in ("float32", "bfloat16"):
            embedder = elmo_model.load_model_dir(model_dir, device="cpu", dtype=dtype)
            rate = tokens_per_second(embedder, sentences)
            results[f"tokens_per_s_{dtype}_{threads}thread"] = round(rate)
            print(f"{dtype} threads={threads}: {rate:,.0f} tokens/s ({n} tokens)", flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
