"""The LSTM steps by name, and the one place that chooses between them.

    reference  the recurrence written out, out of place (``model.ReferenceStep``): what
               training and autograd run, and what every other step is tested against
    torch      the same in torch, in place in buffers allocated once per call
               (``torch_step.py``): any device
    onednn     the in-place step with oneDNN matmuls on weights reordered once, and the
               char CNN's highway and projection through them too (``onednn.py``): CPU
    fused      two fused Triton kernels per step, the time loop captured as CUDA graphs
               where the batch pads well (``fused_graphs.py``, ``fused_lstm.py``): CUDA
    auto       fused on CUDA when triton imports; onednn on the CPU when oneDNN runs the
               dtype; else torch

An embedder chooses once, when it is built (``choose_step``), and passes the step to the
model at each call. All steps take the same arguments (``model.LstmStep``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass

import torch

from elmo_model.errors import ElmoUserError
from elmo_model.model import LstmStep, reference_step
from elmo_model.steps.onednn import OnednnStep, onednn_unavailable
from elmo_model.steps.torch_step import TorchStep

STEP_NAMES = ("auto", "reference", "torch", "onednn", "fused")


@dataclass(frozen=True)
class ChosenStep:
    name: str  # one of STEP_NAMES but auto
    step: LstmStep
    reason: str  # one line: why this step, e.g. why not the fused one


def fused_unavailable(device: torch.device | str) -> str | None:
    """Why the fused Triton step cannot run on ``device``; None when it can. On the CPU it
    runs only under Triton's interpreter (``TRITON_INTERPRET=1``), for tests."""
    device = torch.device(device)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "the fused Triton LSTM step is for CUDA devices"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'elmo-store[gpu]' for the fused step)"
    try:
        importlib.import_module("elmo_model.steps.fused_graphs")
    except Exception as error:  # a broken triton install must not stop the model
        return f"triton failed to import ({type(error).__name__}: {error})"
    return None


def _fused_step() -> LstmStep:
    from elmo_model.steps.fused_graphs import FusedStep  # imports triton: only when chosen

    return FusedStep()


def choose_step(name: str, device: torch.device | str,
                dtype: torch.dtype = torch.float32) -> ChosenStep:
    """The step ``name`` means for an embedder on ``device`` whose matmuls run in
    ``dtype``, with a one-line reason; an ElmoUserError when it cannot run there."""
    if name not in STEP_NAMES:
        raise ElmoUserError(f"unknown lstm_impl {name!r}; use one of {', '.join(STEP_NAMES)}")
    device = torch.device(device)
    if name == "reference":
        return ChosenStep("reference", reference_step, "set explicitly")
    if name == "torch":
        return ChosenStep("torch", TorchStep(), "set explicitly")
    if name in ("onednn", "auto") and device.type == "cpu":
        missing = onednn_unavailable(dtype)
        if missing is None:
            reason = ("set explicitly" if name == "onednn"
                      else "CPU: oneDNN matmuls on weights reordered once")
            return ChosenStep("onednn", OnednnStep(), reason)
    else:
        missing = fused_unavailable(device) if name != "onednn" else "it is for the CPU"
        if missing is None:
            reason = "set explicitly" if name == "fused" else "CUDA device and triton importable"
            return ChosenStep("fused", _fused_step(), reason)
    if name == "auto":
        return ChosenStep("torch", TorchStep(), missing)
    raise ElmoUserError(f"lstm_impl {name} cannot run on {device}: {missing}; use auto or torch")
