"""Train (or fine-tune) the biLM as bilm-tf does (Peters et al. 2018, section 3.1).

    forward stream  ──char CNN──> forward LSTM stack  ─┐
                                                        ├─ shared softmax over the word vocabulary
    backward stream ──char CNN──> backward LSTM stack ─┘   (forward predicts the next token,
                                                            backward the previous one)

One module per part, in the order a run uses them:

- ``config``: the training knobs (``TrainParams``), presets, reading options files
- ``start``: where a run starts: a new model, ``--init-from``, or a checkpoint to resume
- ``data``: lines cut into words, the held-out split, the streams' per-step windows
- ``lm_head``: the shared softmax, its full and sampled losses, perplexity
- ``evaluation``: held-out perplexity
- ``checkpoints``: save and resume (any device), ``load_trained``
- ``packaging``: ``--init-from`` models, and a shippable model directory from a checkpoint
- ``loop``: ``train``, the loop itself
"""

from elmo_model.training.checkpoints import load_trained
from elmo_model.training.loop import TrainResult, train
from elmo_model.training.packaging import package_model

__all__ = ["TrainResult", "load_trained", "package_model", "train"]
