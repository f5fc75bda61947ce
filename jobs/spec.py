"""Job specs: one TOML or YAML file per scheduled embedding job, validated strictly.

Every problem is reported with the file, the key (dotted, e.g. ``ray.num_gpus``) and the
reason, all problems at once, so a broken spec is fixed in one edit rather than one
error per run. Unknown keys are errors too: a misspelt ``delete_mising = true`` silently
ignored would be worse than a failed run.

Local paths without a URI scheme (source, output, model, ...) are resolved against the
spec file's directory, so a scheduler started from any working directory (cron, systemd,
a Kubernetes pod) reads the same files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError
from jobs.example_spec import EXAMPLE_SPEC
from pipeline.config import DEFAULT_ITEM_TOKENS

SPEC_SUFFIXES = (".toml", ".yaml", ".yml")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_MIX_RE = re.compile(r"^(top|average|layer:\d+|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")
_READ_FORMATS = ("auto", "text", "jsonl", "parquet")
_EXECUTORS = ("auto", "local", "ray")
__all__ = ["EXAMPLE_SPEC", "JobSpec", "RaySpec", "ReadSpec", "SpecError", "load_spec",
           "parse_spec"]



class SpecError(ElmoUserError):
    """A job spec that cannot be used; the message names the file, key and reason."""


@dataclass(frozen=True)
class ReadSpec:
    format: str = "auto"
    doc_per: str = "line"
    pretokenized: bool = False
    text_column: str = "text"
    id_column: str = "id"


@dataclass(frozen=True)
class RaySpec:
    address: str | None = None
    actors: int = 1
    num_cpus: float | None = None  # per actor
    num_gpus: float | None = None  # per actor; None: 1 when the cluster has GPUs
    executor: str = "auto"
    wait_for_resources: float = 0.0  # seconds to wait for an autoscaling cluster
    runtime_env: dict[str, Any] = field(default_factory=dict)  # for `elmo jobs submit`


@dataclass(frozen=True)
class JobSpec:
    path: str  # the spec file
    name: str
    sources: tuple[str, ...]
    output: str
    model: str | None = None
    options: str | None = None
    weights: str | None = None
    shards: int = 8  # at least this many work items per embedded file
    item_tokens: int = DEFAULT_ITEM_TOKENS  # target tokens per work item
    tokenizer: str | None = None  # None: the one the model declares
    dtype: str = "float16"
    device: str = "auto"
    compute_dtype: str = "float32"
    batch_tokens: int = 4096
    max_sentence_tokens: int = 256
    window_overlap: int = 32
    schedule: str | None = None
    timezone: str = "UTC"
    delete_missing: bool = False
    mixes: tuple[str, ...] = ()
    index_out: str | None = None
    hash_max_bytes: int = 64 << 20  # content-hash files up to this size ("when cheap")
    read: ReadSpec = field(default_factory=ReadSpec)
    ray: RaySpec = field(default_factory=RaySpec)
    storage_options: dict[str, Any] = field(default_factory=dict)

    def index_uri(self, mix: str) -> str:
        base = self.index_out or f"{self.output.rstrip('/')}/_index"
        return f"{base.rstrip('/')}/{mix.replace(':', '_')}"


# --------------------------------------------------------------------------- parsing


def _parse_file(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in SPEC_SUFFIXES:
        raise SpecError(f"{path}: unsupported spec format {suffix or '(no suffix)'!r}; "
                        f"use one of {', '.join(SPEC_SUFFIXES)}")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path}: job spec not found") from None
    except OSError as error:
        raise SpecError(f"{path}: cannot read job spec ({error.strerror})") from None
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise SpecError(f"{path}: not valid TOML ({error})") from None
    import yaml

    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SpecError(f"{path}: not valid YAML{at} ({reason})") from None


class _Checker:
    """Collects every problem of one spec; ``take_*`` pop known keys from a mapping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[str] = []

    def bad(self, key: str, reason: str) -> None:
        self.problems.append(f"{key}: {reason}")

    def _take(self, data: dict, key: str, prefix: str) -> tuple[str, Any]:
        return (f"{prefix}{key}", data.pop(key, None))

    def string(self, data: dict, key: str, prefix: str = "", *, required: bool = False,
               default: str | None = None, choices: tuple[str, ...] = ()) -> str | None:
        name, value = self._take(data, key, prefix)
        if value is None:
            if required:
                self.bad(name, "required key is missing")
            return default
        if not isinstance(value, str) or not value.strip():
            self.bad(name, f"must be a non-empty string, not {value!r}")
            return default
        if choices and value not in choices:
            self.bad(name, f"must be one of {', '.join(choices)}, not {value!r}")
            return default
        return value

    def integer(self, data: dict, key: str, default: int, minimum: int, prefix: str = "") -> int:
        name, value = self._take(data, key, prefix)
        if value is None:
            return default
        # bool is an int subclass in Python; `shards = true` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(name, f"must be an integer, not {value!r}")
            return default
        if value < minimum:
            self.bad(name, f"must be at least {minimum}, not {value}")
            return default
        return value

    def number(self, data: dict, key: str, prefix: str = "") -> float | None:
        name, value = self._take(data, key, prefix)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            self.bad(name, f"must be a number >= 0, not {value!r}")
            return None
        return float(value)

    def boolean(self, data: dict, key: str, default: bool, prefix: str = "") -> bool:
        name, value = self._take(data, key, prefix)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.bad(name, f"must be true or false, not {value!r}")
            return default
        return value

    def table(self, data: dict, key: str) -> dict:
        value = data.pop(key, None)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.bad(key, f"must be a table/mapping, not {type(value).__name__}")
            return {}
        return dict(value)

    def unknown(self, data: dict, known: tuple[str, ...], prefix: str = "") -> None:
        for key in sorted(data, key=str):
            hint = _close_match(str(key), known)
            self.bad(f"{prefix}{key}", "unknown key" + (f" (did you mean {hint!r}?)" if hint
                                                        else ""))


