"""Cron scheduling of jobs: due times, the scheduler loop, and ``elmo jobs status``.

A job is *due* when the most recent cron slot at or before now has not been served by a
run, where any run (scheduled or manual, whatever its outcome) started at or after that
slot serves it. Missed slots are not replayed one by one: a job is incremental, so one
run catches up on everything. A failed run waits for the next slot rather than being
retried every poll.

Time is injected (``clock``, ``sleep``) so tests move a fake clock across day boundaries.
Cron expressions are evaluated in the spec's time zone by ``croniter``.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from elmo_model.errors import ElmoUserError
from jobs.runner import run_job
from jobs.spec import JobSpec
from jobs.state import JobBusyError, RunRecord, iter_runs
from schemas.files import open_fs

Clock = Callable[[], float]


def _cron(spec: JobSpec, now: float) -> Any:
    from croniter import croniter

    if not spec.schedule:
        raise ElmoUserError(f"{spec.path}: schedule: no cron expression; the scheduler needs "
                            "one (e.g. schedule = \"0 3 * * *\")")
    start = datetime.fromtimestamp(now, tz=ZoneInfo(spec.timezone))
    return croniter(spec.schedule, start)


def previous_slot(spec: JobSpec, now: float) -> float:
    """The latest cron time <= now (epoch seconds)."""
    itr = _cron(spec, now)
    # croniter's get_prev is strictly before its start; a slot exactly at `now` counts.
    nxt = _cron(spec, now - 1).get_next(datetime).timestamp()
    return nxt if nxt <= now else itr.get_prev(datetime).timestamp()


def next_slot(spec: JobSpec, now: float) -> float:
    """The first cron time strictly after now (epoch seconds)."""
    return _cron(spec, now).get_next(datetime).timestamp()


def serves(run: RunRecord, slot: float) -> bool:
    return run.started_at >= slot or (run.slot is not None and run.slot >= slot)


def is_due(spec: JobSpec, runs: Sequence[RunRecord], now: float) -> bool:
    slot = previous_slot(spec, now)
    return not any(serves(run, slot) for run in runs)


def _history(spec: JobSpec) -> list[RunRecord]:
    fs, root = open_fs(spec.output, spec.storage_options or None)
    return list(iter_runs(fs, root))


def fmt_time(ts: float | None, tz: str = "UTC") -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M:%S %Z")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def tick(specs: Sequence[JobSpec], clock: Clock, echo: bool = True) -> dict[str, str]:
    """Run every due job once, one after another; job name -> what happened."""
    outcome: dict[str, str] = {}
    for spec in specs:
        now = clock()
        try:
            if not is_due(spec, _history(spec), now):
                outcome[spec.name] = "not due"
                continue
            slot = previous_slot(spec, now)
            result = run_job(spec, trigger="schedule", slot=slot, clock=clock, echo=echo,
                             due_check=lambda runs, s=spec, t=slot: not any(
                                 serves(r, t) for r in runs))
            if result is None:
                outcome[spec.name] = "served by another scheduler"
            else:
                outcome[spec.name] = result.record.status
        except JobBusyError:
            outcome[spec.name] = "skipped: the previous run is still going"
        except ElmoUserError as error:
            outcome[spec.name] = f"failed: {error}"
        except Exception as error:  # the scheduler outlives one job's bug
            traceback.print_exc(file=sys.stderr)
            outcome[spec.name] = f"failed: {type(error).__name__}: {error}"
        if echo and outcome[spec.name] != "not due":
            print(f"{fmt_time(clock())} {spec.name}: {outcome[spec.name]}", file=sys.stderr)
    return outcome


def schedule_loop(specs: Sequence[JobSpec], *, clock: Clock = time.time,
                  sleep: Callable[[float], None] = time.sleep, once: bool = False,
                  max_sleep_s: float = 60.0, echo: bool = True) -> dict[str, str]:
    """Run due jobs forever (or one pass with ``once``); sleeps until the next slot,
    waking at least every ``max_sleep_s`` to notice runs finished elsewhere."""
    for spec in specs:
        _cron(spec, clock())  # a spec without a schedule fails now, not at its first slot
    while True:
        outcome = tick(specs, clock, echo)
        if once:
            return outcome
        now = clock()
        wake = min(next_slot(spec, now) for spec in specs)
        sleep(min(max_sleep_s, max(1.0, wake - now)))


def once_summary(specs: Sequence[JobSpec], outcome: dict[str, str],
                 clock: Clock = time.time) -> list[str]:
    """One line per job for ``elmo jobs schedule --once``: what happened and when the job is
    next due, so a pass in which nothing was due still says so."""
    lines = []
    for spec in specs:
        what = outcome.get(spec.name, "not checked")
        next_due = fmt_time(next_slot(spec, clock()), spec.timezone)
        if what == "not due":
            runs = _history(spec)
            last = (f"last run {fmt_time(runs[-1].started_at, spec.timezone)} "
                    f"({runs[-1].status})" if runs else "no runs yet")
            lines.append(f"{spec.name}: not due ({last}); next due {next_due}")
        else:
            lines.append(f"{spec.name}: {what}; next due {next_due}")
    return lines


@dataclass
class JobStatus:
    name: str
    schedule: str | None
    last: RunRecord | None
    last_ok: RunRecord | None
    next_due: float | None
    due_now: bool
    lag_s: float  # how long a due slot has waited; 0 when up to date
    runs: list[RunRecord]

    def to_dict(self) -> dict:
        return {"job": self.name, "schedule": self.schedule,
                "last": vars(self.last) if self.last else None,
                "last_ok_end": self.last_ok.ended_at if self.last_ok else None,
                "next_due": self.next_due, "due_now": self.due_now, "lag_s": self.lag_s,
                "runs": [vars(r) for r in self.runs]}


def job_status(spec: JobSpec, now: float, n_runs: int = 5) -> JobStatus:
    runs = _history(spec)
    last = runs[-1] if runs else None
    last_ok = next((r for r in reversed(runs) if r.status in ("ok", "no-changes")), None)
    next_due, due_now, lag = None, False, 0.0
    if spec.schedule:
        due_now = is_due(spec, runs, now)
        slot = previous_slot(spec, now)
        lag = now - slot if due_now else 0.0
        next_due = slot if due_now else next_slot(spec, now)
    return JobStatus(spec.name, spec.schedule, last, last_ok, next_due, due_now, lag,
                     runs[-n_runs:])


def status_lines(status: JobStatus, tz: str = "UTC", now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    lines = [f"{status.name}  schedule: {status.schedule or '(none)'} ({tz})"]
    if status.schedule:
        when = "now (overdue)" if status.due_now else fmt_time(status.next_due, tz)
        lines.append(f"  next due: {when}   lag: {fmt_duration(status.lag_s)}")
    if status.last_ok is not None:
        lines.append(f"  last good run ended {fmt_duration(now - (status.last_ok.ended_at or now))}"
                     " ago")
    if not status.runs:
        lines.append("  no runs yet")
    for run in reversed(status.runs):
        files = ", ".join(f"{v} {k}" for k, v in run.files.items() if v) or "-"
        lines.append(f"  {run.run_id}  {run.status:<10} {run.trigger:<8} "
                     f"start {fmt_time(run.started_at, tz)}  took {fmt_duration(run.duration_s)}"
                     f"  files: {files}  docs {run.documents}  tokens {run.tokens}"
                     f"  errors {run.errors}")
        if run.message:
            lines.append(f"      {run.message.splitlines()[0][:200]}")
    return lines


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> float:
    """Epoch seconds of a UTC wall time (handy for fake clocks)."""
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()
