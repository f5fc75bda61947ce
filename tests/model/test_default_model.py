"""The shipped ``models/default`` behaves like ELMo: context separates word senses.

For a few polysemous words, snippets from the training text are labelled by sense. For
every occurrence we take its nearest other occurrence (cosine) and ask whether it has
the same sense. Layer 0 is context free, so all occurrences of a word share one vector
and its neighbour is a coin toss among them (expected same-sense rate 5/11 here); the
top biLSTM layer should do clearly better.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import FIXTURES

import elmo_model

MODEL_DIR = elmo_model.default_model_dir()
SNIPPET_SOURCES = FIXTURES / "sense_snippet_sources.jsonl"
CORPUS_FILES = ("austen.txt", "moby_dick.txt", "shakespeare.txt", "web_bible.txt")

# word -> {sense: snippets}; each snippet holds the word once, lower case, cut into the
# words the model was trained on (``elmo-store-words``: the words of the
# ``elmo-store-sentences`` tokenizer the model declares, without the sentence cutting).
SENSES: dict[str, dict[str, list[str]]] = {
    "kind": {
        "sort": [
            "all her domestic arrangements ; and from this kind of vanity was her greatest "
            "enjoyment",
            "some bad news , and thought over every kind of distress that could have befallen "
            "him",
            "and Elinor soon allowed them credit for some kind of sense , when she saw",
            "Do you know what kind of a girl Miss Grey is ?",
            "Brother-in-law of Wickham ! Every kind of pride must revolt from the connection .",
            "were matters of common occurrence in this kind of life ; considering that",
        ],
        "kindly": [
            "She concluded with a very kind invitation to Mr . and Mrs . John",
            '" You are very kind , " said Lady Middleton to Elinor ;',
            "makes him a very kind and careful guardian of his sister , and",
            "Mary and Kitty have been very kind , and would have shared in every fatigue",
            "The two sisters were so kind to her , and so pleasant , that",
            "joyful as she could desire , and very kind and communicative ;",
        ],
    },
    "left": {
        "departed": [
            "to what place he should go when he left them - - but still , go he",
            "way to get some quiet rest before she left her .",
            "and , as he spoke , he left the room , fatigued with the raptures of",
            "respects to his friends in Hertfordshire before he left the country .",
            "to dinner at Pemberley , before they left the country .",
            "from her aunt Norris's interminable reproaches ! he left her in a glow of gratitude",
        ],
        "side": [
            "you ever see their equals ? To the left is Barton park , amongst those woods",
            "It was in the left hand try-pot of the Pequod , with the",
            "on our left hand lies Philip , the younger issue of",
            "Held up his left hand , which did flame and burn Like",
            "If you go to the left hand , then I will go to the right",
            "finger in the oil that is in his left hand , and shall sprinkle some of the",
        ],
    },
    "present": {
        "now": [
            "At present , I know him so well , that",
            '" My engagements at present , " replied Willoughby , confusedly',
            "she could not believe it such at present . His affection was all her own .",
            "effects on a colicky gout were , at present , of little importance to her",
            "but I shall not mention it at present to any body else .",
            "knows nothing about it at present , and I believe it will be best to keep",
        ],
        "gift": [
            "A present of fifty pounds , now and then ,",
            "just come down for her - - a present from my master ; she comes here to-morrow",
            "be unbecoming in her to make such a present . It was made , however",
            "been so well satisfied to consider it a present from the Campbells",
            "let's make him a present of a little oil for dear charity's sake",
            "But she did scorn a present that I sent her .",
        ],
    },
    "right": {
        "correct": [
            '" I believe you are right , my love ; it will be better',
            '" But I thought it was right , Elinor , " said Marianne',
            '" You are quite right . To have his errors made public might',
            "Mr . Rushworth is quite right , I think , in meaning to give",
            "But you are quite right ; you could not have chosen better .",
            "There I was quite right . That was well done of me ;",
        ],
        "side": [
            "Mrs . Jennings sat on Elinor's right hand ; and they had not been long",
            "Steelkilt , clenching his right hand behind him and creepingly drawing it back",
            "Marry , it is your brother's right hand .",
            "Upon the right hand comes the conquering King , Upon the left",
            "Turn up on your right hand at the next turning , but ,",
            "This poor right hand of mine Is left to tyrannize upon",
        ],
    },
    "lie": {
        "recline": [
            "Elinor advised her to lie down again , and for a moment she",
            "they sleep - - aye , lie down there , like ground-tier butts .",
            "Will you lie down and rest upon the cushions ?",
            "He shall not lie down until he eats of the prey ,",
            "Eli said to Samuel , “ Go , lie down . It shall be",
            "that the judge shall cause him to lie down and to be beaten before his face",
        ],
        "falsehood": [
            "the turn of his feelings and gave the lie to his actions .",
            "I wish to warn thee . It's a lie . I know Captain Ahab well",
            "Upon a lie seven times removed : - - bear your body more seeming",
            "if I tell thee a lie , spit in my face , call me horse",
            "O , it is much that a lie with a slight oath and a jest",
            "If I could add a lie unto a fault , I would deny it",
        ],
    },
    "bear": {
        "animal": [
            "How easy is a bush supposed a bear !",
            "To anger him we'll have the bear again ; and we will fool him black",
            "Despite the bear-ward that protects the bear .",
            "valiant as the lion , churlish as the bear , slow as the elephant",
            "a lamb indeed , that baes like a bear .",
            "nor the bear half dined on the gentleman",
        ],
        "endure": [
            "a showery sky , and unable longer to bear the confinement",
            "she would go down ; she could bear it very well , and the bustle about",
            "I cannot bear the idea of two young women travelling post",
            "he could no more bear the noise of a child than he could",
            "I must go away . I cannot bear it .",
            "How was she to bear the change ?",
        ],
    },
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def embedder() -> elmo_model.ElmoEmbedder:
    return elmo_model.load_model_dir(MODEL_DIR, device="cpu")


def same_sense_rate(vectors: np.ndarray, labels: list[str]) -> float:
    """Mean over occurrences of P(nearest other occurrence has the same sense); ties
    (identical context-free vectors) count as a uniform draw among the tied ones."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    similarity = unit @ unit.T
    rates = []
    for i in range(len(labels)):
        others = np.array([j for j in range(len(labels)) if j != i])
        best = similarity[i, others].max()
        tied = others[similarity[i, others] >= best - 1e-6]
        rates.append(np.mean([labels[j] == labels[i] for j in tied]))
    return float(np.mean(rates))


