"""``elmo jobs ...``: scheduled, incremental corpus embedding jobs.

Imports nothing heavy at module level; the handlers import the runner, Ray, etc.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from elmo_model.errors import ElmoUserError
from jobs.example_spec import EXAMPLE_SPEC
from jobs.spec import JobSpec, SpecError, load_spec

EPILOG = """\
examples:
  elmo jobs run examples/job.toml               # the bundled example: embeds examples/corpus
  elmo jobs validate jobs/news.toml
  elmo jobs run jobs/news.toml                  # embed new/changed files only
  elmo jobs schedule jobs/news.toml jobs/web.yaml   # run due jobs by cron, forever
  elmo jobs schedule jobs/*.toml --once         # one pass (systemd timer / CronJob)
  elmo jobs status jobs/news.toml               # last runs, next due time, lag
  elmo jobs submit jobs/news.toml --address http://HEAD:8265 --wait

A spec (TOML or YAML; see docs/jobs.md):
""" + "\n".join("  " + line for line in EXAMPLE_SPEC.splitlines())


SPEC_HELP = "job spec file (TOML or YAML; see `elmo jobs --help`)"
SPECS_HELP = "job spec files (TOML or YAML; see `elmo jobs --help`)"


def _verb(verbs: Any, name: str, *, help: str, description: str, epilog: str,
          many: bool) -> argparse.ArgumentParser:
    """Add a ``jobs`` verb: its parser (raw description and epilog) with the SPEC
    positional, one spec or (``many``) one or more."""
    p = verbs.add_parser(name, help=help, description=description, epilog=epilog,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    if many:
        p.add_argument("specs", nargs="+", metavar="SPEC", help=SPECS_HELP)
    else:
        p.add_argument("spec", metavar="SPEC", help=SPEC_HELP)
    return p


def register(subparsers: Any) -> None:
    jobs = subparsers.add_parser(
        "jobs", help="scheduled, incremental corpus embedding jobs",
        description="Scheduled, incremental embedding jobs: each run embeds only new or\n"
                    "changed source files, swaps their rows atomically, and refreshes the\n"
                    "mixes' indexes.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = jobs.add_subparsers(dest="jobs_command", metavar="VERB")
    jobs.set_defaults(handler=lambda args: (jobs.print_help(), 2)[1])

    p = _verb(
        verbs, "validate", many=True, help="check job specs and report every problem",
        description="Check job specs without running anything: every unknown key, bad\n"
                    "value and missing field of every spec is reported at once, with the\n"
                    "file and the key.",
        epilog="examples:\n  elmo jobs validate examples/job.toml\n"
               "  elmo jobs validate jobs/*.toml")
    p.set_defaults(handler=_validate)

    p = _verb(
        verbs, "run", many=False, help="one incremental run of a job now",
        description="Run a job once, now: embed the source files that are new or changed\n"
                    "since the last run, swap their rows in atomically, then refresh the\n"
                    "indexes of the spec's mixes.",
        epilog="examples:\n  elmo jobs run examples/job.toml\n"
               "  elmo jobs run jobs/news.toml --ray-address auto   # on a Ray cluster\n\n"
               "Exit status: 0 on success (also when nothing changed), 1 when the run or\n"
               "an index refresh failed, 2 on a bad spec or when the job is already running.")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="override the spec's ray.address (e.g. auto inside a Ray job); on "
                        "Ray, the embedding and a compact index refresh's per-shard work "
                        "(the new files' vectors, the shards' codes) run as Ray actors and "
                        "tasks")
    p.add_argument("--trigger", default="manual", choices=("manual", "submit"),
                   help=argparse.SUPPRESS)
    p.add_argument("--progress", action="store_true", help="show the embedding progress bar")
    p.set_defaults(handler=_run)

    p = _verb(
        verbs, "schedule", many=True, help="run due jobs by their cron schedules",
        description="Run each job whenever its cron schedule makes it due, forever (or one\n"
                    "pass with --once). A job is due when no run has started since its\n"
                    "latest cron time; missed times are caught up by one incremental run.",
        epilog="examples:\n  elmo jobs schedule examples/job.toml --once   # one pass, "
               "then exit\n"
               "  elmo jobs schedule jobs/news.toml jobs/web.toml\n"
               "  elmo jobs schedule jobs/news.toml --once   # from a timer or CronJob\n\n"
               "With --once it prints one line per job: what ran, or why not, and when it\n"
               "is next due. Jobs run one after another in this process. A job whose\n"
               "previous run is still going (here or in another scheduler) is skipped; any\n"
               "number of schedulers may watch one spec, and one run at a time happens.")
    p.add_argument("--once", action="store_true", help="one pass over the specs, then exit")
    p.add_argument("--max-sleep", type=float, default=60.0, metavar="S",
                   help="wake at least every S seconds (default 60)")
    p.set_defaults(handler=_schedule)

    p = _verb(
        verbs, "status", many=True, help="last runs, next due time and lag of jobs",
        description="Show each job's recent runs (status, trigger, duration, files,\n"
                    "documents, tokens, errors), when it is next due and how late a due run\n"
                    "is.",
        epilog="examples:\n  elmo jobs status examples/job.toml\n"
               "  elmo jobs status jobs/*.toml --runs 10 --json")
    p.add_argument("--runs", type=int, default=5, help="runs to show per job (default 5)")
    p.add_argument("--json", action="store_true", help="JSON for machines")
    p.set_defaults(handler=_status)

    p = _verb(
        verbs, "submit", many=False, help="run a job on a Ray cluster via the Job Submission API",
        description="Submit `elmo jobs run SPEC` to a Ray cluster through its Job\n"
                    "Submission API, so the run happens on the cluster; --wait follows it\n"
                    "to the end.",
        epilog="examples:\n  elmo jobs submit jobs/news.toml --address http://HEAD:8265\n"
               "  elmo jobs submit jobs/news.toml --address http://HEAD:8265 --wait\n"
               "  elmo jobs submit jobs/news.toml --address http://HEAD:8265 "
               "--working-dir jobs/\n"
               "      # uploads the directory holding the spec\n\n"
               "The cluster must have this project installed (see ray_cluster.yaml); paths\n"
               "in the spec are read on the cluster, so use URIs there.")
    p.add_argument("--address", required=True, metavar="URL",
                   help="Ray dashboard URL, e.g. http://HEAD:8265")
    p.add_argument("--working-dir", metavar="DIR",
                   help="directory to upload (must hold the spec); default: the spec alone")
    p.add_argument("--wait", action="store_true", help="wait for the job and print its logs")
    p.set_defaults(handler=_submit)


def _load(paths: list[str]) -> list[JobSpec]:
    specs, problems = [], []
    for path in paths:
        try:
            specs.append(load_spec(path))
        except SpecError as error:
            problems.append(str(error))
    if problems:
        raise ElmoUserError(" | ".join(problems))
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ElmoUserError(f"job names used twice: {', '.join(dupes)} (set name = in a spec)")
    return specs


def _validate(args: argparse.Namespace) -> int:
    for spec in _load(args.specs):
        sources = ", ".join(spec.sources)
        print(f"{spec.path}: ok (job {spec.name}: {sources} -> {spec.output}, "
              f"schedule {spec.schedule or '(none)'})")
    return 0


def _run(args: argparse.Namespace) -> int:
    from jobs.runner import run_job

    (spec,) = _load([args.spec])
    if args.ray_address:
        spec = dataclasses.replace(spec, embed={**spec.embed, "ray_address": args.ray_address})
    result = run_job(spec, trigger=args.trigger, progress=args.progress, echo=True)
    assert result is not None  # no due_check: a run always happens or raises
    return result.exit_code


def _schedule(args: argparse.Namespace) -> int:
    from jobs.schedule import once_summary, schedule_loop

    specs = _load(args.specs)
    outcome = schedule_loop(specs, once=args.once, max_sleep_s=args.max_sleep)
    if args.once:
        print("\n".join(once_summary(specs, outcome)))
    return 1 if any(v.startswith("failed") for v in outcome.values()) else 0


def _status(args: argparse.Namespace) -> int:
    import json
    import time

    from jobs.schedule import job_status, status_lines

    now = time.time()
    statuses = [(spec, job_status(spec, now, args.runs)) for spec in _load(args.specs)]
    if args.json:
        print(json.dumps([s.to_dict() for _, s in statuses], indent=1, default=str))
        return 0
    for spec, status in statuses:
        print("\n".join(status_lines(status, spec.timezone, now)))
    return 0


def _submit(args: argparse.Namespace) -> int:
    from jobs.submit import submit, wait

    (spec,) = _load([args.spec])
    submission_id, client = submit(spec, args.address, working_dir=args.working_dir)
    print(f"submitted {submission_id} to {args.address}")
    print(f"  follow: ray job logs --address {args.address} --follow {submission_id}")
    if not args.wait:
        return 0
    status = wait(client, submission_id)
    sys.stdout.write(client.get_job_logs(submission_id))
    print(f"{submission_id}: {status}")
    return 0 if status == "SUCCEEDED" else 1
