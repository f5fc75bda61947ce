"""User SQL in a process of its own, under a memory cap: no query can take the server down.

DuckDB's ``memory_limit`` covers its buffer manager, not everything a query computes: a
vector of 2,048 rows of huge strings or lists (``repeat``, ``string_agg``, ``list`` over a
range, sizes computed in the query) is allocated beside it. One such query took a server
from 0.44 to 2.9 GB, and wider rows went to 18 GB. So the server's ``GuardedSql`` runs in
a worker process (``python -m pipeline.lookup.serve.sql_worker``), started with the server
and kept warm. Once it has opened the dataset it caps its own data (``RLIMIT_DATA``: the
heap and every private writable mapping, which is where DuckDB, Arrow and Python allocate)
at its idle size plus ``--sql-memory``. Measured on an idle worker: 1.48 GB of address
space, 0.29 GB of data, 0.17 GB resident; ``RLIMIT_AS`` would count the libraries' code
and reservations that no query can fill, so a cap on it says less about what a query may
hold (in probes both stopped DuckDB's and Arrow's allocations alike). A query that needs
more fails inside the worker, whose DuckDB and Arrow turn the failed allocation into an
error, and gets one line naming the limit; the worker then exits, so that what its
allocator kept goes back to the system, and a new one starts. A query that runs past its
time limit and does not stop when interrupted, or a worker that dies, is killed and
replaced the same way. The server's own queries (row counts, a sentence's neighbours) go
to the worker too: the server holds no DuckDB.

The worker writes each answer's JSON itself and refuses one over
``SQL_MAX_RESPONSE_BYTES``: of a /sql answer, the server holds only those bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from elmo_model.errors import ElmoUserError
from pipeline.lookup.serve.limits import (
    SQL_KILL_GRACE_S,
    SQL_MAX_RESPONSE_BYTES,
    SQL_MEMORY_MB,
    SQL_TIMEOUT_S,
    SQL_WORKER_START_S,
)

# How long a query's file checks may take before it starts (a changed file is read whole
# again: about 1-10 s/GB); the time limit counts from the start.
CHECK_WAIT_S = 600.0


@dataclass(frozen=True)
class WorkerSettings:
    dataset: str
    timeout_s: float = SQL_TIMEOUT_S
    memory_mb: int = SQL_MEMORY_MB
    check_files: bool = True


def json_ready(value: Any) -> Any:
    """JSON-ready: NaN and infinities become null, types JSON lacks become text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return str(value)


