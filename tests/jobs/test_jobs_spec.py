"""Job specs: valid TOML and YAML load; malformed ones name the file, the key and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.spec import EXAMPLE_SPEC, SpecError, load_spec

GOOD_TOML = """\
source = ["corpus/*.txt", "s3://bucket/more/**/*.jsonl"]
output = "out/ds"
model = "models/tiny"
shards = 4
dtype = "float32"
schedule = "30 23 * * *"
timezone = "Europe/Berlin"
delete_missing = true
mixes = ["top", "layer:1"]

[read]
doc_per = "file"

[ray]
address = "auto"
actors = 2
num_gpus = 1

[storage_options]
anon = true
"""

GOOD_YAML = """\
name: web
source: s3://bucket/web/*.parquet
output: s3://bucket/ds/web
schedule: "*/15 * * * *"
read: {format: parquet, text_column: body}
ray: {num_cpus: 2}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_spec_loads_and_resolves_paths_against_the_spec_file(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "news.toml", GOOD_TOML))
    assert spec.name == "news"
    assert spec.sources == (str(tmp_path / "corpus/*.txt"), "s3://bucket/more/**/*.jsonl")
    assert spec.output == str(tmp_path / "out/ds") and spec.model == str(tmp_path / "models/tiny")
    embed = spec.embed
    assert (embed["min_items"], embed["dtype"], spec.delete_missing) == (4, "float32", True)
    assert spec.mixes == ("top", "layer:1") and embed["read"].doc_per == "file"
    assert (embed["ray_address"], embed["actors"], embed["gpus_per_actor"]) == ("auto", 2, 1.0)
    assert spec.storage_options == {"anon": True}
    assert spec.index_uri("layer:1") == str(tmp_path / "out/ds/_index/layer_1")
    # Keys the spec does not give keep EmbedConfig's defaults.
    assert not {"tokenizer", "item_tokens", "wait_for_resources_s"} & set(embed)


def test_tokenizer_item_size_and_resource_wait_keys(tmp_path: Path) -> None:
    text = GOOD_TOML.replace("shards = 4\n", 'shards = 4\ntokenizer = "elmo-store-ptb"\n'
                             "item_tokens = 1000\n").replace(
        "num_gpus = 1\n", "num_gpus = 1\nwait_for_resources = 600\n")
    spec = load_spec(write(tmp_path, "news.toml", text))
    assert (spec.embed["tokenizer"], spec.embed["item_tokens"]) == ("elmo-store-ptb", 1000)
    assert spec.embed["wait_for_resources_s"] == 600.0


def test_yaml_spec_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, "x.yml", GOOD_YAML))
    assert spec.name == "web" and spec.sources == ("s3://bucket/web/*.parquet",)
    assert spec.embed["read"].format == "parquet" and spec.embed["read"].text_column == "body"
    assert spec.embed["cpus_per_actor"] == 2.0 and spec.schedule == "*/15 * * * *"


def test_the_documented_example_is_a_valid_spec(tmp_path: Path) -> None:
    assert load_spec(write(tmp_path, "example.toml", EXAMPLE_SPEC)).name == "news"


