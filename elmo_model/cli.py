"""``elmo`` verbs for the biLM: model info / export, embed-sentences, train.

Nothing heavy is imported at module level (``elmo --help`` stays fast); torch and the
model code are imported inside the handlers. User mistakes raise ``ElmoUserError``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError

_RAW = argparse.RawDescriptionHelpFormatter

TRAIN_HELP = """\
Train a biLM (forward + backward LMs, shared char CNN and softmax) on plain text (one
paragraph or sentence per line) or JSON Lines documents (`.jsonl`, one {"text": ...} per
line, as `python -m elmo_model.corpus build` writes them). Resumes automatically when
--out already holds a checkpoint; a kill loses at most the steps since the last
checkpoint. --tokenizer cuts each text into sentences and words exactly as `elmo embed`
will (default: the --init-from model's own, else moses, as the original ELMo); the
model's options.json declares it. A whole text (line or document) is held out or not.

examples:
  elmo train 'examples/corpus/*.txt' --config examples/tiny_options.json --out runs/tiny-lm \\
      --max-steps 50                                  # a toy model, in seconds
  elmo train 'corpus/*.txt' --config small --out runs/small --max-minutes 60
      # stops within the hour with a checkpoint; the same command again resumes it
  elmo train 'corpus/*.txt' --config standard --out runs/big --device cuda \\
      --set precision=bfloat16 --max-minutes 240
  elmo train 'my_domain/*.txt' --init-from models/default --out runs/domain --max-steps 2000
  elmo train 'data/*.txt' --config my_options.json --out runs/custom --checkpoint-minutes 2
  elmo train 'corpus/*.txt' --config small --out runs/words --tokenizer elmo-store-words
  elmo train 'corpus-out/*/*.jsonl' --init-from models/default --out runs/v2 \\
      --tokenizer elmo-store-sentences --set n_tokens_vocab=50000
      # fine-tune on new documents with a vocabulary rebuilt from them (shared words keep
      # their softmax rows)
"""

INFO_HELP = """\
Show a model's configuration, parameter count and inference FLOPs per token.

examples:
  elmo model info models/default
  elmo model info elmo_options.json elmo_weights.hdf5      # AllenNLP / bilm-tf files
"""

MODEL_HELP = """\
Inspect, export or package a biLM. A model is a directory holding options.json and
weights.safetensors or weights.hdf5 (like models/default).

examples:
  elmo model info models/default
  elmo model export models/default --format allennlp --out runs/default-allennlp
  elmo model package runs/tiny-lm --out runs/tiny-model
"""

EXPORT_HELP = """\
Export a model directory (ours or a training checkpoint) in another layout.
--format allennlp writes options.json + weights.hdf5 as bilm-tf / AllenNLP read them.

examples:
  elmo model export models/default --format allennlp --out exported/default
"""

PACKAGE_HELP = """\
Turn a training checkpoint into a model directory to ship: options.json,
weights.safetensors (biLM only, float16 by default), vocab.txt, softmax.safetensors
(for perplexity and --init-from fine-tuning) and warm_state.safetensors.

examples:
  elmo model package runs/default --out models/default
  elmo model package runs/default --out models/default \\
      --average-with snapshots/step-4200 snapshots/step-4600   # checkpoint averaging
"""

EMBED_HELP = """\
Embed pre-tokenized sentences (one per line, tokens separated by spaces) and print
the layer shapes, or save every layer with --out. For a corpus, use `elmo embed`.

examples:
  elmo embed-sentences models/default examples/sentences.txt
  elmo embed-sentences models/default examples/sentences.txt --out runs/layers.npz
  elmo embed-sentences elmo_options.json elmo_weights.hdf5 s.txt --mode stateful
"""


def register(subparsers: Any) -> None:
    _register_train(subparsers)
    model = subparsers.add_parser("model", help="inspect, export or package a biLM",
                                  description=MODEL_HELP, formatter_class=_RAW)
    verbs = model.add_subparsers(dest="model_command", metavar="VERB")
    info = verbs.add_parser("info", help="config, parameters, FLOPs per token",
                            description=INFO_HELP, formatter_class=_RAW)
    _model_arguments(info)
    info.set_defaults(handler=_model_info)
    export = verbs.add_parser("export", help="write options.json + weights.hdf5 (bilm-tf)",
                              description=EXPORT_HELP, formatter_class=_RAW)
    export.add_argument("model_dir", metavar="MODEL_DIR",
                        help="model directory (options.json + weights) or training checkpoint")
    export.add_argument("--format", choices=["allennlp"], default="allennlp",
                        help="allennlp (default, the only one): options.json + weights.hdf5 "
                             "with bilm-tf's tensor names")
    export.add_argument("--out", required=True, metavar="DIR",
                        help="directory to write (created; must differ from MODEL_DIR)")
    export.set_defaults(handler=_model_export)
    package = verbs.add_parser("package", help="a shippable model dir from a checkpoint",
                               description=PACKAGE_HELP, formatter_class=_RAW)
    package.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                         help="an `elmo train --out` directory")
    package.add_argument("--out", required=True, metavar="DIR",
                         help="the model directory to write")
    package.add_argument("--dtype", choices=["float16", "bfloat16", "float32"],
                         default="float16", help="storage precision (default float16)")
    package.add_argument("--average-with", nargs="+", default=[], metavar="CHECKPOINT_DIR",
                         help="copies of earlier checkpoints of the same run: ship the mean "
                              "of their weights and CHECKPOINT_DIR's")
    package.set_defaults(handler=_model_package)
    model.set_defaults(handler=lambda _args: model.print_help() or 2)

    embed = subparsers.add_parser(
        "embed-sentences", help="embed pre-tokenized sentences", description=EMBED_HELP,
        formatter_class=_RAW,
        usage="elmo embed-sentences [-h] (MODEL_DIR | OPTIONS WEIGHTS) FILE [options]")
    embed.add_argument("model_files", nargs="+", metavar="MODEL_DIR|OPTIONS WEIGHTS FILE",
                       help="a model directory (like models/default), or options.json and "
                            "its weights file (.hdf5 or .safetensors); then FILE, one "
                            "pre-tokenized sentence per line")
    embed.add_argument("--out", metavar="F.npz", help="save all layers (one array per sentence)")
    embed.add_argument("--mode", choices=["stateless", "stateful"], default="stateless",
                       help="stateless (default): each sentence starts from the model's "
                            "initial state; stateful: bilm-tf's behaviour, to compare with "
                            "original outputs (the file is one batch, from zero state)")
    embed.add_argument("--device", default="cpu",
                       help="cpu (default), cuda, cuda:N or auto (CUDA when available)")
    embed.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                       help="model arithmetic (default float32; float16 needs CUDA)")
    embed.set_defaults(handler=_embed_sentences)


def _register_train(subparsers: Any) -> None:
    train = subparsers.add_parser("train", help="train or fine-tune a biLM on plain text",
                                  description=TRAIN_HELP, formatter_class=_RAW)
    train.add_argument("corpus", metavar="CORPUS_GLOB",
                       help="text files (one paragraph per line) or .jsonl documents "
                            "(quote the glob)")
    train.add_argument("--config", default="small",
                       help="small | medium | standard | an options JSON file (default small)")
    train.add_argument("--out", required=True, metavar="DIR",
                       help="checkpoint directory; resumed when it already holds one")
    train.add_argument("--init-from", metavar="MODEL_DIR",
                       help="fine-tune: start from this model (ours, or options.json + "
                            "weights.hdf5); its shape wins over --config")
    train.add_argument("--max-steps", type=int, help="stop at this total step count; also the "
                       "horizon of the learning-rate decay")
    train.add_argument("--max-minutes", type=float,
                       help="stop within this many minutes, with a checkpoint; run the same "
                            "command again to resume")
    train.add_argument("--checkpoint-minutes", type=float, default=5.0, metavar="M",
                       help="save a checkpoint (and evaluate) every M minutes (default 5)")
    train.add_argument("--eval-lines", type=int, default=300,
                       help="held-out lines evaluated at intermediate checkpoints, taken at "
                            "even steps through the held-out set so that every file counts "
                            "(the final checkpoint uses all)")
    train.add_argument("--threads", type=int, default=1,
                       help="torch threads (default 1: two under CPU contention are far slower)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a training key, e.g. --set lr=0.002 --set dropout=0")
    train.add_argument("--tokenizer", metavar="NAME",
                       help="cuts each line into words: moses | elmo-store-words | "
                            "elmo-store-ptb (default: the --init-from model's declared one, "
                            "else moses, as the original ELMo); written into options.json")
    train.add_argument("--device", default="auto",
                       help="auto (default: CUDA when available), cpu, cuda or cuda:N; a "
                            "checkpoint resumes on any device")
    train.add_argument("--no-progress", action="store_true",
                       help="no progress bar (for logs); checkpoints are still reported")
    train.set_defaults(handler=_train)


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL_DIR|OPTIONS",
                        help="a model directory (options.json + weights, like models/default), "
                             "or an options.json followed by WEIGHTS")
    parser.add_argument("weights", nargs="?", metavar="WEIGHTS",
                        help="weights file (.hdf5 or .safetensors) when OPTIONS is a file")


def _model_files(model: str, weights: str | None) -> tuple[Path, Path]:
    """(options.json, weights) of a model directory, or of explicit files."""
    from elmo_model.options_file import model_dir_files

    path = Path(model)
    if weights is not None:
        if path.is_dir():
            raise ElmoUserError(f"{path} is a directory: give the directory alone, or "
                                "options.json and its weights file")
        return path, Path(weights)
    if path.is_dir():
        return model_dir_files(path)
    if path.is_file():
        raise ElmoUserError(f"{path} is a file: give its weights file after it, or the model "
                            "directory")
    raise ElmoUserError(f"model directory not found: {path}")


def key_values(pairs: list[str], flag: str, example: str) -> dict[str, Any]:
    """Repeated ``KEY=VALUE`` options (``--set``, ``--storage-option``) as a dict; a value
    is JSON where it parses (``true`` a bool, ``1`` an int), else text."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ElmoUserError(f"{flag} {pair!r}: write KEY=VALUE, e.g. {example}")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def _train(args: argparse.Namespace) -> int:
    import torch

    from elmo_model.training import train

    torch.set_num_threads(max(1, args.threads))
    command = "elmo " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result = train(
        args.corpus, args.out, config_spec=args.config, init_from=args.init_from,
        max_steps=args.max_steps, max_minutes=args.max_minutes,
        checkpoint_minutes=args.checkpoint_minutes, eval_lines=args.eval_lines,
        progress=not args.no_progress, command=command,
        overrides=key_values(args.set, "--set", "lr=0.002") or None,
        tokenizer=args.tokenizer, device=args.device,
    )
    ppl = result.last_perplexity
    if ppl:
        print(f"{result.out}: step {result.state.step}, held-out perplexity forward "
              f"{ppl['forward']:.1f} backward {ppl['backward']:.1f} mean {ppl['mean']:.1f}")
        for name, figures in ppl.get("by_file", {}).items():
            print(f"  {name}: forward {figures['forward']:.1f} backward "
                  f"{figures['backward']:.1f} mean {figures['mean']:.1f} "
                  f"({figures['tokens']:,.0f} tokens)")
    return 0


def _model_info(args: argparse.Namespace) -> int:
    from elmo_model import build_model

    options, weights = _model_files(args.model, args.weights)
    model = build_model(options, weights)
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    char_params = sum(p.numel() for p in model.char_cnn.parameters())
    print(f"options:        {options}")
    print(f"weights:        {weights}")
    print(f"layers:         {config.n_layers} biLSTM layers, {config.lstm_dim} cells, "
          f"projection {config.projection_dim} (output {config.output_dim} per layer, "
          f"{config.n_output_layers} layers)")
    print(f"char CNN:       embedding {config.char_embedding_dim}, {len(config.filters)} "
          f"widths, {config.n_filters} filters, {config.n_highway} highway, "
          f"{config.activation}")
    print(f"clips:          cell {config.cell_clip}, projection {config.proj_clip}, skip "
          f"connections {config.use_skip_connections}")
    print(f"parameters:     {params:,} ({char_params:,} in the char CNN)")
    flops = config.forward_flops_per_token()
    print(f"FLOPs / token:  {flops:,} ({flops / 1e6:.1f} MFLOP, inference, softmax excluded)")
    return 0


def _read_sentences(path: str) -> list[list[str]]:
    file = Path(path)
    if not file.is_file():
        raise ElmoUserError(f"sentence file not found: {file}")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise ElmoUserError(f"{file}: not UTF-8 text ({error})") from None
    sentences = [line.split() for line in lines if line.strip()]
    if not sentences:
        raise ElmoUserError(f"{file}: no sentences (expects one tokenized sentence per line)")
    return sentences


def _embed_sentences(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from elmo_model import load

    *model, file = args.model_files
    if len(model) not in (1, 2):
        raise ElmoUserError("give MODEL_DIR FILE or OPTIONS WEIGHTS FILE "
                            f"(got {len(args.model_files)} paths)")
    options, weights = _model_files(model[0], model[1] if len(model) == 2 else None)
    sentences = _read_sentences(file)
    embedder = load(options, weights, mode=args.mode, device=args.device, dtype=args.dtype)
    start = time.perf_counter()
    layers = embedder.embed(sentences)
    elapsed = time.perf_counter() - start
    n_tokens = sum(len(s) for s in sentences)
    if args.out:
        out = Path(args.out)
        if out.parent and not out.parent.is_dir():
            raise ElmoUserError(f"--out {out}: directory {out.parent} does not exist")
        np.savez(out, **{f"sentence_{i}": array for i, array in enumerate(layers)})
        print(f"wrote {len(layers)} sentences ({n_tokens} tokens) to {out}")
    else:
        for i, (sentence, array) in enumerate(zip(sentences, layers, strict=True)):
            norms = np.linalg.norm(array, axis=-1).mean(axis=1)
            print(f"{i}\t{len(sentence)} tokens\tlayers {list(array.shape)}\tmean norms "
                  + " ".join(f"{n:.2f}" for n in norms))
    print(f"{len(sentences)} sentences, {n_tokens} tokens, {args.mode}, "
          f"{n_tokens / max(elapsed, 1e-9):,.0f} tokens/s", file=sys.stderr)
    return 0


def _model_export(args: argparse.Namespace) -> int:
    from elmo_model import build_model
    from elmo_model.options_file import HDF5_FILE, OPTIONS_FILE, find_weights
    from elmo_model.weights import export_bilm_tf_weights, options_from_config

    source = Path(args.model_dir)
    if not source.is_dir():
        raise ElmoUserError(f"model directory not found: {source}")
    model = build_model(source / OPTIONS_FILE, find_weights(source))
    out = Path(args.out)
    if out.resolve() == source.resolve():
        raise ElmoUserError("--out must differ from the source directory")
    out.mkdir(parents=True, exist_ok=True)
    options = options_from_config(model.config)
    options.pop("training", None)  # bilm-tf's loaders only read lstm and char_cnn
    (out / OPTIONS_FILE).write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")
    export_bilm_tf_weights(model, out / HDF5_FILE)
    print(f"wrote {out / OPTIONS_FILE} and {out / HDF5_FILE} (bilm-tf / AllenNLP layout)")
    return 0


def _model_package(args: argparse.Namespace) -> int:
    import torch

    from elmo_model.training import package_model

    out = package_model(args.checkpoint, args.out, dtype=getattr(torch, args.dtype),
                        average_with=args.average_with)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB)")
    return 0