def _close_match(key: str, known: tuple[str, ...]) -> str | None:
    import difflib

    found = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return found[0] if found else None


_TOP_KEYS = ("name", "source", "output", "model", "options", "weights", "shards", "item_tokens",
             "tokenizer", "dtype",
             "device", "compute_dtype", "batch_tokens", "max_sentence_tokens", "window_overlap",
             "schedule", "timezone",
             "delete_missing", "mixes", "index_out", "hash_max_bytes", "read", "ray",
             "storage_options")
_READ_KEYS = ("format", "doc_per", "pretokenized", "text_column", "id_column")
_RAY_KEYS = ("address", "actors", "num_cpus", "num_gpus", "executor", "runtime_env",
             "wait_for_resources")


def _resolve(value: str, base: Path) -> str:
    """A path relative to the spec file; URIs (``scheme://``) are left alone."""
    if "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path))


def _check_cron(c: _Checker, expression: str | None, tz: str) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        c.bad("timezone", f"unknown time zone {tz!r} (use an IANA name such as 'UTC' or "
                          "'Europe/Berlin')")
    if expression is None:
        return
    from croniter import croniter

    if len(expression.split()) != 5 or not croniter.is_valid(expression):
        c.bad("schedule", f"not a valid 5-field cron expression: {expression!r} "
                          "(minute hour day-of-month month day-of-week, e.g. '0 3 * * *')")


