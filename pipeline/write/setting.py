"""How one embed setting is exposed: its CLI flag, its job-spec key, its help and checks.

A ``Setting`` rides in a dataclass field's metadata (``exposed(...)`` builds it),
so ``EmbedConfig`` and ``ReadOptions`` (pipeline/write/config.py, pipeline/write/inputs.py) stay the
only definition of an embedding run's settings: ``elmo embed``'s parser, the job-spec
parser and ``EmbedConfig.validate`` all read them from there. A surface that does not
offer a setting says why in ``not_on_cli`` / ``not_in_job``.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

METADATA_KEY = "elmo_setting"


@dataclass(frozen=True)
class Setting:
    help: str = ""  # CLI help; ``%(default)s`` is replaced by argparse with the default
    flag: str | None = None  # e.g. "--shards"; None with ``not_on_cli``
    job_key: str | None = None  # dotted spec key, e.g. "ray.actors"; None with ``not_in_job``
    choices: tuple[str, ...] = ()  # also argparse's choices
    names: Callable[[], tuple[str, ...]] | None = None  # allowed names, listed in the help
    minimum: float | None = None
    metavar: str | None = None
    group: str | None = None  # CLI argument group (the model files)
    not_on_cli: str | None = None  # why the CLI does not offer it
    not_in_job: str | None = None  # why a job spec does not offer it
    custom: bool = False  # the surfaces handle it themselves (sources, out, model)


def exposed(**exposure: Any) -> dict[str, Setting]:
    """Field metadata carrying a ``Setting``: ``field(default=..., metadata=exposed(...))``."""
    return {METADATA_KEY: Setting(**exposure)}


@dataclass(frozen=True)
class SettingField:
    """One field of a settings dataclass, with its value type (``None`` stripped)."""

    name: str
    kind: Any  # int, float, str, bool, dict, tuple, or a nested settings dataclass
    optional: bool  # None is allowed
    default: Any  # dataclasses.MISSING for a required field
    setting: Setting


def settings_fields(cls: type) -> Iterator[SettingField]:
    """The fields of ``cls`` that carry a ``Setting``, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        exposure = f.metadata.get(METADATA_KEY)
        if exposure is None:
            continue
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = type(None) in typing.get_args(hint)
        kind = args[0] if optional and len(args) == 1 else hint
        kind = typing.get_origin(kind) or kind
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING
            else dataclasses.MISSING)
        yield SettingField(f.name, kind, optional, default, exposure)


def value_problem(field: SettingField, value: Any) -> str | None:
    """Why ``value`` does not fit ``field`` (type, choices, minimum), or None."""
    s = field.setting
    if value is None:
        return None if field.optional else "must be set"
    kind = field.kind
    # bool is an int subclass in Python; `shards = true` is a mistake, not 1.
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer, not {value!r}"
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)
                          or (s.minimum is not None and value < s.minimum)):
        at_least = "" if s.minimum is None else f" >= {s.minimum:g}"
        return f"must be a number{at_least}, not {value!r}"
    if kind is bool and not isinstance(value, bool):
        return f"must be true or false, not {value!r}"
    if kind is str and (not isinstance(value, str) or not value.strip()):
        return f"must be a non-empty string, not {value!r}"
    if kind is dict and not isinstance(value, dict):
        return f"must be a table/mapping, not {type(value).__name__}"
    if s.minimum is not None and kind is int and value < s.minimum:
        return f"must be at least {s.minimum:g}, not {value!r}"
    if s.choices and value not in s.choices:
        return f"must be one of {', '.join(s.choices)}, not {value!r}"
    if s.names and value not in s.names():
        return f"unknown {field.name} {value!r}; known: {', '.join(s.names())}"
    return None