def sense_rates(embedder: elmo_model.ElmoEmbedder, word: str) -> list[float]:
    """Per layer, the same-sense neighbour rate of ``word``'s occurrences."""
    sentences, labels, positions = [], [], []
    for sense, snippets in SENSES[word].items():
        for snippet in snippets:
            tokens = snippet.split()
            assert tokens.count(word) == 1, (word, snippet)
            sentences.append(tokens)
            labels.append(sense)
            positions.append(tokens.index(word))
    layers = embedder.embed(sentences)
    n_layers = layers[0].shape[0]
    return [same_sense_rate(np.stack([out[k, p] for out, p in zip(layers, positions,
                                                                  strict=True)]), labels)
            for k in range(n_layers)]


def test_snippets_come_from_the_training_text() -> None:
    """Each snippet's words (minus the tokenizer's spacing) occur in a line of the training
    corpora; the lines, with their ``file:line`` in ``../shared/corpora`` (MODEL_CARD.md),
    are kept in ``tests/fixtures`` so the check needs nothing outside the repository."""
    from pipeline.tokenize import get_tokenizer

    words = get_tokenizer("elmo-store-words")
    records = [json.loads(line) for line in SNIPPET_SOURCES.read_text(encoding="utf-8")
               .splitlines()]
    source_of = {r["snippet"]: r for r in records}
    snippets = [s for senses in SENSES.values() for group in senses.values() for s in group]
    assert sorted(source_of) == sorted(snippets)
    for snippet in snippets:
        record = source_of[snippet]
        assert record["source"].split(":")[0] in CORPUS_FILES, record["source"]
        tokens = [t.text for t in words.tokenize(record["line"])]
        assert snippet in " ".join(tokens), record["source"]


def test_top_layer_neighbours_share_sense_more_than_layer_0(
        embedder: elmo_model.ElmoEmbedder) -> None:
    rates = {word: sense_rates(embedder, word) for word in SENSES}
    layer0 = np.mean([r[0] for r in rates.values()])
    top = np.mean([r[-1] for r in rates.values()])
    report = json.dumps({w: [round(x, 2) for x in r] for w, r in rates.items()})
    assert layer0 == pytest.approx(5 / 11, abs=1e-6), report  # context free: a coin toss
    assert top >= 0.85, report
    assert all(r[-1] > r[0] for r in rates.values()), report
    # An untrained LSTM of the same shape also mixes in the neighbouring words, and gets
    # part of the way (0.65 when measured); training must add clearly more.
    torch.manual_seed(0)
    untrained = elmo_model.ElmoEmbedder(elmo_model.BiLM(embedder.config).eval(), device="cpu")
    untrained_top = np.mean([sense_rates(untrained, word)[-1] for word in SENSES])
    assert top > untrained_top + 0.1, (report, untrained_top)


def test_default_model_fits_its_budget() -> None:
    size = sum(p.stat().st_size for p in MODEL_DIR.glob("weights.*"))
    assert size <= 25_000_000
    assert (MODEL_DIR / "MODEL_CARD.md").is_file()
    assert (MODEL_DIR / "warm_state.safetensors").is_file()