@pytest.mark.parametrize(("text", "expected"), [
    ('source = "a/*"\noutput = "o"\ndelete_mising = true\n',
     "delete_mising: unknown key (did you mean 'delete_missing'?)"),
    ('source = "a/*"\noutput = "o"\n[ray]\nnum_gpu = 1\n',
     "ray.num_gpu: unknown key (did you mean 'num_gpus'?)"),
    ('source = "a/*"\noutput = "o"\n[read]\nencoding = "latin-1"\n', "read.encoding: unknown key"),
    ('output = "o"\n', "source: required key is missing"),
    ('source = "a/*"\n', "output: required key is missing"),
    ('source = "a/*"\noutput = "o"\nshards = "8"\n', "shards: must be an integer, not '8'"),
    ('source = "a/*"\noutput = "o"\nshards = 0\n', "shards: must be at least 1, not 0"),
    ('source = "a/*"\noutput = "o"\nshards = true\n', "shards: must be an integer, not True"),
    ('source = "a/*"\noutput = "o"\ndtype = "bfloat16"\n',
     "dtype: must be one of float16, float32, int8, not 'bfloat16'"),
    ('source = "a/*"\noutput = "o"\nschedule = "0 25 * * *"\n',
     "schedule: not a valid 5-field cron expression: '0 25 * * *'"),
    ('source = "a/*"\noutput = "o"\nschedule = "@daily now"\n', "schedule: not a valid"),
    ('source = "a/*"\noutput = "o"\ntimezone = "Mars/Olympus"\n',
     "timezone: unknown time zone 'Mars/Olympus'"),
    ('source = "a/*"\noutput = "o"\ndelete_missing = "yes"\n',
     "delete_missing: must be true or false, not 'yes'"),
    ('source = "a/*"\noutput = "o"\nmixes = ["top", "bad mix!"]\n',
     "mixes: 'bad mix!' is not a mix name"),
    ('source = []\noutput = "o"\n', "source: must be a glob URI or a non-empty list"),
    ('source = "a/*"\noutput = "o"\nmodel = "m"\noptions = "o.json"\n',
     "model: give either model (a directory) or options + weights, not both"),
    ('source = "a/*"\noutput = "o"\n[ray]\naddress = "http://head:8265"\n',
     "ray.address: is the cluster address"),
    ('source = "a/*"\noutput = "o"\nray = 3\n', "ray: must be a table/mapping, not int"),
    ('source = "a/*"\noutput = "o"\ntokenizer = "nope"\n', "tokenizer: unknown tokenizer 'nope'"),
    ('source = "a/*"\noutput = "o"\nitem_tokens = 0\n', "item_tokens: must be at least 1"),
    ('source = "a/*"\noutput = "o"\n[ray]\nwait_for_resources = -1\n',
     "ray.wait_for_resources: must be a number >= 0, not -1"),
    ('source = "a/*"\noutput = "o"\nname = "has space"\n', "name: 'has space' must be"),
])
def test_malformed_specs_name_file_key_and_reason(tmp_path: Path, text: str,
                                                  expected: str) -> None:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message
    assert "\n" not in message  # the CLI prints it as one line


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.toml", 'output = 3\nshards = -1\ncolour = "red"\n')
    with pytest.raises(SpecError) as info:
        load_spec(path)
    for part in ("source: required", "output: must be a non-empty string", "shards: must be "
                 "at least 1", "colour: unknown key"):
        assert part in str(info.value)


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("syntax.toml", 'source = "a\noutput = "o"\n', "not valid TOML"),
    ("syntax.yaml", "source: [a, b\noutput: o\n", "not valid YAML at line"),
    ("list.yaml", "- source: a\n", "must be a table/mapping at the top level, not list"),
    ("spec.json", "{}", "unsupported spec format '.json'"),
])
def test_unparseable_specs(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(SpecError, match=expected) as info:
        load_spec(path)
    assert str(info.value).startswith(str(path))


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="job spec not found"):
        load_spec(tmp_path / "nope.toml")


def test_cli_reports_a_bad_spec_on_one_line_with_exit_2(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli, "REGISTRARS", ("jobs.cli",))  # only our verbs

    path = write(tmp_path, "bad.toml", 'source = "a/*"\noutput = "o"\nshard = 3\n')
    assert cli.main(["jobs", "validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"elmo: error: {path}: shard: unknown key (did you mean 'shards'?)"
    good = write(tmp_path, "good.toml", 'source = "a/*"\noutput = "o"\n')
    assert cli.main(["jobs", "validate", str(good)]) == 0
    assert "ok (job good" in capsys.readouterr().out



def test_device_and_compute_dtype_reach_the_embed_config(tmp_path: Path,
                                                          tiny_model_dir: Path) -> None:
    path = write(tmp_path, "job.toml", f'source = "c/*.txt"\noutput = "ds"\n'
                 f'model = "{tiny_model_dir}"\ncompute_dtype = "bfloat16"\ndevice = "cpu"\n')
    config = load_spec(path).embed_config()
    assert (config.compute_dtype, config.device) == ("bfloat16", "cpu")
    bad = write(tmp_path, "bad.toml", 'source = "c/*.txt"\noutput = "ds"\n'
                'compute_dtype = "float16"\ndevice = "cpu"\n')
    with pytest.raises(SpecError, match="compute_dtype: float16 compute needs a CUDA device"):
        load_spec(bad)
