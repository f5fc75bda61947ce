"""ray_cluster.yaml against the autoscaler schema shipped in the installed ray, and
``elmo jobs submit`` through a stand-in for Ray's JobSubmissionClient."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


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
