"""EmbedConfig is the one schema of an embedding run's settings: every field reaches the
Python API, ``elmo embed``'s flags and a job spec's keys, or the schema says why not; the
rules written once (executor choice, float16 needs CUDA) agree on every surface."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli

from elmo_model.errors import SettingError
from jobs.spec import SpecError, job_key, parse_spec
from pipeline.embed_cli import register as register_embed
from pipeline.embed_cli import settings_from_args
from pipeline.write.config import EmbedConfig, ModelSpec, flag_of
from pipeline.write.embed import config_from_settings
from pipeline.write.inputs import ReadOptions
from pipeline.write.setting import SettingField, settings_fields

# (field path, field): ``read.x`` for a read option, which a config holds in ``read``.
FIELDS = [(f.name, f) for f in settings_fields(EmbedConfig) if f.name != "read"] + [
    (f"read.{f.name}", f) for f in settings_fields(ReadOptions)]


def embed_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elmo")
    register_embed(parser.add_subparsers())
    return parser


def other_value(field: SettingField) -> Any:
    """A valid value other than the field's default."""
    s = field.setting
    allowed = s.choices or (s.names() if s.names else ())
    if allowed:
        return next(v for v in allowed if v != field.default)
    if field.kind is bool:
        return not field.default
    if field.kind is int:
        return int(s.minimum or 0) + 5
    if field.kind is float:
        return 2.5
    if field.kind is dict:
        return {"anon": True}
    return f"x-{field.name}"


def value_of(cfg: EmbedConfig, path: str) -> Any:
    return getattr(cfg.read, path[5:]) if path.startswith("read.") else getattr(cfg, path)


def cli_argv(field: SettingField, value: Any) -> list[str]:
    if field.kind is bool:
        return [field.setting.flag]  # a flag flips its field's default
    return [field.setting.flag, str(value)]


def job_entry(data: dict, key: str, value: Any) -> None:
    table, _, name = key.rpartition(".")
    (data.setdefault(table, {}) if table else data)[name] = value


