"""Shared by the ``elmo serve`` tests (no tests here): the small dataset and index they
serve, built once per test session, and real server processes on free loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import REPO

CORPUS = REPO / "examples" / "corpus"
MODEL = REPO / "models" / "default"
START_TIMEOUT_S = 120


@dataclass
class Served:
    dataset: Path
    index: Path


def served_data(factory: pytest.TempPathFactory) -> Served:
    """examples/corpus embedded with the bundled model and indexed (top mix, flat): built
    by the first test module that asks, reused by the others of the session."""
    from pipeline.lookup.index.build import build_index
    from pipeline.write.embed import EmbedConfig, ModelSpec, embed_corpus

    root = factory.getbasetemp() / "serve_data"
    root.mkdir(exist_ok=True)
    data = Served(root / "dataset", root / "index")
    if not (data.index / "_elmo_index.json").exists():
        embed_corpus(EmbedConfig(sources=[str(CORPUS / "*.txt")], out=str(data.dataset),
                                 model=ModelSpec.resolve(str(MODEL)), progress=False,
                                 executor="local"))
        build_index(str(data.dataset), "top", str(data.index), kind="flat", compact=False)
    return data


def served_compact_index(factory: pytest.TempPathFactory) -> Path:
    """``served_data``'s dataset in a compact index (in shards, one a dataset file): built
    by the first test that asks, reused by the others of the session."""
    from pipeline.lookup.index.build import build_index

    data = served_data(factory)
    out = data.index.parent / "compact.lance"
    if not (out / "_elmo_index.json").exists():
        build_index(str(data.dataset), "top", str(out), compact=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_env() -> dict[str, str]:
    env = dict(os.environ)
    # This tree first: the venv's editable install may point at another checkout.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.pop("ELMO_SERVE_TOKEN", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def elmo_serve_argv(data: Served, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "serve", str(data.dataset), "--index",
            str(data.index), "--port", str(port), *extra]


@contextmanager
def running_server(data: Served, *extra: str, log: Path,
                   headers: dict[str, str] | None = None) -> Iterator[str]:
    """``elmo serve`` in a subprocess; yields its base URL once ``/info`` answers."""
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen(elmo_serve_argv(data, port, *extra), cwd=REPO,
                                   env=serve_env(), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"elmo serve exited {process.returncode}: "
                                   f"{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/info", headers=headers, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"elmo serve did not answer: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
        assert process.poll() is None, f"the server died: {log.read_text()[-2000:]}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def server_pid(url: str) -> int:
    """The ``elmo serve`` process listening at ``url`` (found by its ``--port``)."""
    port = url.rsplit(":", 1)[1].encode()
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port:
            return int(proc.name)
    raise AssertionError(f"no server process at {url}")


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started, from any of its threads."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(found)


def memory_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's ``/proc/PID/status`` memory figure (VmRSS, VmHWM: its peak), in MB; 0
    once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    if f"{field}:" not in status:  # a zombie has no memory left
        return 0.0
    return int(status.split(f"{field}:")[1].split()[0]) / 1024

