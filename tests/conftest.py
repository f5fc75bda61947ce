"""Shared test fixtures. ``../shared`` holds the ELMo conformance fixture and corpora."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def require_shared(*parts: str) -> Path:
    """Path under ``../shared``; skip when a user's clone lacks it, fail under CI."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        message = f"{path} is missing (the ../shared fixtures sit beside the checkout)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def elmo_fixture_dir() -> Path:
    """``../shared/fixtures/elmo``: small bilm-tf weights and the original outputs."""
    return require_shared("fixtures", "elmo")


@pytest.fixture(scope="session")
def corpora_dir() -> Path:
    return require_shared("corpora")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random-weights model (options.json + weights.safetensors), no ../shared needed."""
    import torch

    from elmo_model import BiLM, BiLMConfig, save_model_dir

    torch.manual_seed(0)
    config = BiLMConfig(n_layers=2, lstm_dim=32, projection_dim=8, char_embedding_dim=4,
                        filters=((1, 4), (2, 8), (3, 8)), n_highway=1)
    return save_model_dir(BiLM(config), tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Two torch threads on a shared 2-core machine run many times slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