def test_every_setting_reaches_the_api_the_cli_and_a_job_spec_or_says_why_not(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    on_cli = [(p, f) for p, f in FIELDS if not f.setting.custom and f.setting.flag]
    in_job = [(p, f) for p, f in FIELDS if not f.setting.custom and f.setting.job_key]
    for path, field in FIELDS:
        s = field.setting
        assert s.flag or s.not_on_cli, f"{path}: no CLI flag and no reason why not"
        assert s.job_key or s.not_in_job, f"{path}: no job-spec key and no reason why not"
    assert {p for p, f in FIELDS if not f.setting.flag} == {"storage_options", "source_files"}
    assert {p for p, f in FIELDS if not f.setting.job_key} == {"part", "progress",
                                                               "source_files"}
    values = {path: other_value(field) for path, field in FIELDS if not field.setting.custom}

    # The CLI: one flag per field, each with a non-default value.
    argv = ["embed", str(tmp_path / "c" / "*.txt"), "--out", str(tmp_path / "ds"), "--model",
            str(tiny_model_dir)]
    for path, field in on_cli:
        argv += cli_argv(field, values[path])
    args = embed_parser().parse_args(argv)
    from_cli = config_from_settings(args.sources, args.out, **settings_from_args(args))
    for path, _ in on_cli:
        assert value_of(from_cli, path) == values[path], f"--{path} did not reach EmbedConfig"
    assert from_cli.sources == [str(tmp_path / "c" / "*.txt")]
    assert from_cli.model == ModelSpec.resolve(str(tiny_model_dir))
    from_cli.validate()

    # A job spec: one key per field, each with a non-default value.
    data: dict[str, Any] = {"source": "c/*.txt", "output": "ds", "model": str(tiny_model_dir)}
    for path, field in in_job:
        job_entry(data, field.setting.job_key, values[path])
    from_job = parse_spec(data, tmp_path / "job.toml").embed_config()
    for path, _ in in_job:
        assert value_of(from_job, path) == values[path], f"{job_key(path)} did not reach it"
    assert from_job.sources == [str(tmp_path / "c" / "*.txt")]
    assert from_job.out == str(tmp_path / "ds") and from_job.model == from_cli.model

    # The API: the config itself, with every field set.
    read = ReadOptions(**{p[5:]: v for p, v in values.items() if p.startswith("read.")})
    api = EmbedConfig(sources=["c/*.txt"], out="ds", model=from_cli.model, read=read,
                      **{p: v for p, v in values.items() if not p.startswith("read.")})
    api.validate()
    for path, _ in FIELDS:
        if path in values:
            assert value_of(api, path) == values[path]


def test_settings_import_without_pyarrow() -> None:
    """``elmo --help`` parses the embed settings: the storage dtypes come from the
    contract's light module, not from the Arrow schemas."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, pipeline.cli as c; c.build_parser(); "
         "from pipeline.write.config import STORAGE_DTYPES; "
         "from schemas import STORAGE_DTYPES as S; "
         "print(STORAGE_DTYPES is S, 'pyarrow' in sys.modules)"],
        capture_output=True, text=True, check=True).stdout.split()
    assert loaded == ["True", "False"]


@pytest.mark.parametrize(("changes", "flag_message", "key_message"), [
    ({"compute_dtype": "float16", "device": "cpu"},
     "--compute-dtype: float16 compute needs a CUDA device",
     "compute_dtype: float16 compute needs a CUDA device"),
    ({"window_overlap": 8, "max_sentence_tokens": 8},
     "--window-overlap: must be below --max-sentence-tokens (8)",
     "window_overlap: must be below max_sentence_tokens (8)"),
    ({"min_items": 0}, "--shards: must be at least 1, not 0", "shards: must be at least 1"),
    ({"actors": 0}, "--actors: must be at least 1, not 0", "ray.actors: must be at least 1"),
    ({"gpus_per_actor": -1.0}, "--gpus-per-actor: must be a number >= 0",
     "ray.num_gpus: must be a number >= 0"),
    ({"ray_address": "http://head:8265"}, "--ray-address: is the cluster address",
     "ray.address: is the cluster address"),
])
def test_a_rule_is_checked_once_and_named_for_each_surface(
        tmp_path: Path, changes: dict, flag_message: str, key_message: str) -> None:
    cfg = dataclasses.replace(EmbedConfig(sources=["c"], out="o", model=ModelSpec("-", "-")),
                              **changes)
    with pytest.raises(SettingError) as caught:
        cfg.validate()
    assert caught.value.named(flag_of).startswith(flag_message)  # the CLI's words
    assert str(caught.value).startswith(f"{caught.value.setting}: ")  # the library's
    assert not str(caught.value).startswith("-")
    data: dict[str, Any] = {"source": "c/*.txt", "output": "ds"}
    fields = dict(FIELDS)
    for name, value in changes.items():
        job_entry(data, fields[name].setting.job_key, value)
    with pytest.raises(SpecError, match=key_message.replace("(", r"\(").replace(")", r"\)")):
        parse_spec(data, tmp_path / "job.toml")


def test_cli_refuses_a_bad_value_on_one_line(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture,
                                             tiny_model_dir: Path, tmp_path: Path) -> None:
    code = run_cli(monkeypatch, ["embed", str(tmp_path / "*.txt"), "--out", str(tmp_path / "o"),
                                 "--model", str(tiny_model_dir), "--device", "cpu",
                                 "--compute-dtype", "float16"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "elmo: error: --compute-dtype: float16 compute needs a CUDA device; use bfloat16 on "
        "the CPU")
    assert not (tmp_path / "o").exists()


def test_model_call_sizes_follow_the_device_unless_given() -> None:
    """A batch is 8x wider on a GPU and a unit is one batch there; given sizes stay."""
    from pipeline.write.config import DEFAULT_BATCH_TOKENS, GPU_BATCH_TOKENS

    cfg = EmbedConfig(sources=["x"], out="y", model=ModelSpec("o", "w"))
    assert cfg.model_call_sizes(on_gpu=False) == (DEFAULT_BATCH_TOKENS, 4 * DEFAULT_BATCH_TOKENS)
    assert cfg.model_call_sizes(on_gpu=True) == (GPU_BATCH_TOKENS, GPU_BATCH_TOKENS)
    given = dataclasses.replace(cfg, batch_tokens=100)
    assert given.model_call_sizes(on_gpu=True) == (100, 100)
    assert given.model_call_sizes(on_gpu=False) == (100, 400)
    both = dataclasses.replace(cfg, batch_tokens=100, unit_tokens=250)
    assert both.model_call_sizes(on_gpu=True) == both.model_call_sizes(on_gpu=False) == (100, 250)
