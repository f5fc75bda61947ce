"""ray_cluster.yaml against the autoscaler schema shipped in the installed ray, and
``elmo jobs submit`` through a stand-in for Ray's JobSubmissionClient."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO


def ray_schema() -> dict:
    import ray.autoscaler

    path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    return json.loads(path.read_text())


def test_ray_cluster_yaml_matches_the_autoscaler_schema() -> None:
    import jsonschema

    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    jsonschema.validate(config, ray_schema())
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0  # the driver node holds no GPU actor
    assert any(w["resources"].get("GPU", 0) >= 1 and w["min_workers"] < w["max_workers"]
               for w in workers)  # an autoscaling GPU worker type
    assert any("pip install ~/elmo-store" in c for c in config["setup_commands"])


def test_ray_cluster_yaml_passes_rays_own_validation() -> None:
    # What `ray up` runs: defaults filled in from the provider, then the same schema.
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load((REPO / "ray_cluster.yaml").read_text())))


def test_a_broken_cluster_config_fails_the_schema() -> None:
    import jsonschema

    config = yaml.safe_load((REPO / "ray_cluster.yaml").read_text())
    config["available_node_types"]["gpu_worker"]["resources"]["GPU"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(config, ray_schema())


class FakeClient:
    """Records what JobSubmissionClient would receive; checks the upload exists then."""


    def __init__(self, address: str) -> None:
        self.address = address
        self.kwargs: dict[str, Any] = {}
        self.uploaded: list[str] = []

    def submit_job(self, **kwargs: Any) -> str:
        self.kwargs = kwargs
        self.uploaded = sorted(p.name for p in Path(kwargs["runtime_env"]["working_dir"]).iterdir())
        return kwargs["submission_id"]

    def get_job_status(self, submission_id: str) -> str:
        return "SUCCEEDED"

    def get_job_logs(self, submission_id: str) -> str:
        return "job: no changes\n"


def test_submit_uploads_the_spec_and_runs_elmo_jobs_run(tmp_path: Path) -> None:
    from jobs.spec import load_spec
    from jobs.submit import submit, wait

    path = tmp_path / "news.toml"
    path.write_text('source = "s3://b/news/*.txt"\noutput = "s3://b/ds"\n'
                    '[ray]\nnum_gpus = 1\nactors = 2\nruntime_env = {env_vars = {A = "1"}}\n')
    submission_id, client = submit(load_spec(path), "http://head:8265",
                                   client_factory=FakeClient)
    assert client.address == "http://head:8265"
    assert client.uploaded == ["news.toml"]
    assert client.kwargs["entrypoint"] == ("elmo jobs run news.toml --trigger submit "
                                           "--ray-address auto")
    assert client.kwargs["runtime_env"]["env_vars"] == {"A": "1"}
    assert submission_id.startswith("elmo-news-")
    assert wait(client, submission_id, poll_s=0) == "SUCCEEDED"


def test_submit_wants_the_dashboard_url(tmp_path: Path) -> None:
    from elmo_model.errors import ElmoUserError
    from jobs.spec import load_spec
    from jobs.submit import submit

    path = tmp_path / "news.toml"
    path.write_text('source = "s3://b/*"\noutput = "s3://b/ds"\n')
    with pytest.raises(ElmoUserError, match="dashboard URL"):
        submit(load_spec(path), "ray://head:10001", client_factory=FakeClient)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_submit_runs_the_job_on_a_real_local_ray_cluster(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    """The Job Submission API end to end: a local Ray head with its dashboard, the spec
    uploaded, `elmo jobs run` executed by Ray as the job, its dataset written."""
    import logging
    import os
    import shutil
    import sys
    import tempfile

    import ray

    import pipeline
    from jobs.spec import load_spec
    from jobs.submit import submit, wait

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The cat sat on the mat.\nA dog ran home fast.\n")
    # The job's process finds `elmo` where this interpreter's scripts are.
    path_env = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    spec_path = tmp_path / "news.toml"
    spec_path.write_text(
        f'source = "{corpus}/*.txt"\noutput = "{tmp_path / "ds"}"\nmodel = "{tiny_model_dir}"\n'
        'shards = 2\n[ray]\nactors = 1\n'
        f'runtime_env = {{env_vars = {{PATH = "{path_env}", RAY_AUTH_MODE = "disabled"}}}}\n')
    if ray.is_initialized():
        ray.shutdown()
    port = _free_port()
    # A short temp dir: Ray's socket paths under pytest's tmp_path exceed AF_UNIX's limit.
    ray_temp = tempfile.mkdtemp(prefix="elmo-ray-")
    context = ray.init(num_cpus=2, include_dashboard=True, dashboard_port=port,
                       logging_level=logging.WARNING, log_to_driver=False, _temp_dir=ray_temp)
    try:
        submission_id, client = submit(load_spec(spec_path), f"http://{context.dashboard_url}")
        status = wait(client, submission_id, poll_s=1.0)
        logs = client.get_job_logs(submission_id)
        assert status == "SUCCEEDED", logs
    finally:
        ray.shutdown()
        shutil.rmtree(ray_temp, ignore_errors=True)
    documents = pipeline.open_dataset(str(tmp_path / "ds")).to_table(table="documents")
    assert sorted(documents.column("doc_id").to_pylist()) == ["a.txt:1", "a.txt:2"]


@pytest.mark.slow
def test_jobs_and_elmo_embed_pick_ray_by_one_rule_and_a_job_starts_it_once(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU machine (as torch reports it here) with one actor, `elmo embed` runs on
    Ray; a job follows the same rule and holds one Ray session for all its files, rather
    than none (Ray then started and stopped for every file)."""
    import os

    import ray
    import torch

    import jobs.runner
    import pipeline
    from jobs.spec import load_spec
    from pipeline.write.ray_setup import choose_executor

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The cat sat on the mat.\n")
    (corpus / "b.txt").write_text("A dog ran home fast.\n")
    spec_path = tmp_path / "job.toml"
    spec_path.write_text(f'source = "{corpus}/*.txt"\noutput = "{tmp_path / "ds"}"\n'
                         f'model = "{tiny_model_dir}"\nshards = 1\n')
    spec = load_spec(spec_path)
    assert choose_executor(spec.embed_config()) == "ray"  # what `elmo embed` would use

    starts: list[str | None] = []
    real_init, real_embed = ray.init, jobs.runner.embed_corpus
    executors: list[str] = []

    def counting_init(*args: object, **kwargs: object) -> object:
        starts.append(str(kwargs.get("address")))
        return real_init(*args, **kwargs)

    def embed(cfg: object) -> object:
        summary = real_embed(cfg)
        executors.append(summary.executor)
        return summary

    monkeypatch.setattr(ray, "init", counting_init)
    monkeypatch.setattr(jobs.runner, "embed_corpus", embed)
    result = jobs.runner.run_job(spec)
    assert result is not None and result.record.status == "ok"
    assert executors == ["ray", "ray"] and len(starts) == 1
    assert not ray.is_initialized()  # the job's session ended with the run
    documents = pipeline.open_dataset(str(tmp_path / "ds")).to_table(table="documents")
    assert sorted(documents.column("doc_id").to_pylist()) == ["a.txt:1", "b.txt:1"]