def parse_spec(data: Any, path: Path) -> JobSpec:
    """Validate an already-parsed mapping; ``path`` names the file in messages."""
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a job spec must be a table/mapping at the top level, "
                        f"not {type(data).__name__}")
    data = dict(data)
    c = _Checker(path)
    base = path.resolve().parent

    name = c.string(data, "name", default=path.stem) or path.stem
    if not _NAME_RE.match(name):
        c.bad("name", f"{name!r} must be letters, digits, '_', '.' or '-' (for lock and "
                      "history file names)")
    raw_sources = data.pop("source", None)
    sources: list[str] = []
    if raw_sources is None:
        c.bad("source", "required key is missing (a glob URI, or a list of them)")
    elif isinstance(raw_sources, str) and raw_sources.strip():
        sources = [raw_sources]
    elif (isinstance(raw_sources, list) and raw_sources
          and all(isinstance(s, str) and s.strip() for s in raw_sources)):
        sources = list(raw_sources)
    else:
        c.bad("source", f"must be a glob URI or a non-empty list of them, not {raw_sources!r}")
    output = c.string(data, "output", required=True)
    model = c.string(data, "model")
    options = c.string(data, "options")
    weights = c.string(data, "weights")
    if model and (options or weights):
        c.bad("model", "give either model (a directory) or options + weights, not both")
    elif bool(options) != bool(weights):
        c.bad("options" if weights else "weights", "options and weights go together")
    shards = c.integer(data, "shards", 8, 1)
    item_tokens = c.integer(data, "item_tokens", DEFAULT_ITEM_TOKENS, 1)
    tokenizer = c.string(data, "tokenizer")
    if tokenizer is not None:
        from pipeline.tokenize import tokenizer_names

        if tokenizer not in tokenizer_names():
            c.bad("tokenizer", f"unknown tokenizer {tokenizer!r}; known: "
                               f"{', '.join(tokenizer_names())}")
    dtype = c.string(data, "dtype", default="float16", choices=("float16", "float32"))
    device = c.string(data, "device", default="auto", choices=("auto", "cpu", "cuda"))
    compute_dtype = c.string(data, "compute_dtype", default="float32",
                             choices=("float32", "bfloat16", "float16"))
    if compute_dtype == "float16" and device == "cpu":
        c.bad("compute_dtype", "float16 compute needs a CUDA device; use bfloat16 on the CPU")
    batch_tokens = c.integer(data, "batch_tokens", 4096, 1)
    max_sentence_tokens = c.integer(data, "max_sentence_tokens", 256, 2)
    window_overlap = c.integer(data, "window_overlap", 32, 0)
    if window_overlap >= max_sentence_tokens:
        c.bad("window_overlap", f"must be below max_sentence_tokens ({max_sentence_tokens})")
    schedule = c.string(data, "schedule")
    tz = c.string(data, "timezone", default="UTC") or "UTC"
    _check_cron(c, schedule, tz)
    delete_missing = c.boolean(data, "delete_missing", False)
    raw_mixes = data.pop("mixes", None)
    mixes: list[str] = []
    if raw_mixes is not None:
        if not isinstance(raw_mixes, list) or not all(isinstance(m, str) for m in raw_mixes):
            c.bad("mixes", f"must be a list of mix names, not {raw_mixes!r}")
        else:
            for mix in raw_mixes:
                if not _MIX_RE.match(mix):
                    c.bad("mixes", f"{mix!r} is not a mix name (top, average, layer:<k>, or "
                                   "the name of a stored custom mix)")
            if len(set(raw_mixes)) != len(raw_mixes):
                c.bad("mixes", "lists a mix twice")
            mixes = list(raw_mixes)
    index_out = c.string(data, "index_out")
    hash_max_bytes = c.integer(data, "hash_max_bytes", 64 << 20, 0)

    read_data = c.table(data, "read")
    read = ReadSpec(
        format=c.string(read_data, "format", "read.", default="auto", choices=_READ_FORMATS)
        or "auto",
        doc_per=c.string(read_data, "doc_per", "read.", default="line",
                         choices=("line", "file")) or "line",
        pretokenized=c.boolean(read_data, "pretokenized", False, "read."),
        text_column=c.string(read_data, "text_column", "read.", default="text") or "text",
        id_column=c.string(read_data, "id_column", "read.", default="id") or "id",
    )
    c.unknown(read_data, _READ_KEYS, "read.")

    ray_data = c.table(data, "ray")
    address = c.string(ray_data, "address", "ray.")
    actors = c.integer(ray_data, "actors", 1, 1, "ray.")
    num_cpus = c.number(ray_data, "num_cpus", "ray.")
    num_gpus = c.number(ray_data, "num_gpus", "ray.")
    executor = c.string(ray_data, "executor", "ray.", default="auto", choices=_EXECUTORS)
    wait_for_resources = c.number(ray_data, "wait_for_resources", "ray.")  # seconds
    runtime_env = c.table(ray_data, "runtime_env")
    c.unknown(ray_data, _RAY_KEYS, "ray.")
    if address and address.startswith(("http://", "https://")):
        c.bad("ray.address", "is the cluster address a run connects to (e.g. 'auto' or "
                             "'ray://HEAD:10001'); the dashboard's http://HEAD:8265 is for "
                             "`elmo jobs submit --address`")

    storage_options = c.table(data, "storage_options")
    c.unknown(data, _TOP_KEYS)
    if c.problems:
        raise SpecError(f"{path}: " + "; ".join(c.problems))
    assert output is not None  # a missing output is a problem reported above
    return JobSpec(
        path=str(path),
        name=name,
        sources=tuple(_resolve(s, base) for s in sources),
        output=_resolve(output, base),
        model=_resolve(model, base) if model else None,
        options=_resolve(options, base) if options else None,
        weights=_resolve(weights, base) if weights else None,
        shards=shards,
        item_tokens=item_tokens,
        tokenizer=tokenizer,
        dtype=dtype or "float16",
        device=device or "auto",
        compute_dtype=compute_dtype or "float32",
        batch_tokens=batch_tokens,
        max_sentence_tokens=max_sentence_tokens,
        window_overlap=window_overlap,
        schedule=schedule,
        timezone=tz,
        delete_missing=delete_missing,
        mixes=tuple(mixes),
        index_out=_resolve(index_out, base) if index_out else None,
        hash_max_bytes=hash_max_bytes,
        read=read,
        ray=RaySpec(address=address, actors=actors, num_cpus=num_cpus, num_gpus=num_gpus,
                    executor=executor or "auto", runtime_env=runtime_env,
                    wait_for_resources=wait_for_resources or 0.0),
        storage_options=storage_options,
    )


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate one spec file (TOML or YAML, by suffix)."""
    path = Path(path)
    return parse_spec(_parse_file(path), path)
