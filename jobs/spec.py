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
from pipeline.write.config import EmbedConfig, ModelSpec
from pipeline.write.inputs import ReadOptions
from pipeline.write.setting import SettingField, settings_fields, value_problem

SPEC_SUFFIXES = (".toml", ".yaml", ".yml")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_MIX_RE = re.compile(r"^(top|average|layer:\d+|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")
__all__ = ["EXAMPLE_SPEC", "JobSpec", "SpecError", "job_key", "load_spec", "parse_spec"]


class SpecError(ElmoUserError):
    """A job spec that cannot be used; the message names the file, key and reason."""


@dataclass(frozen=True)
class JobSpec:
    """A job: what is job-only (name, schedule, indexes, ...) plus its embed settings,
    which are ``EmbedConfig``'s (parsed and checked by its schema, pipeline/write/config.py)."""

    path: str  # the spec file
    name: str
    sources: tuple[str, ...]
    output: str
    model: str | None = None
    options: str | None = None
    weights: str | None = None
    # EmbedConfig keyword arguments the spec sets (``read`` as a ReadOptions); the
    # model is resolved and the files and part chosen when a run starts.
    embed: dict[str, Any] = field(default_factory=dict)
    schedule: str | None = None
    timezone: str = "UTC"
    delete_missing: bool = False
    mixes: tuple[str, ...] = ()
    index_out: str | None = None
    # The indexes' kind (`elmo index build --compact` / `--full`); None: as each index was
    # made, compact for a new one (pipeline.lookup.index.sense_index.NEW_INDEX_COMPACT).
    index_compact: bool | None = None
    hash_max_bytes: int = 64 << 20  # content-hash files up to this size ("when cheap")
    runtime_env: dict[str, Any] = field(default_factory=dict)  # for `elmo jobs submit`

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.embed.get("storage_options") or {}

    @property
    def ray_address(self) -> str | None:
        return self.embed.get("ray_address")

    def embed_config(self) -> EmbedConfig:
        """The run's settings over all of the job's sources (resolves the model)."""
        return EmbedConfig(sources=list(self.sources), out=self.output,
                           model=ModelSpec.resolve(self.model, self.options, self.weights),
                           **self.embed)

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

    def boolean(self, data: dict, key: str, default: bool | None, prefix: str = ""
                ) -> bool | None:
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


_JOB_KEYS = ("name", "source", "output", "model", "options", "weights", "schedule", "timezone",
             "delete_missing", "mixes", "index_out", "index_compact", "hash_max_bytes")
_JOB_RAY_KEYS = ("runtime_env",)


def _embed_fields() -> list[tuple[str, SettingField]]:
    """``(field path, field)`` of every setting a spec may set (``read.x`` for a read
    option), from EmbedConfig's schema."""
    found = [(f.name, f) for f in settings_fields(EmbedConfig)
             if f.setting.job_key and not f.setting.custom]
    return found + [(f"read.{f.name}", f) for f in settings_fields(ReadOptions)]


def job_key(field_path: str) -> str:
    """The spec key of an EmbedConfig field (``read.format`` for a read option)."""
    keys = {path: f.setting.job_key for path, f in _embed_fields()}
    return keys.get(field_path) or field_path


def _known_keys(table: str) -> tuple[str, ...]:
    """The keys a spec may give at the top level (``table=""``) or in ``[table]``."""
    keys = [key.rpartition(".") for _, f in _embed_fields() if (key := f.setting.job_key)]
    embed = tuple(name for prefix, _, name in keys if prefix == table)
    tables = tuple(sorted({prefix for prefix, _, _ in keys if prefix}))
    if table == "ray":
        return embed + _JOB_RAY_KEYS
    return embed if table else _JOB_KEYS + embed + tables


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


def _take_embed(c: _Checker, data: dict, tables: dict[str, dict]) -> dict[str, Any]:
    """The spec's embed settings as EmbedConfig keyword arguments, each value checked by
    its field's schema, then the rules across fields (EmbedConfig.problems)."""
    values: dict[str, Any] = {}
    read: dict[str, Any] = {}
    for path, f in _embed_fields():
        key = f.setting.job_key or path
        table, _, name = key.rpartition(".")
        value = (tables[table] if table else data).pop(name, None)
        if value is None:
            continue
        if f.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        problem = value_problem(f, value)
        if problem:
            c.bad(key, problem)
        else:
            (read if path.startswith("read.") else values)[f.name] = value
    values["read"] = ReadOptions(**read)
    # The rules that span fields need a whole config; where the files are, the model
    # and the output do not take part in them.
    probe = EmbedConfig(sources=["-"], out="-", model=ModelSpec("-", "-"), **values)
    for field_path, reason in probe.problems(job_key):
        c.bad(job_key(field_path), reason)
    return values


def _take_sources(c: _Checker, data: dict) -> list[str]:
    raw = data.pop("source", None)
    if raw is None:
        c.bad("source", "required key is missing (a glob URI, or a list of them)")
    elif isinstance(raw, str) and raw.strip():
        return [raw]
    elif isinstance(raw, list) and raw and all(isinstance(s, str) and s.strip() for s in raw):
        return list(raw)
    else:
        c.bad("source", f"must be a glob URI or a non-empty list of them, not {raw!r}")
    return []


def _take_mixes(c: _Checker, data: dict) -> list[str]:
    raw = data.pop("mixes", None)
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
        c.bad("mixes", f"must be a list of mix names, not {raw!r}")
        return []
    for mix in raw:
        if not _MIX_RE.match(mix):
            c.bad("mixes", f"{mix!r} is not a mix name (top, average, layer:<k>, or the "
                           "name of a stored custom mix)")
    if len(set(raw)) != len(raw):
        c.bad("mixes", "lists a mix twice")
    return list(raw)


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
    sources = _take_sources(c, data)
    output = c.string(data, "output", required=True)
    model = c.string(data, "model")
    options = c.string(data, "options")
    weights = c.string(data, "weights")
    if model and (options or weights):
        c.bad("model", "give either model (a directory) or options + weights, not both")
    elif bool(options) != bool(weights):
        c.bad("options" if weights else "weights", "options and weights go together")
    schedule = c.string(data, "schedule")
    tz = c.string(data, "timezone", default="UTC") or "UTC"
    _check_cron(c, schedule, tz)
    delete_missing = c.boolean(data, "delete_missing", False)
    mixes = _take_mixes(c, data)
    index_out = c.string(data, "index_out")
    index_compact = c.boolean(data, "index_compact", None)
    hash_max_bytes = c.integer(data, "hash_max_bytes", 64 << 20, 0)
    tables = {table: c.table(data, table) for table in ("read", "ray")}
    runtime_env = c.table(tables["ray"], "runtime_env")
    embed = _take_embed(c, data, tables)
    for table, rest in tables.items():
        c.unknown(rest, _known_keys(table), f"{table}.")
    c.unknown(data, _known_keys(""))
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
        embed=embed,
        schedule=schedule,
        timezone=tz,
        delete_missing=delete_missing,
        mixes=tuple(mixes),
        index_out=_resolve(index_out, base) if index_out else None,
        index_compact=index_compact,
        hash_max_bytes=hash_max_bytes,
        runtime_env=runtime_env,
    )


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate one spec file (TOML or YAML, by suffix)."""
    path = Path(path)
    return parse_spec(_parse_file(path), path)
