"""``elmo jobs submit``: run a job on a Ray cluster through Ray's Job Submission API.

The cluster (see ``ray_cluster.yaml``) has this project installed on every node by its
setup commands, so the entrypoint is just ``elmo jobs run``. The spec file travels in
the job's ``working_dir`` (a temporary directory holding only the spec, or a directory
the user names), and the run connects to the cluster it runs in (``ray.address =
"auto"`` unless the spec names another). Paths in a submitted spec are read on the
cluster: use URIs (s3://, gs://) or paths that exist on the nodes.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from elmo_model.errors import ElmoUserError, SettingError
from jobs.spec import JobSpec


def build_submission(spec: JobSpec, working_dir: str | None = None) -> dict[str, Any]:
    """The keyword arguments of ``JobSubmissionClient.submit_job`` (without the upload dir)."""
    spec_name = Path(spec.path).name
    entrypoint = f"elmo jobs run {shlex.quote(spec_name)} --trigger submit"
    if not spec.ray_address:
        entrypoint += " --ray-address auto"
    runtime_env = dict(spec.runtime_env)
    if working_dir is not None:
        runtime_env["working_dir"] = working_dir
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return {
        "entrypoint": entrypoint,
        "submission_id": f"elmo-{spec.name}-{stamp}",
        "runtime_env": runtime_env,
        "metadata": {"elmo_job": spec.name, "spec": spec_name},
    }


def submit(spec: JobSpec, address: str, *, working_dir: str | None = None,
           client_factory: Any = None) -> tuple[str, Any]:
    """Submit; returns (submission id, client). ``client_factory`` is for tests."""
    if not address.startswith(("http://", "https://")):
        raise SettingError("address", lambda name: (
            f"{name('address')} must be the dashboard URL (http://HEAD:8265), not {address!r}"))
    if client_factory is None:
        from ray.job_submission import JobSubmissionClient

        client_factory = JobSubmissionClient
    with tempfile.TemporaryDirectory(prefix="elmo-submit-") as tmp:
        if working_dir is None:
            upload = Path(tmp)
            shutil.copy2(spec.path, upload / Path(spec.path).name)
        else:
            upload = Path(working_dir)
            if not (upload / Path(spec.path).name).is_file():
                raise SettingError("working_dir", lambda name: (
                    f"{name('working_dir')} {upload} must contain the spec "
                    f"{Path(spec.path).name}"))
        kwargs = build_submission(spec, str(upload))
        try:
            client = client_factory(address)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ElmoUserError(f"cannot reach the Ray dashboard at {address}: {error}"
                                ) from None
        # The upload happens inside submit_job, while the temporary directory exists.
        submission_id = client.submit_job(**kwargs)
    return submission_id, client


def wait(client: Any, submission_id: str, poll_s: float = 5.0) -> str:
    """Follow a submitted job to its end; returns the final status name."""
    terminal = {"SUCCEEDED", "FAILED", "STOPPED"}
    while True:
        reply = client.get_job_status(submission_id)
        status = str(getattr(reply, "value", reply))  # a JobStatus enum, or a plain string
        if status in terminal:
            return status
        time.sleep(poll_s)
