"""Shared test fixtures. Everything a test reads lives in the repository (``tests/fixtures``,
``data/sample``, ``models/default``): a clean clone anywhere runs the suite with nothing
skipped. ``../shared`` is for benchmarks and training only; no test reads it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO

from schemas.user_cache import CACHE_ENV

# What `elmo sql` and `elmo serve` remember of verified files goes to a scratch folder
# (servers started by tests inherit it), not to the user's ~/.cache.
os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="elmo-test-cache-")
atexit.register(shutil.rmtree, os.environ[CACHE_ENV], True)


@pytest.fixture(scope="session")
def elmo_fixture_dir() -> Path:
    """``tests/fixtures/elmo``: small bilm-tf weights and the outputs the original produced
    (AllenNLP test fixtures, Apache-2.0; see its README.md and NOTICE)."""
    return FIXTURES / "elmo"


@pytest.fixture(scope="session")
def corpora_dir() -> Path:
    """``data/sample``: the bundled public-domain text, one paragraph per line (about 86k
    words in five ``*.txt`` files), for tests that need real prose."""
    return REPO / "data" / "sample"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small random-weights model (options.json + weights.safetensors)."""
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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skipped test fails the run: a clean clone anywhere must run every test (issue 13),
    so a skip means something the suite needs is missing."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == pytest.ExitCode.OK:
        reporter.write_sep("=", f"{len(skipped)} skipped: every test must run (reasons: "
                           "pytest -rs)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A local S3 (moto's server on loopback) for the tests that read and write ``s3://``."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
