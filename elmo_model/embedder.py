"""Sentences in, all biLM layers out: state modes, token cache, batching, device, precision.

Two state modes:

* ``stateless`` (default): every sentence starts from the same initial LSTM state
  (zeros, or the model's stored warm state), so a sentence's vectors do not depend on
  what else is in the batch, on padding, order or shard.
* ``stateful``: bilm-tf's behaviour, to reproduce original outputs. One ``embed`` call
  is one batch, and row r of a call starts from the state row r of the previous call
  ended in (per direction, after that row's last token).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import nullcontext
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from elmo_model.char_ids import BOS_TOKEN, EOS_TOKEN, token_char_ids
from elmo_model.device_copy import HostBatch, HostCopier, Int8Layers, PendingInt8
from elmo_model.errors import ElmoUserError, SettingError
from elmo_model.lstm_steps import choose_step
from elmo_model.model import BiLM, BiLMConfig, LstmState, LstmStep, PackPlan, reference_step
from elmo_model.pack_plan import DistinctInput, packed_input, stateless_batches
from elmo_model.packed_runner import CanonicalLayers, PackedLayers, PackedRunner
from elmo_model.steps.onednn import threads_for_call

if TYPE_CHECKING:
    from elmo_model.quantize import TypeQuantizer

StateMode = Literal["stateless", "stateful"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def select_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when a GPU is visible, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SettingError("device", lambda name: (
            f"device {device!r} asked for, but no CUDA GPU is visible; use {name('device')} "
            "cpu"))
    if device != "cpu" and not device.startswith("cuda"):
        raise ElmoUserError(f"unknown device {device!r}; use auto, cpu or cuda[:N]")
    return torch.device(device)


def fresh_token_vectors(model: BiLM, tokens: list[str], device: torch.device,
                        step: LstmStep = reference_step) -> torch.Tensor:
    """The char CNN's float32 vectors for ``tokens``, ``[len(tokens), P]``, no cache;
    ``step`` may run its matmuls (``LstmStep.char_cnn_linears``)."""
    ids = np.stack([token_char_ids(t, model.config.max_chars) for t in tokens])
    return model.token_embedding(torch.from_numpy(ids).to(device), step).float()


class TokenCache:
    """LRU of context-free token vectors (char CNN + highway + projection) by token string.

    On running text most tokens repeat, and the char CNN is a fifth of the biLM's FLOPs.
    The vectors live in one ``[capacity, P]`` table, filled as tokens come (``torch.empty``
    touches no memory before): a slot per token string, reused when its token is dropped,
    so the cache holds at most ``capacity`` vectors and ``max_bytes`` bytes whatever the
    corpus, and no tensor per token.
    """

    def __init__(self, capacity: int, max_bytes: int = 64 << 20) -> None:
        if capacity < 1 or max_bytes < 1:
            raise ValueError("a token cache needs a capacity and max_bytes of at least 1")
        self.capacity, self.max_bytes = capacity, max_bytes
        self._slots: OrderedDict[str, int] = OrderedDict()  # token -> row of _table, LRU first
        self._table: torch.Tensor | None = None  # [capacity, P] float32, made at first use
        # the device the table was asked for: a table made for torch.device("cuda") lives
        # on "cuda:0", which compares unequal to it and so would be rebuilt at every call
        self._device: torch.device | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._slots)

    def _table_for(self, width: int, device: torch.device) -> torch.Tensor:
        if self._table is None or self._table.shape[1] != width or self._device != device:
            self.capacity = max(1, min(self.capacity, self.max_bytes // (4 * width)))
            self._table = torch.empty((self.capacity, width), dtype=torch.float32, device=device)
            self._device = device
            self._slots.clear()
        return self._table

    def lookup(self, model: BiLM, tokens: list[str], device: torch.device,
               step: LstmStep = reference_step, out: torch.Tensor | None = None) -> torch.Tensor:
        """Vectors for ``tokens`` in order, ``[len(tokens), P]`` (into ``out`` when given);
        computes only the misses (with ``step``'s char CNN matmuls)."""
        unique = list(dict.fromkeys(tokens))
        table = self._table_for(model.config.projection_dim, device)
        missing = [t for t in unique if t not in self._slots]
        self.hits += len(unique) - len(missing)
        self.misses += len(missing)
        if len(unique) > self.capacity:
            return self._lookup_beyond_capacity(model, unique, missing, tokens, step, out)
        for token in unique:  # this call's hits are the newest: never dropped below
            if token in self._slots:
                self._slots.move_to_end(token)
        if missing:
            slots = []
            for token in missing:
                if len(self._slots) < self.capacity:
                    slot = len(self._slots)
                else:
                    _, slot = self._slots.popitem(last=False)
                self._slots[token] = slot
                slots.append(slot)
            table[torch.tensor(slots, device=device)] = fresh_token_vectors(
                model, missing, device, step)
        return _gather(table, self._slots, tokens, out)

    def _lookup_beyond_capacity(self, model: BiLM, unique: list[str], missing: list[str],
                                tokens: list[str], step: LstmStep,
                                out: torch.Tensor | None) -> torch.Tensor:
        """``lookup`` when a call has more distinct tokens than the cache has slots: its
        vectors gathered in a table of their own; the cache keeps the last ``capacity``."""
        assert self._table is not None
        vectors = self._table.new_empty(len(unique), self._table.shape[1])
        position = {t: i for i, t in enumerate(unique)}
        if missing:
            rows = torch.tensor([position[t] for t in missing], device=vectors.device)
            vectors[rows] = fresh_token_vectors(model, missing, vectors.device, step)
        known = [t for t in unique if t in self._slots]
        if known:
            rows = torch.tensor([position[t] for t in known], device=vectors.device)
            slots = torch.tensor([self._slots[t] for t in known], device=vectors.device)
            vectors[rows] = self._table[slots]
        kept = unique[-self.capacity:]
        self._slots = OrderedDict((t, slot) for slot, t in enumerate(kept))
        self._table[:len(kept)] = vectors[len(unique) - len(kept):]
        return _gather(vectors, position, tokens, out)


def _row_numbers(tokens: list[str], row_of: dict[str, int], device: torch.device
                 ) -> torch.Tensor:
    """``[row_of[t] for t in tokens]`` as an int64 tensor: through numpy, a quarter of
    ``torch.tensor``'s cost on a list of ints (~270 ns a token)."""
    rows = np.fromiter(map(row_of.__getitem__, tokens), np.int64, len(tokens))
    return torch.from_numpy(rows).to(device)


def _gather(table: torch.Tensor, row_of: dict[str, int], tokens: list[str],
            out: torch.Tensor | None) -> torch.Tensor:
    """``table``'s rows of ``tokens`` in order, ``[len(tokens), P]``, into ``out`` if given."""
    rows = _row_numbers(tokens, row_of, table.device)
    if out is None:
        return table.index_select(0, rows)
    return torch.index_select(table, 0, rows, out=out)


class Workspace:
    """Float32 buffers an embedder reuses from batch to batch, by name, grown on demand:
    a fresh ``[2, N, P]`` per layer and batch would be new pages every time (the workers fix
    glibc's mmap threshold, so every large block is a fresh mapping). Only what does not
    leave a call lives here: the token vectors, the packed LSTM input and outputs."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        size = int(np.prod(shape))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(size, dtype=torch.float32, device=self.device)
            self._buffers[name] = buffer
        return buffer[:size].view(shape)


def expand_state(state: LstmState | None, batch_size: int) -> LstmState | None:
    """One sequence's state, per layer ``(h [2, P], c [2, D])``, repeated for every row of
    a batch: ``(h [2, B, P], c [2, B, D])``. None (zeros) stays None."""
    if state is None:
        return None
    return [(h[:, None].expand(-1, batch_size, -1).contiguous(),
             c[:, None].expand(-1, batch_size, -1).contiguous()) for h, c in state]


class ElmoEmbedder:
    """A loaded biLM ready to embed tokenized sentences.

    ``embed(sentences)`` returns, per sentence, a float32 array ``[L + 1, n_tokens, 2P]``:
    layer 0 the token layer (repeated for both directions), layer j ``[h_fwd_j; h_bwd_j]``.

    ``lstm_impl`` names the LSTM step (``lstm_steps.STEP_NAMES``), chosen once here for
    the device and dtype: the step object is ``step``, and ``lstm_step`` is ``(name, one-line
    reason)``, e.g. why not the fused one.
    """

    def __init__(
        self,
        model: BiLM,
        mode: StateMode = "stateless",
        device: str = "auto",
        dtype: str = "float32",
        cache_size: int = 100_000,
        max_batch_tokens: int = 4096,
        warm_state: LstmState | None = None,
        fingerprint: str | None = None,
        lstm_impl: str = "auto",
    ) -> None:
        if mode not in ("stateless", "stateful"):
            raise ElmoUserError(f"unknown state mode {mode!r}; use stateless or stateful")
        if dtype not in _DTYPES:
            raise ElmoUserError(f"unknown dtype {dtype!r}; use one of {', '.join(_DTYPES)}")
        if max_batch_tokens < 1:
            raise ElmoUserError("max_batch_tokens must be at least 1")
        self.device = select_device(device)
        if dtype == "float16" and self.device.type != "cuda":
            raise ElmoUserError("float16 compute needs a CUDA device; on the CPU use bfloat16")
        self.model = model.to(self.device).eval()
        self.lstm_impl = lstm_impl
        chosen = choose_step(lstm_impl, self.device, _DTYPES[dtype])
        self.step: LstmStep = chosen.step
        self.lstm_step: tuple[str, str] = (chosen.name, chosen.reason)
        self.mode: StateMode = mode
        self.dtype = dtype
        self.max_batch_tokens = max_batch_tokens
        self.fingerprint = fingerprint
        self.cache = TokenCache(cache_size) if cache_size > 0 else None
        # [L] of (h [2, P], c [2, D]): the state every stateless sentence starts from.
        self.warm_state = (
            [(h.to(self.device), c.to(self.device)) for h, c in warm_state] if warm_state else None
        )
        self.initial_state = "warm" if warm_state else "zeros"
        self._carried: LstmState | None = None  # stateful mode: per row, grown on demand
        self._copier = HostCopier(self.device)
        self._workspace = Workspace(self.device)
        self.call_lock = threading.Lock()  # the workspace serves one call at a time

    @property
    def config(self) -> BiLMConfig:
        return self.model.config

    def reset_state(self) -> None:
        """Forget the carried state (stateful mode): the next batch starts from zeros."""
        self._carried = None

    def autocast(self):
        if self.dtype == "float32":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=_DTYPES[self.dtype])

    def token_vectors(self, tokens: list[str]
                       ) -> tuple[list[str], torch.Tensor, torch.Tensor]:
        """The distinct tokens of ``tokens`` (in order of first occurrence), their vectors
        ``[U, P]`` (from the cache, in the workspace) and each token's row among them
        ``[N]``: the first LSTM layer projects each distinct token once."""
        distinct = list(dict.fromkeys(tokens))
        row_of = {token: row for row, token in enumerate(distinct)}
        rows = _row_numbers(tokens, row_of, self.device)
        if self.cache is None:
            return distinct, fresh_token_vectors(self.model, distinct, self.device,
                                                 self.step), rows
        out = self._workspace.get("tokens", (len(distinct), self.config.projection_dim))
        return distinct, self.cache.lookup(self.model, distinct, self.device, self.step,
                                           out), rows

    def start_state(self, batch_size: int) -> LstmState | None:
        if self.mode == "stateful":
            if self._carried is None:
                self._carried = self.model.zero_state(batch_size, self.device)
            if self._carried[0][0].shape[1] < batch_size:
                grown = self.model.zero_state(batch_size, self.device)
                for (h, c), (gh, gc) in zip(self._carried, grown, strict=True):
                    gh[:, : h.shape[1]], gc[:, : c.shape[1]] = h, c
                self._carried = grown
            return [(h[:, :batch_size], c[:, :batch_size]) for h, c in self._carried]
        return expand_state(self.warm_state, batch_size)

    def _batch_layers(self, sentences: list[list[str]], types: TypeQuantizer | None = None,
                      canonical: bool = True
                      ) -> tuple[torch.Tensor | None, list[torch.Tensor], PackPlan]:
        """Runs a batch (carrying the stateful mode's state). Returns its layers ``[L + 1,
        N, 2P]`` float32 on the device, sentence after sentence with their ``<S>`` and
        ``</S>`` rows (None when not ``canonical``); the packed layers ``[2, N, P]``, input
        first (``PackedRunner.run``'s ``buffers``: in the workspace, valid until the next
        batch; not ``canonical``: the last layer without its residual, which the caller
        adds, ``PackedLayers(last_residual=False)``); and the plan. With ``types`` layer 0 is
        left unwritten and its token vectors go to ``types`` instead (layer 0 per type)."""
        flat = [t for s in sentences for t in (BOS_TOKEN, *s, EOS_TOKEN)]
        plan = PackPlan.build(np.array([len(s) + 2 for s in sentences]), self.device)
        n_layers, width = self.config.n_layers, self.config.projection_dim
        with self.autocast():
            distinct, vectors, token_rows = self.token_vectors(flat)  # [U, P], [N]
            packed = [self._workspace.get(f"packed {j}", (2, plan.n_tokens, width))
                      for j in range(n_layers + 1)]
            # [L + 1, N, 2P]: layer 0 is [x; x]; the LSTM layers are written into the rest
            layers = (torch.empty((n_layers + 1, plan.n_tokens, 2 * width),
                                  dtype=torch.float32, device=vectors.device)
                      if canonical else None)
            # not canonical: the caller adds the last residual as it quantizes
            output = CanonicalLayers(layers[1:]) if layers is not None else PackedLayers(
                last_residual=False)
            _, final_state = PackedRunner(self.model, self.step).run(
                vectors, plan, packed, self.start_state(len(sentences)), token_rows, output)
        if self.mode == "stateful":
            assert self._carried is not None
            for (h, c), (fh, fc) in zip(self._carried, final_state, strict=True):
                h[:, : fh.shape[1]], c[:, : fc.shape[1]] = fh, fc
        if types is not None:
            types.add(distinct, vectors)
        elif layers is not None:
            layers[0, :, :width] = vectors[token_rows]
            layers[0, :, width:] = layers[0, :, :width]
        else:  # the packed input, layer 0 of each position (the runner left it unwritten)
            packed_input(DistinctInput(vectors, token_rows[plan.token_index]), packed[0])
        return layers, packed, plan

    def _run_batch(self, sentences: list[list[str]]) -> list[np.ndarray]:
        layers, _, _ = self._batch_layers(sentences)
        assert layers is not None
        array = layers.cpu().numpy()
        out, start = [], 0
        for sentence in sentences:
            n = len(sentence)
            out.append(array[:, start + 1 : start + 1 + n])  # drop <S> and </S>
            start += n + 2
        return out

    def _quantize_batch(self, sentences: list[list[str]], copier: HostCopier) -> HostBatch:
        """One batch's real-token rows quantized on the device (stored int8 rule), on
        their way to host memory (``copier``)."""
        from elmo_model.quantize import quantize_int8_torch  # imports pyarrow

        keep, start = [], 0
        for sentence in sentences:  # drop <S> and </S> on the device: fewer bytes to copy
            keep.append(np.arange(start + 1, start + 1 + len(sentence)))
            start += len(sentence) + 2
        # Sent before the batch's kernels are queued, without waiting for them.
        rows = copier.to_device(np.concatenate(keep))
        layers, _, _ = self._batch_layers(sentences)
        assert layers is not None
        values, scales = quantize_int8_torch(layers.index_select(1, rows))
        return copier.to_host(values, scales)

    def _quantize_on_cpu(self, sentences: list[list[str]], types: TypeQuantizer | None
                         ) -> PendingInt8:
        """``submit_int8`` on the CPU: each batch quantized straight from its packed
        layers into one block for the call, every sentence's rows in call order; with
        ``types`` layers 1..L, layer 0 per token type into ``types``."""
        from elmo_model.quantize import quantize_int8_packed  # imports pyarrow

        starts = np.cumsum([0, *(len(s) for s in sentences)])
        first = 0 if types is None else 1
        shape = (self.config.n_layers + 1 - first, int(starts[-1]))
        residual = self.config.has_residual(self.config.n_layers - 1)  # added as quantized
        # numpy asks for transparent huge pages on large arrays; torch.empty's fresh block
        # faulted in 4 KiB pages cost ~0.7 us a token more at 3 x 1024
        values = np.empty((*shape, self.config.output_dim), np.int8)
        scales = np.empty(shape, np.float32)
        for batch in self._batches(sentences):
            _, packed, plan = self._batch_layers([sentences[i] for i in batch], types,
                                                 canonical=False)
            quantize_int8_packed(packed[first:], plan, [len(sentences[i]) for i in batch],
                                 values, scales, [int(starts[i]) for i in batch],
                                 packed[-2] if residual else None)
        where = [(0, int(starts[i]), len(s)) for i, s in enumerate(sentences)]
        return PendingInt8([HostBatch(torch.from_numpy(values), torch.from_numpy(scales))],
                           where, None if types is None else types.result())

    def _batches(self, sentences: list[list[str]]) -> list[list[int]]:
        """Sentence indices per model batch: one batch in stateful mode; stateless results
        do not depend on grouping, so there by a token budget over length-sorted
        sentences (similar lengths together, little padding anywhere)."""
        if not isinstance(sentences, list) or any(not isinstance(s, list) for s in sentences):
            raise ElmoUserError("embed() takes a list of sentences, each a list of token strings")
        if self.mode == "stateful":
            return [list(range(len(sentences)))] if sentences else []
        rows = [len(sentence) + 2 for sentence in sentences]  # with <S> and </S>
        return stateless_batches(rows, self.max_batch_tokens)

    @torch.inference_mode()
    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """All layers for each tokenized sentence, ``[L + 1, n, 2P]`` float32 each."""
        results: list[np.ndarray | None] = [None] * len(sentences)
        batches = self._batches(sentences)  # refuses a malformed argument before it is read
        with self.call_lock, threads_for_call(self.device, sum(len(s) + 2 for s in sentences)):
            for batch in batches:
                for i, vectors in zip(batch, self._run_batch([sentences[i] for i in batch]),
                                      strict=True):
                    results[i] = vectors
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def submit_int8(self, sentences: list[list[str]], layer_0_per_type: bool = False
                    ) -> PendingInt8:
        """Start ``embed_int8``: every batch is quantized where it was computed and its
        copy to the host queued (on a GPU it overlaps the next batch); returns without
        waiting for the copies, so the caller can start the next call.
        ``layer_0_per_type``: on the CPU, layer 0 comes once per distinct token
        (``Int8Layers.layer_0``), the rows hold layers 1..L: what a writer that stores
        layer 0 per type needs, for a third less quantizing; elsewhere it is ignored."""
        from elmo_model.quantize import TypeQuantizer  # imports pyarrow: only when asked

        if not self._copier.cuda:
            with self.call_lock:
                return self._quantize_on_cpu(sentences,
                                             TypeQuantizer() if layer_0_per_type else None)
        host: list[HostBatch] = []
        where: list[tuple[int, int, int]] = [(0, 0, 0)] * len(sentences)
        with self.call_lock:
            for batch in self._batches(sentences):
                start = 0
                for i in batch:
                    where[i] = (len(host), start, len(sentences[i]))
                    start += len(sentences[i])
                host.append(self._quantize_batch([sentences[i] for i in batch], self._copier))
        return PendingInt8(host, where)

    def embed_int8(self, sentences: list[list[str]]) -> Int8Layers:
        """``embed``'s layers as the int8 storage stores them (``schemas.layers``: int8
        values and a float32 scale per vector), bytewise what quantizing ``embed``'s
        float32 output gives, but quantized on the model's device."""
        return self.submit_int8(sentences).result()


# A fixed, neutral warm-up text of our own. The original models were trained with state
# carried across batches, so a zero state is out of distribution for them; running this
# text once gives a "typical" state to start every stateless sentence from.
WARM_UP_TEXT = (
    "The river ran past the old mill , and the town grew up along its banks .",
    "In the morning the market opened early and people came from the villages .",
    "She wrote a letter to her brother , who had moved to the city the year before .",
    "Nobody knew how long the storm would last , so the ships stayed in the harbour .",
    "He read the report twice before he signed it and sent it back to the office .",
    "The children played in the garden while their parents talked about the harvest .",
)


@torch.inference_mode()
def compute_warm_state(model: BiLM, sentences: tuple[str, ...] = WARM_UP_TEXT) -> LstmState:
    """The state after reading ``sentences`` one after another with carried state.

    Returns per layer ``(h [2, P], c [2, D])`` for direction 0 (forward) and 1 (backward).
    """
    embedder = ElmoEmbedder(model, mode="stateful", device=str(next(model.parameters()).device),
                            cache_size=0)
    for sentence in sentences:
        embedder.embed([sentence.split()])
    assert embedder._carried is not None
    return [(h[:, 0].clone(), c[:, 0].clone()) for h, c in embedder._carried]