def json_bytes(value: Any) -> bytes:
    """As Starlette's ``JSONResponse`` renders ``value``."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


class SqlWorker:
    """The server's side: ``run`` (a user's query: its answer's JSON bytes) and
    ``execute`` (the server's own: rows), one at a time, each in the worker."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.ready = False
        self.served = False  # a worker was ready once: the server has started
        self._start()

    def wait_ready(self) -> None:
        """Until the worker has opened the dataset (the server's start: a dataset it
        cannot open stops the server with the worker's line)."""
        with self.lock:
            self._ensure_ready()

    def run(self, query: str, params: dict[str, Any] | None = None) -> bytes:
        reply = self._call(("run", query, params), user=True)
        return reply[1]

    def execute(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The server's own parameterised queries (no guard: the text is ours)."""
        return self._call(("execute", query, params), user=False)[1]

    def close(self) -> None:
        with self.lock:
            self._stop()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        # The worker imports what this process imports, from where it does. Arrow
        # allocates with malloc there: its default pool (mimalloc) reserves a 1 GB arena
        # at the first allocation, which RLIMIT_DATA counts as used and a query could
        # then fill past the cap. numpy needs no threads there (each reserves a stack).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   ARROW_DEFAULT_MEMORY_POOL="system", OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            env=env, stdin=subprocess.DEVNULL)  # its stderr is the server's log
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(self.settings)
        self.ready = False

    def _stop(self) -> int | None:
        """End the worker (killed: nothing of it needs to finish); its exit status."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.kill()
        code = self.process.wait()
        self.process, self.ready = None, False
        return code

    def _restart(self) -> int | None:
        code = self._stop()
        self._start()  # it opens the dataset while the next request is on its way
        return code

    def _ensure_ready(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self._restart()
        if self.ready:
            return
        assert self.conn is not None
        try:
            message = self.conn.recv() if self.conn.poll(SQL_WORKER_START_S) else None
        except (EOFError, OSError):
            message = None
        if message is None:
            code = self._stop()
            raise _unavailable(f"the /sql worker did not start ({_how(code)}); see the "
                               "server's log")
        if message[0] == "failed":
            self._stop()
            if not self.served:  # the server's start: its one line, paths and all
                raise ElmoUserError(message[1])
            print(f"elmo serve: the /sql worker: {message[1]}", file=sys.stderr, flush=True)
            raise _unavailable("the /sql worker could not open the dataset again; see the "
                               "server's log")
        self.ready = self.served = True

    def _call(self, request: tuple[Any, ...], user: bool) -> tuple[Any, ...]:
        with self.lock:
            self._ensure_ready()
            assert self.conn is not None
            deadline_s = self.settings.timeout_s + SQL_KILL_GRACE_S
            try:
                self.conn.send(request)
                # First "started" (its checks done), then the answer within the limit.
                reply = self.conn.recv() if self.conn.poll(CHECK_WAIT_S) else None
                if reply is not None and reply[0] == "started":
                    reply = self.conn.recv() if self.conn.poll(deadline_s) else None
            except (EOFError, OSError):
                code = self._restart()
                bound = f"this server gives /sql {self.settings.memory_mb:,} MB of memory " \
                    "(--sql-memory); " if user else ""
                raise _unavailable(f"the query stopped the /sql worker ({_how(code)}); "
                                   f"{bound}the worker was started again") from None
            if reply is None:  # it did not stop when interrupted
                self._restart()
                raise ElmoUserError(f"the query ran longer than {self.settings.timeout_s:g} "
                                    "s and was stopped; add a LIMIT or a WHERE")
            if reply[0] != "error":
                return reply
            kind, message = reply[1], reply[2]
            if kind == "memory":
                self._restart()  # the worker exits after a breach: its memory goes back
            if kind == "internal":
                self._restart()
                raise _unavailable(message)
            raise ElmoUserError(message)


def _unavailable(message: str) -> Exception:
    from starlette.exceptions import HTTPException

    return HTTPException(503, message)


def _how(code: int | None) -> str:
    if code is None:
        return "no answer"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"ended by {signal.Signals(-code).name}"
    return f"exit status {code}"


# --------------------------------------------------------------------------- the worker


def data_mb() -> float:
    """This process's data size (VmData: what RLIMIT_DATA counts), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _open(settings: WorkerSettings) -> Any:
    from pipeline.lookup.serve.sql_guard import GuardedSql
    from schemas.dataset import open_dataset

    ds = open_dataset(settings.dataset)
    return GuardedSql(ds, settings.timeout_s, check_files=settings.check_files,
                      memory_mb=settings.memory_mb)


def _answer(guarded: Any, request: tuple[Any, ...], conn: Connection
            ) -> tuple[tuple[Any, ...], bool]:
    """``(reply, whether to exit after it)``."""
    from pipeline.lookup.serve.sql_guard import SqlMemoryError, is_out_of_memory, memory_message

    kind, query, params = request
    try:
        if kind == "execute":
            conn.send(("started",))
            return ("rows", guarded.execute(query, params)), False
        result = guarded.run(query, params, started=lambda: conn.send(("started",)))
        body = json_bytes(json_ready({"columns": result.columns, "rows": result.rows,
                                      "truncated": result.truncated}))
        if len(body) > SQL_MAX_RESPONSE_BYTES:
            raise ElmoUserError(f"the answer is over {SQL_MAX_RESPONSE_BYTES >> 20} MB of "
                                "JSON; select fewer columns or rows")
        return ("json", body), False
    except SqlMemoryError as error:
        return ("error", "memory", str(error)), True
    except ElmoUserError as error:
        return ("error", "user", str(error)), False
    except Exception as error:
        if is_out_of_memory(error):
            return ("error", "memory", memory_message(guarded.memory_mb)), True
        traceback.print_exc(file=sys.stderr)  # for the operator
        return ("error", "internal", f"the /sql worker failed ({type(error).__name__}); "
                "see the server's log; it was started again"), True


def main(fd: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's; then EOF here
    conn = Connection(fd)
    settings: WorkerSettings = conn.recv()
    try:
        guarded = _open(settings)
    except ElmoUserError as error:
        conn.send(("failed", str(error)))
        return 0
    except Exception as error:
        traceback.print_exc(file=sys.stderr)
        conn.send(("failed", f"the /sql worker could not open {settings.dataset} "
                             f"({type(error).__name__}: {error})"))
        return 1
    idle = data_mb()
    cap = int((idle + settings.memory_mb) * (1 << 20))
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    conn.send(("ready", idle))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return 0  # the server is gone
        reply, leave = _answer(guarded, request, conn)
        try:
            conn.send(reply)
        except OSError:
            return 0
        if leave:
            return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
