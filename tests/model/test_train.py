"""Training: loss goes down, resume is exact, perplexity is computed as by hand."""

from __future__ import annotations

import concurrent.futures
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_tiny_options, write_toy_corpus
from safetensors.torch import load_file

from elmo_model.char_ids import token_char_ids
from elmo_model.errors import ElmoUserError, SettingError, cli_flag
from elmo_model.model import BiLM, BiLMConfig
from elmo_model.training import load_trained, package_model, train
from elmo_model.training.config import TrainParams, resolve_config
from elmo_model.training.data import Corpus, StreamBatches, is_heldout, load_corpus
from elmo_model.training.evaluation import heldout_perplexity, spread_sample
from elmo_model.training.lm_head import Softmax, carry_rows, perplexity
from elmo_model.vocab import Vocabulary
from pipeline.tokenize import get_tokenizer, model_tokenizer

QUIET = {"progress": False, "log": lambda _message: None}
# Bit-for-bit comparisons run on the CPU: CUDA's scatter-adds in backward are not
# deterministic, and what is compared here (resuming) does not depend on the device.
EXACT = {**QUIET, "device": "cpu"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_tiny_model_learns(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    out = tmp_path / "run"
    first = train(corpus, out, str(options), max_steps=1, **QUIET)
    assert first.last_perplexity is not None
    # The toy language has 25 word types: an untrained model sits near uniform.
    assert first.last_perplexity["mean"] > 15
    later = train(corpus, out, str(options), max_steps=40, **QUIET)
    assert later.state.step == 40
    assert later.last_perplexity is not None
    assert later.last_perplexity["mean"] < 0.5 * first.last_perplexity["mean"]
    for direction in ("forward", "backward"):
        assert later.last_perplexity[direction] < 0.65 * first.last_perplexity[direction]
    saved = json.loads((out / "training_state.json").read_text())
    assert [h["step"] for h in saved["history"]] == [1, 40]
    assert (out / "options.json").is_file() and (out / "vocab.txt").is_file()


def test_sampled_softmax_learns(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    # 8 shared negatives for a 28-word vocabulary: slow, but it must learn
    options = write_tiny_options(tmp_path, n_negative_samples=8, dropout=0.1,
                                 precision="bfloat16")
    out = tmp_path / "run"
    first = train(corpus, out, str(options), max_steps=1, **QUIET)
    later = train(corpus, out, str(options), max_steps=30, **QUIET)
    assert first.last_perplexity and later.last_perplexity
    assert later.last_perplexity["mean"] < 0.92 * first.last_perplexity["mean"]


class KilledError(Exception):
    """Stands in for a kill between two checkpoints."""


def test_resume_after_kill_matches_uninterrupted_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path, dropout=0.1, n_negative_samples=8)
    straight = train(corpus, tmp_path / "straight", str(options), max_steps=12,
                     checkpoint_steps=4, **EXACT)

    window = StreamBatches.window

    def dying_window(self: StreamBatches, step: int) -> tuple[np.ndarray, np.ndarray]:
        if step == 10:
            raise KilledError
        return window(self, step)

    with monkeypatch.context() as patch:
        patch.setattr(StreamBatches, "window", dying_window)
        with pytest.raises(KilledError):
            train(corpus, tmp_path / "killed", str(options), max_steps=12, checkpoint_steps=4,
                  **EXACT)
    on_disk = json.loads((tmp_path / "killed" / "training_state.json").read_text())
    assert on_disk["step"] == 8  # the last whole checkpoint
    assert not list((tmp_path / "killed").glob("*.tmp"))
    resumed = train(corpus, tmp_path / "killed", str(options), max_steps=12, checkpoint_steps=4,
                    **EXACT)
    assert resumed.state.step == straight.state.step == 12
    assert [h["step"] for h in resumed.state.history] == [4, 8, 12]
    a = load_file(str(tmp_path / "straight" / "weights.safetensors"))
    b = load_file(str(tmp_path / "killed" / "weights.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


def test_time_limited_runs_resume_on_the_uninterrupted_trajectory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs of at most N minutes: each stops with a checkpoint, and the same command again
    continues with the same steps, losses, weights, optimizer moments and carried state."""
    from pipeline.cli import main

    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path, dropout=0.1, n_negative_samples=8, warmup_steps=3)
    straight = train(corpus, tmp_path / "straight", str(options), max_steps=6, **EXACT)
    assert straight.stopped_by == "max_steps" and len(straight.losses) == 6

    # a limit already passed once the corpus is loaded: every run takes one step and stops
    pieces = []
    while not pieces or pieces[-1].stopped_by == "max_minutes":
        pieces.append(train(corpus, tmp_path / "limited", str(options), max_steps=6,
                            max_minutes=1e-9, **EXACT))
    assert [p.state.step for p in pieces] == [1, 2, 3, 4, 5, 6]
    assert [p.stopped_by for p in pieces] == ["max_minutes"] * 5 + ["max_steps"]
    losses = [loss for p in pieces for loss in p.losses]
    np.testing.assert_allclose(losses, straight.losses, rtol=0, atol=1e-5)
    assert [r["step"] for r in pieces[-1].state.resumes] == [1, 2, 3, 4, 5]
    a = load_file(str(tmp_path / "straight" / "weights.safetensors"))
    b = load_file(str(tmp_path / "limited" / "weights.safetensors"))
    assert a.keys() == b.keys()
    assert {k.split(".")[0] for k in a} >= {"optimizer", "carry", "softmax"}
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5, msg=name)

    # the command line: the same command twice, each within its limit, the second resumes
    command = ["train", corpus, "--config", str(options), "--out", str(tmp_path / "cli"),
               "--max-minutes", "0.000001", "--device", "cpu", "--no-progress"]
    assert main(command) == 0 and main(command) == 0
    saved = json.loads((tmp_path / "cli" / "training_state.json").read_text())
    assert saved["step"] == 2 and [r["step"] for r in saved["resumes"]] == [1]
    assert "stopped (max_minutes) at step 2" in capsys.readouterr().err


def test_missing_or_malformed_options_are_one_line_user_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    out = tmp_path / "run"
    train(corpus, out, str(options), max_steps=1, **QUIET)
    (out / "options.json").write_text('{"lstm": {"dim": ')
    with pytest.raises(ElmoUserError, match=r"options\.json: not valid JSON"):
        train(corpus, out, str(options), max_steps=2, **QUIET)
    with pytest.raises(ElmoUserError, match="not valid JSON"):
        load_trained(out)
    (out / "options.json").unlink()
    with pytest.raises(ElmoUserError, match="options file not found"):
        train(corpus, out, str(options), max_steps=2, **QUIET)
    with pytest.raises(ElmoUserError, match="not a training checkpoint"):
        package_model(out, tmp_path / "shipped")
    broken = tmp_path / "broken.json"
    broken.write_bytes(b"\xff{")
    with pytest.raises(ElmoUserError, match=r"broken\.json: not valid JSON"):
        resolve_config(str(broken))
    capsys.readouterr()
    assert main(["train", corpus, "--config", str(broken), "--out", str(tmp_path / "x")]) == 2
    assert main(["train", corpus, "--config", str(options), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not valid JSON" in err[0] and "options file not found" in err[1]
    assert "Traceback" not in "".join(err)


def test_device_is_checked_before_any_work(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    with pytest.raises(ElmoUserError, match="unknown device"):
        train(corpus, tmp_path / "tpu", str(options), max_steps=1, device="tpu", **QUIET)
    assert not (tmp_path / "tpu").exists()
    if not torch.cuda.is_available():
        with pytest.raises(SettingError, match="use device cpu") as caught:
            train(corpus, tmp_path / "gpu", str(options), max_steps=1, device="cuda", **QUIET)
        assert caught.value.named(cli_flag).endswith("use --device cpu")  # `elmo train`'s
        assert not (tmp_path / "gpu").exists()
        return
    # with a GPU: train there, resume on the CPU, and come back
    on_gpu = train(corpus, tmp_path / "gpu", str(options), max_steps=3, device="cuda", **QUIET)
    on_cpu = train(corpus, tmp_path / "gpu", str(options), max_steps=5, device="cpu", **QUIET)
    again = train(corpus, tmp_path / "gpu", str(options), max_steps=7, device="cuda", **QUIET)
    assert (on_gpu.state.step, on_cpu.state.step, again.state.step) == (3, 5, 7)
    assert again.last_perplexity is not None and math.isfinite(again.last_perplexity["mean"])


def test_init_from_fine_tunes_and_keeps_the_vocabulary(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    train(corpus, tmp_path / "base", str(options), max_steps=20, **QUIET)
    other = write_toy_corpus(tmp_path / "other", n_lines=120, seed=7)
    tuned = train(other, tmp_path / "tuned", str(options), init_from=str(tmp_path / "base"),
                  max_steps=5, **QUIET)
    assert tuned.state.init_from == str(tmp_path / "base")
    assert (tmp_path / "tuned" / "vocab.txt").read_text() == \
        (tmp_path / "base" / "vocab.txt").read_text()
    # the options record the vocabulary kept, not the preset's size
    kept = len((tmp_path / "base" / "vocab.txt").read_text().splitlines()) - 3
    recorded = json.loads((tmp_path / "tuned" / "options.json").read_text())["training"]
    assert recorded["n_tokens_vocab"] == kept != TrainParams().n_tokens_vocab
    base_model, base_softmax, _, _ = load_trained(tmp_path / "base")
    tuned_model, tuned_softmax, _, _ = load_trained(tmp_path / "tuned")
    # started from the base weights (same shapes), then moved
    assert base_model.config.lstm_dim == tuned_model.config.lstm_dim
    assert not torch.equal(base_softmax.weight, tuned_softmax.weight)
    first = base_model.layers[0].input_weight
    assert (tuned_model.layers[0].input_weight - first).abs().max() < 0.2


def test_plain_model_dir_is_not_resumed(tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    with pytest.raises(ElmoUserError, match="not a training checkpoint"):
        train(corpus, tiny_model_dir, "small", max_steps=1, **QUIET)


def test_config_errors_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(ElmoUserError, match="neither a preset"):
        resolve_config(str(tmp_path / "missing.json"))
    bad = write_tiny_options(tmp_path, optimizer="sgd")
    with pytest.raises(ElmoUserError, match="optimizer"):
        resolve_config(str(bad))
    with pytest.raises(ElmoUserError, match="unknown training key"):
        TrainParams.from_dict({"learning_rate": 1}, "x")
    with pytest.raises(ElmoUserError, match="no files match"):
        load_corpus(str(tmp_path / "nothing*.txt"), TrainParams())
    for preset in ("small", "medium", "standard"):
        config, params = resolve_config(preset)
        assert config.extra["training"]["batch_size"] == params.batch_size


# ---------------------------------------------------------------- perplexity by hand


def test_full_softmax_nll_by_hand() -> None:
    softmax = Softmax(3, 2)
    with torch.no_grad():
        softmax.weight.zero_()
        softmax.bias.copy_(torch.log(torch.tensor([0.5, 0.25, 0.25])))
    nll = softmax.nll(torch.randn(4, 2), torch.tensor([0, 1, 2, 1]), chunk=3)
    torch.testing.assert_close(nll, torch.tensor([math.log(2), math.log(4), math.log(4),
                                                  math.log(4)]))
    # exp(mean NLL) = (2 * 4 * 4 * 4) ** (1 / 4) = 2 ** (7 / 4)
    assert perplexity(float(nll.sum().detach()), 4) == pytest.approx(2 ** 1.75)
    assert math.isnan(perplexity(0.0, 0))


def test_heldout_perplexity_by_hand() -> None:
    """One held-out line ``<S> a b </S>``, a softmax that ignores the LSTM (zero weights)
    and predicts p = [<S> .1, </S> .2, <UNK> .1, a .4, b .2]. Forward predicts a, b, </S>;
    backward predicts <S>, a, b."""
    types = ["<S>", "</S>", "a", "b"]
    vocab = Vocabulary(["a", "b"])
    corpus = Corpus(types=types, train=[], heldout=[np.array([0, 2, 3, 1])],
                    char_ids=np.stack([token_char_ids(t) for t in types]).astype(np.int16),
                    softmax_ids=np.array(vocab.ids(types)))
    config = BiLMConfig(n_layers=1, lstm_dim=8, projection_dim=4, char_embedding_dim=4,
                        filters=((1, 4),), n_highway=0)
    model = BiLM(config)
    softmax = Softmax(len(vocab), 4)
    probabilities = torch.tensor([0.1, 0.2, 0.1, 0.4, 0.2])
    with torch.no_grad():
        softmax.weight.zero_()
        softmax.bias.copy_(probabilities.log())
    result = heldout_perplexity(model, softmax, corpus)
    forward = (0.4 * 0.2 * 0.2) ** (-1 / 3)
    backward = (0.1 * 0.4 * 0.2) ** (-1 / 3)
    assert result["forward"] == pytest.approx(forward, rel=1e-5)
    assert result["backward"] == pytest.approx(backward, rel=1e-5)
    assert result["mean"] == pytest.approx(math.sqrt(forward * backward), rel=1e-5)
    assert result["tokens"] == 3
    # Per file: a second line ``<S> b </S>`` from another file (forward predicts b, </S>;
    # backward <S>, b); the whole is both files' predictions together.
    corpus.heldout.append(np.array([0, 3, 1]))
    result = heldout_perplexity(model, softmax, corpus, files=["x.jsonl", "y.jsonl"])
    second_fwd, second_bwd = (0.2 * 0.2) ** (-1 / 2), (0.1 * 0.2) ** (-1 / 2)
    assert result["by_file"]["x.jsonl"]["forward"] == pytest.approx(forward, rel=1e-5)
    assert result["by_file"]["x.jsonl"]["tokens"] == 3
    assert result["by_file"]["y.jsonl"]["forward"] == pytest.approx(second_fwd, rel=1e-5)
    assert result["by_file"]["y.jsonl"]["backward"] == pytest.approx(second_bwd, rel=1e-5)
    assert result["by_file"]["y.jsonl"]["tokens"] == 2
    assert result["forward"] == pytest.approx((forward ** 3 * second_fwd ** 2) ** (1 / 5),
                                              rel=1e-5)
    assert result["tokens"] == 5


def test_intermediate_evaluation_samples_every_file() -> None:
    """Held-out lines come file by file; the checkpoints' sample takes lines at even steps
    through all of them, so a later file (source) is in it in proportion to its lines."""
    lines = [("classics", i) for i in range(600)] + [("sotu", i) for i in range(300)] + \
        [("wiki", i) for i in range(100)]
    sample = spread_sample(lines, 100)
    assert len(sample) == 100 and sample[0] == lines[0]
    assert len(set(sample)) == 100 and sample == sorted(sample, key=lines.index)
    counts = {source: sum(s == source for s, _ in sample) for source in ("classics", "sotu",
                                                                          "wiki")}
    assert counts == {"classics": 60, "sotu": 30, "wiki": 10}
    assert spread_sample(lines[:7], 100) == lines[:7]


def test_sampled_softmax_masks_accidental_hits() -> None:
    torch.manual_seed(0)
    softmax = Softmax(5, 3)
    hidden = torch.randn(6, 3, requires_grad=True)
    targets = torch.tensor([0, 1, 2, 3, 4, 0])
    generator = torch.Generator().manual_seed(0)
    nll = softmax.sampled_nll(hidden, targets, 64, generator)  # every id is drawn
    assert torch.isfinite(nll).all() and (nll > 0).all()
    nll.sum().backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()


# ---------------------------------------------------------------- data


def test_streams_continue_across_windows(tmp_path: Path) -> None:
    corpus, _ = load_corpus(write_toy_corpus(tmp_path), TrainParams(heldout_percent=0,
                                                                    batch_size=3,
                                                                    unroll_steps=5))
    batches = StreamBatches(corpus, TrainParams(batch_size=3, unroll_steps=5))
    first_f, first_b = batches.window(0)
    second_f, second_b = batches.window(1)
    assert first_f.shape == (3, 6)
    # the next window starts where the previous one's targets ended
    assert np.array_equal(first_f[:, -1], second_f[:, 0])
    assert np.array_equal(first_b[:, -1], second_b[:, 0])
    # the backward stream is text read right to left: </S> comes before <S>
    flat = first_b.ravel().tolist()
    assert 1 in flat and 0 in flat
    row = batches._backward[0].tolist()
    eos = row.index(1)
    assert row[eos:].index(0) > 0


def test_vocabulary_and_tokenizer(tmp_path: Path) -> None:
    words = get_tokenizer("elmo-store-words").tokenize(
        "Now, fair Hippolyta, our nuptial hour draws on apace; don't.")
    assert [t.text for t in words] == [
        "Now", ",", "fair", "Hippolyta", ",", "our", "nuptial", "hour", "draws", "on",
        "apace", ";", "don't", "."]
    vocab = Vocabulary.build([["b", "a", "b"], ["c", "a", "b"]], max_size=2)
    assert vocab.words == ["<S>", "</S>", "<UNK>", "b", "a"]
    assert vocab.ids(["a", "c", "<S>"]) == [4, 2, 0]
    vocab.save(tmp_path / "vocab.txt")
    assert Vocabulary.load(tmp_path / "vocab.txt").words == vocab.words
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(ElmoUserError, match="special token"):
        Vocabulary.load(tmp_path / "bad.txt")


def test_heldout_split_on_the_shared_corpus(corpora_dir: Path) -> None:
    text = corpora_dir / "moby_dick.txt"
    lines = [line.strip() for line in text.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    held = [line for line in lines if is_heldout(line, 1.0)]
    assert 0.004 < len(held) / len(lines) < 0.02
    assert held == [line for line in lines if is_heldout(line, 1.0)]  # fixed, not random


# What each tokenizer makes of "didn't": the pieces a model trained with it must predict.
CLITIC_PIECES = {"moses": {"didn", "'t"}, "elmo-store-ptb": {"did", "n't"},
                 "elmo-store-words": {"didn't"}}


def _clitic_corpus(directory: Path) -> str:
    corpus = write_toy_corpus(directory)
    subjects = ("the cat", "a dog", "my sister", "the bird", "the old man")
    (directory / "clitics.txt").write_text(
        "".join(f"{who} didn't sit on the mat .\n" for who in subjects) * 8)
    return corpus


def test_trained_model_declares_the_tokenizer_it_was_trained_with(tmp_path: Path) -> None:
    corpus = _clitic_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path, heldout_percent=0.0)  # every line in the vocabulary
    every_piece = set().union(*CLITIC_PIECES.values())
    for name, pieces in CLITIC_PIECES.items():
        out = tmp_path / name
        train(corpus, out, str(options), max_steps=1, tokenizer=name, **QUIET)
        assert model_tokenizer(str(out)) == name
        declared = json.loads((out / "options.json").read_text())["tokenizer"]
        assert declared == get_tokenizer(name).record()
        vocab = set(Vocabulary.load(out / "vocab.txt").words)
        assert vocab & every_piece == pieces  # the corpus was cut by this tokenizer
    # a new model without --tokenizer is cut as the original ELMo was
    train(corpus, tmp_path / "default", str(options), max_steps=1, **QUIET)
    assert model_tokenizer(str(tmp_path / "default")) == "moses"
    # an options file's declaration is the default for models made from it
    declaring = json.loads(options.read_text())
    declaring["tokenizer"] = {"name": "elmo-store-ptb"}
    (tmp_path / "declaring.json").write_text(json.dumps(declaring))
    train(corpus, tmp_path / "from_file", str(tmp_path / "declaring.json"), max_steps=1, **QUIET)
    assert json.loads((tmp_path / "from_file" / "options.json").read_text())["tokenizer"] == \
        get_tokenizer("elmo-store-ptb").record()


def test_resume_keeps_the_tokenizer_and_unknown_names_fail_first(tmp_path: Path) -> None:
    from pipeline.cli import main

    corpus = _clitic_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    out = tmp_path / "run"
    train(corpus, out, str(options), max_steps=1, tokenizer="elmo-store-ptb", **QUIET)
    with pytest.raises(ElmoUserError, match="trained with tokenizer elmo-store-ptb"):
        train(corpus, out, str(options), max_steps=2, tokenizer="moses", **QUIET)
    resumed = train(corpus, out, str(options), max_steps=2, **QUIET)
    assert resumed.state.step == 2 and model_tokenizer(str(out)) == "elmo-store-ptb"
    # trained under other rules of the same tokenizer: refused unless asked for by name
    saved = json.loads((out / "options.json").read_text())
    saved["tokenizer"]["version"] = "0"
    (out / "options.json").write_text(json.dumps(saved))
    with pytest.raises(ElmoUserError, match="pass tokenizer elmo-store-ptb"):
        train(corpus, out, str(options), max_steps=3, **QUIET)
    again = train(corpus, out, str(options), max_steps=3, tokenizer="elmo-store-ptb", **QUIET)
    assert again.state.step == 3
    code = main(["train", corpus, "--config", str(options), "--out", str(tmp_path / "new"),
                 "--max-steps", "1", "--no-progress", "--tokenizer", "nltk"])
    assert code == 2
    assert not (tmp_path / "new").exists()  # refused before anything was written


def test_init_from_bilm_tf_weights_trains_with_moses(tmp_path: Path,
                                                     elmo_fixture_dir: Path) -> None:
    import shutil

    source = tmp_path / "bilm_tf"
    source.mkdir()
    shutil.copy(elmo_fixture_dir / "options.json", source / "options.json")
    shutil.copy(elmo_fixture_dir / "lm_weights.hdf5", source / "weights.hdf5")
    corpus = write_toy_corpus(tmp_path / "text", n_lines=120)
    options = write_tiny_options(tmp_path, batch_size=4)
    train(corpus, tmp_path / "tuned", str(options), init_from=str(source), max_steps=1, **QUIET)
    assert model_tokenizer(str(tmp_path / "tuned")) == "moses"


def test_package_then_fine_tune_from_ours_and_from_allennlp(tmp_path: Path) -> None:
    from pipeline.cli import main

    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    train(corpus, tmp_path / "base", str(options), max_steps=10, tokenizer="elmo-store-ptb",
          **QUIET)
    packaged = package_model(tmp_path / "base", tmp_path / "shipped")
    assert model_tokenizer(str(packaged)) == "elmo-store-ptb"
    names = {p.name for p in packaged.iterdir()}
    assert names == {"options.json", "weights.safetensors", "vocab.txt", "softmax.safetensors",
                     "warm_state.safetensors"}
    weights = load_file(str(packaged / "weights.safetensors"))
    assert all(t.dtype == torch.float16 for t in weights.values())
    assert not any(k.startswith(("softmax.", "optimizer.", "carry.")) for k in weights)
    # packaged: vocabulary and softmax carry over
    tuned = train(corpus, tmp_path / "from_ours", str(options), init_from=str(packaged),
                  max_steps=2, **QUIET)
    assert tuned.last_perplexity is not None
    assert (tmp_path / "from_ours" / "vocab.txt").read_text() == \
        (packaged / "vocab.txt").read_text()
    assert model_tokenizer(str(tmp_path / "from_ours")) == "elmo-store-ptb"  # inherited
    # AllenNLP layout: no vocabulary there, so a new one and a fresh softmax
    assert main(["model", "export", str(packaged), "--out", str(tmp_path / "allennlp")]) == 0
    other = write_toy_corpus(tmp_path / "other", n_lines=100, seed=3)
    again = train(other, tmp_path / "from_allennlp", str(options),
                  init_from=str(tmp_path / "allennlp"), max_steps=2, **QUIET)
    assert again.state.step == 2 and again.last_perplexity is not None
    # the export keeps the declaration (AllenNLP reads only lstm and char_cnn), so the
    # fine-tuned model inherits it; --tokenizer overrides it
    assert model_tokenizer(str(tmp_path / "allennlp")) == "elmo-store-ptb"
    assert model_tokenizer(str(tmp_path / "from_allennlp")) == "elmo-store-ptb"
    train(other, tmp_path / "override", str(options), init_from=str(tmp_path / "allennlp"),
          max_steps=1, tokenizer="moses", **QUIET)
    assert model_tokenizer(str(tmp_path / "override")) == "moses"


def test_jsonl_documents_are_cut_into_sentences_and_held_out_whole(tmp_path: Path) -> None:
    documents = [f"The {animal} ate the grass. Dr. Smith saw it on day {day}! Was it hungry?"
                 for day in range(40) for animal in ("cow", "horse")]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": text}) + "\n"
                            for i, text in enumerate(documents)) + "\n")
    tokenizer = get_tokenizer("elmo-store-sentences")
    corpus, _ = load_corpus(str(path), TrainParams(heldout_percent=10.0), tokenizer=tokenizer)
    held = [text for text in documents if is_heldout(text, 10.0)]
    assert 0 < len(held) < len(documents)
    # three sentences a document ("Dr." ends none), on the side of its whole document
    assert len(corpus.heldout) == 3 * len(held)
    assert len(corpus.train) == 3 * (len(documents) - len(held))
    first = [corpus.types[i] for i in corpus.train[0]]
    assert first[0] == "<S>" and first[-1] == "</S>" and first[-2] == "."
    assert "Dr" in [corpus.types[i] for i in corpus.train[1]]


def test_checkpoints_report_held_out_perplexity_per_file(tmp_path: Path) -> None:
    """Each held-out line remembers its file (a source in the corpus recipe); every
    checkpoint's evaluation gives the figures per file besides the whole."""
    corpus_dir = tmp_path / "text"
    write_toy_corpus(corpus_dir)
    (corpus_dir / "more.txt").write_text("\n".join(
        f"the dog sees {i} birds ." for i in range(300)) + "\n")
    params = TrainParams(heldout_percent=20.0)
    corpus, _ = load_corpus(str(corpus_dir / "*.txt"), params)
    assert sorted(set(corpus.heldout_files)) == ["more.txt", "toy.txt"]
    assert len(corpus.heldout_files) == len(corpus.heldout)
    messages: list[str] = []
    result = train(str(corpus_dir / "*.txt"), tmp_path / "run",
                   str(write_tiny_options(tmp_path)), max_steps=2, eval_lines=10,
                   overrides={"heldout_percent": 20.0}, progress=False, log=messages.append)
    by_file = result.last_perplexity["by_file"]
    assert sorted(by_file) == ["more.txt", "toy.txt"]
    assert sum(f["tokens"] for f in by_file.values()) == result.last_perplexity["tokens"]
    assert any("per file: more " in m and ", toy " in m for m in messages)
    history = json.loads((tmp_path / "run" / "training_state.json").read_text())["history"]
    assert all(sorted(h["heldout_perplexity"]["by_file"]) == ["more.txt", "toy.txt"]
               for h in history)


def test_cutting_in_parallel_gives_the_same_corpus(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Texts cut by several processes (chunks of about 2 kB here) give the corpus one
    process gives: the same sentences, type ids, held-out split and vocabulary."""
    from elmo_model.training import data

    records = [{"text": f"Doc {i} says hello. It has {i % 7} cats! Does it? Yes."}
               for i in range(400)]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_toy_corpus(tmp_path / "b", n_lines=200)
    pattern = str(tmp_path / "*" / "*.*")
    params = TrainParams(heldout_percent=10.0, n_tokens_vocab=40)
    tokenizer = get_tokenizer("elmo-store-sentences")
    monkeypatch.setattr(data, "CUT_CHUNK_CHARS", 2000)
    submitted: list[int] = []

    class CountingPool(concurrent.futures.ProcessPoolExecutor):
        def submit(self, *args: object, **kwargs: object) -> concurrent.futures.Future:
            submitted.append(1)
            return super().submit(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", CountingPool)
    one, vocab_one = load_corpus(pattern, params, tokenizer=tokenizer, workers=1)
    assert not submitted
    several, vocab_several = load_corpus(pattern, params, tokenizer=tokenizer, workers=2)
    assert len(submitted) > 5  # cut in chunks by the pool
    assert one.types == several.types and vocab_one.words == vocab_several.words
    assert len(one.train) == len(several.train) > 400 and one.heldout
    for mine, theirs in ((one.train, several.train), (one.heldout, several.heldout)):
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    assert one.heldout_files == several.heldout_files
    assert np.array_equal(one.softmax_ids, several.softmax_ids)


def test_cutting_shows_progress_over_the_files_bytes(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    pattern = write_toy_corpus(tmp_path, n_lines=400)
    quiet, _ = load_corpus(pattern, TrainParams())
    shown, _ = load_corpus(pattern, TrainParams(), progress=True)
    kilobytes = f"{(tmp_path / 'toy.txt').stat().st_size / 1000:.1f}k"  # tqdm's unit_scale
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("cutting the corpus: 100%") and f"{kilobytes}/{kilobytes}" in last
    assert quiet.types == shown.types and len(quiet.train) == len(shown.train)


def test_jsonl_records_without_text_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "fine words here ."}\n{"body": "x"}\n')
    with pytest.raises(ElmoUserError, match=r"bad.jsonl:2: the record has no \"text\""):
        load_corpus(str(tmp_path / "bad.jsonl"), TrainParams(heldout_percent=0))
    (tmp_path / "worse.jsonl").write_text("not json\n")
    with pytest.raises(ElmoUserError, match=r"worse\.jsonl:1: not a JSON record"):
        load_corpus(str(tmp_path / "worse.jsonl"), TrainParams(heldout_percent=0))


def test_carried_softmax_rows_follow_their_words() -> None:
    old_words = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "mat", "rare"]
    new_words = ["<S>", "</S>", "<UNK>", "the", "dog", "sat", "cat"]
    weight = torch.arange(len(old_words) * 3, dtype=torch.float32).reshape(-1, 3)
    bias = -torch.arange(len(old_words), dtype=torch.float32)
    carried = carry_rows({"weight": weight, "bias": bias}, old_words, new_words, seed=0)
    for new_id, word in enumerate(new_words):
        if word in old_words:
            assert torch.equal(carried["weight"][new_id], weight[old_words.index(word)])
            assert carried["bias"][new_id] == bias[old_words.index(word)]
    # a new word starts as likely as the old vocabulary's rarest words
    assert carried["bias"][new_words.index("dog")] == bias[-1]
    assert carried["weight"].shape == (len(new_words), 3)


def test_init_from_with_a_new_vocabulary_size_rebuilds_it(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    train(corpus, tmp_path / "base", str(options), max_steps=3, **QUIET)
    base_vocab = Vocabulary.load(tmp_path / "base" / "vocab.txt")
    other = tmp_path / "other" / "docs.jsonl"
    other.parent.mkdir()
    other.write_text("".join(json.dumps({"text": f"zebras graze at dawn {i} . "
                                                 "the cat sees them ."}) + "\n"
                             for i in range(200)))
    train(str(other), tmp_path / "tuned", str(options), init_from=str(tmp_path / "base"),
          max_steps=2, overrides={"n_tokens_vocab": 12, "heldout_percent": 5.0},
          tokenizer="elmo-store-sentences", **QUIET)
    tuned_vocab = Vocabulary.load(tmp_path / "tuned" / "vocab.txt")
    assert len(tuned_vocab) == 15 and "zebras" in tuned_vocab.words
    assert "zebras" not in base_vocab.words
    _, base_softmax, _, _ = load_trained(tmp_path / "base")
    _, tuned_softmax, _, _ = load_trained(tmp_path / "tuned")
    cat_old, cat_new = base_vocab.id("cat"), tuned_vocab.id("cat")
    # two small steps from the carried row: close to the old one, far from a fresh draw
    moved = (tuned_softmax.weight[cat_new] - base_softmax.weight[cat_old]).abs().max()
    assert moved < 0.05


def test_package_averages_checkpoints_of_one_run(tmp_path: Path) -> None:
    corpus = write_toy_corpus(tmp_path / "text")
    options = write_tiny_options(tmp_path)
    run = tmp_path / "run"
    train(corpus, run, str(options), max_steps=3, **QUIET)
    shutil.copytree(run, tmp_path / "step-3")
    train(corpus, run, str(options), max_steps=6, **QUIET)
    averaged = package_model(run, tmp_path / "avg", dtype=torch.float32,
                             average_with=[tmp_path / "step-3"])
    first, first_softmax, _, _ = load_trained(tmp_path / "step-3")
    last, last_softmax, _, _ = load_trained(run)
    shipped = load_file(str(averaged / "weights.safetensors"))
    name = "layers.0.input_weight"
    mean = (first.state_dict()[name] + last.state_dict()[name]) / 2
    assert torch.allclose(shipped[name], mean, atol=1e-6)
    assert not torch.allclose(shipped[name], last.state_dict()[name])
    softmax = load_file(str(averaged / "softmax.safetensors"))
    [weight_key] = [k for k in softmax if k.endswith("weight")]
    assert torch.allclose(softmax[weight_key], (first_softmax.weight + last_softmax.weight) / 2,
                          atol=1e-6)
    other = tmp_path / "other"
    train(corpus, other, str(options), max_steps=2, overrides={"n_tokens_vocab": 5}, **QUIET)
    with pytest.raises(ElmoUserError, match="average checkpoints of one run"):
        package_model(run, tmp_path / "bad", average_with=[other])
