"""The word softmax both LM directions share, its losses, and perplexity."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Softmax(nn.Module):
    """The word softmax both directions share: ``logits = h W^T + b``."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim).normal_(0, 1 / math.sqrt(dim)))
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 1024
            ) -> torch.Tensor:
        """Per-token negative log-likelihood under the full softmax, ``[N]``, in chunks so
        the ``[N, V]`` logits never exist at once."""
        parts = []
        for start in range(0, hidden.shape[0], chunk):
            logits = F.linear(hidden[start : start + chunk], self.weight, self.bias)
            parts.append(F.cross_entropy(logits.float(), targets[start : start + chunk],
                                         reduction="none"))
        return torch.cat(parts) if parts else hidden.new_zeros(0)

    def sampled_nll(self, hidden: torch.Tensor, targets: torch.Tensor, n_samples: int,
                    generator: torch.Generator) -> torch.Tensor:
        """Sampled softmax (Jean et al. 2015) with a log-uniform proposal shared by the batch.

        The vocabulary is sorted by frequency, so a Zipf-like proposal
        ``Q(k) = log((k + 2) / (k + 1)) / log(V + 1)`` fits it; each logit is corrected by
        ``log`` of its expected sample count, and negatives equal to the target are masked.
        ``generator`` is a CPU generator: the same seed draws the same negatives on any
        device, so a run resumed on another device continues the same sample sequence.
        """
        vocab_size = self.weight.shape[0]
        log_range = math.log(vocab_size + 1)
        uniform = torch.rand(n_samples, generator=generator).to(hidden.device)
        negatives = (torch.exp(uniform * log_range).long() - 1).clamp_(0, vocab_size - 1)

        def log_expected(ids: torch.Tensor) -> torch.Tensor:
            k = ids.to(torch.float64)
            q = (torch.log(k + 2) - torch.log(k + 1)) / log_range
            return torch.log(q * n_samples).to(hidden.dtype)

        true_logits = (hidden * self.weight[targets]).sum(-1) + self.bias[targets]
        true_logits = true_logits - log_expected(targets)
        negative_logits = F.linear(hidden, self.weight[negatives], self.bias[negatives])
        negative_logits = negative_logits - log_expected(negatives)
        negative_logits = negative_logits.masked_fill(targets[:, None] == negatives[None], -1e9)
        logits = torch.cat([true_logits[:, None], negative_logits], dim=1)
        return torch.logsumexp(logits.float(), dim=1) - logits[:, 0].float()

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor, n_negative_samples: int,
             generator: torch.Generator) -> torch.Tensor:
        """Mean training NLL: sampled when fewer negatives than words are asked for, else
        the full softmax."""
        if 0 < n_negative_samples < self.weight.shape[0]:
            return self.sampled_nll(hidden, targets, n_negative_samples, generator).mean()
        return self.nll(hidden, targets, chunk=hidden.shape[0]).mean()


def perplexity(nll_sum: float, n_tokens: int) -> float:
    """``exp`` of the mean negative log-likelihood per predicted token."""
    if n_tokens <= 0:
        return float("nan")
    return math.exp(nll_sum / n_tokens)


def carry_rows(softmax: dict[str, torch.Tensor], old_words: list[str], new_words: list[str],
               seed: int) -> dict[str, torch.Tensor]:
    """A softmax over ``new_words`` that keeps the trained row and bias of every word
    ``old_words`` shares with it. A new word gets a fresh row, and the bias of the rarest
    tenth of the old words (its median), since a word the old vocabulary left out was rare
    in the old corpus; a zero bias would have it predicted far too often at the start."""
    weight, bias = softmax["weight"].float(), softmax["bias"].float()
    dim = weight.shape[1]
    generator = torch.Generator().manual_seed(seed)
    new_weight = torch.empty(len(new_words), dim).normal_(0, 1 / math.sqrt(dim),
                                                          generator=generator)
    rare = bias[-max(1, len(old_words) // 10):]
    new_bias = torch.full((len(new_words),), float(rare.median()))
    old_ids = {word: i for i, word in enumerate(old_words)}
    kept = [(i, old_ids[w]) for i, w in enumerate(new_words) if w in old_ids]
    if kept:
        new_ids, from_ids = (torch.tensor(x) for x in zip(*kept, strict=True))
        new_weight[new_ids], new_bias[new_ids] = weight[from_ids], bias[from_ids]
    return {"weight": new_weight, "bias": new_bias}
