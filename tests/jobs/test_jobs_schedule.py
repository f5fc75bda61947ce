"""Cron scheduling with a fake clock: due times across day (and month/year) boundaries,
catch-up without replaying every missed slot, and the scheduler loop."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jobs.schedule import is_due, job_status, next_slot, previous_slot, schedule_loop, utc
from jobs.spec import JobSpec, parse_spec
from jobs.state import RunRecord


def make_spec(tmp_path: Path, schedule: str, tz: str = "UTC") -> JobSpec:
    return parse_spec({"source": "corpus/*.txt", "output": str(tmp_path / "ds"),
                       "schedule": schedule, "timezone": tz}, tmp_path / "job.toml")


def run_at(start: float, slot: float | None = None, status: str = "ok") -> RunRecord:
    return RunRecord(run_id=f"r{start}", job="job", trigger="schedule", started_at=start,
                     slot=slot, ended_at=start + 60, status=status)


def test_daily_slot_near_midnight_across_the_day_boundary(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "30 23 * * *")
    now = utc(2026, 11, 21, 23, 45)
    assert previous_slot(spec, now) == utc(2026, 11, 21, 23, 30)
    assert next_slot(spec, now) == utc(2026, 11, 22, 23, 30)
    just_after_midnight = utc(2026, 11, 22, 0, 5)
    assert previous_slot(spec, just_after_midnight) == utc(2026, 11, 21, 23, 30)
    assert next_slot(spec, just_after_midnight) == utc(2026, 11, 22, 23, 30)


def test_slots_just_after_midnight_and_at_year_end(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "15 0 * * *")
    assert next_slot(spec, utc(2026, 12, 31, 23, 50)) == utc(2027, 1, 1, 0, 15)
    assert previous_slot(spec, utc(2027, 1, 1, 0, 10)) == utc(2026, 12, 31, 0, 15)
    every_20 = make_spec(tmp_path, "*/20 * * * *")
    assert next_slot(every_20, utc(2026, 11, 21, 23, 50)) == utc(2026, 11, 22, 0, 0)
    # A slot exactly at `now` is the current slot, and the next one is strictly later.
    assert previous_slot(every_20, utc(2026, 11, 22, 0, 0)) == utc(2026, 11, 22, 0, 0)
    assert next_slot(every_20, utc(2026, 11, 22, 0, 0)) == utc(2026, 11, 22, 0, 20)


def test_cron_in_a_time_zone_crosses_the_utc_day(tmp_path: Path) -> None:
    # 00:30 in Berlin (UTC+1 in November) is 23:30 UTC of the day before.
    spec = make_spec(tmp_path, "30 0 * * *", tz="Europe/Berlin")
    assert next_slot(spec, utc(2026, 11, 21, 12, 0)) == utc(2026, 11, 21, 23, 30)


def test_due_catch_up_once_not_once_per_missed_slot(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, "0 * * * *")  # hourly
    assert is_due(spec, [], utc(2026, 11, 21, 23, 10))  # never ran: due
    runs = [run_at(utc(2026, 11, 21, 20, 0, ), slot=utc(2026, 11, 21, 20, 0))]
    # Three slots were missed while down: one run serves them all.
    now = utc(2026, 11, 21, 23, 10)
    assert is_due(spec, runs, now)
    runs.append(run_at(now, slot=utc(2026, 11, 21, 23, 0)))
    assert not is_due(spec, runs, now + 60)
    assert not is_due(spec, runs, utc(2026, 11, 21, 23, 59))
    assert is_due(spec, runs, utc(2026, 11, 22, 0, 0))  # the midnight slot
    # A manual run after the slot serves it too, and a failed run is not retried each poll.
    runs.append(run_at(utc(2026, 11, 22, 0, 1), status="failed"))
    assert not is_due(spec, runs, utc(2026, 11, 22, 0, 30))


def test_status_reports_next_due_and_lag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    import jobs.schedule as schedule

    spec = make_spec(tmp_path, "0 3 * * *")
    runs = [run_at(utc(2026, 11, 20, 3, 0), slot=utc(2026, 11, 20, 3, 0))]
    monkeypatch.setattr(schedule, "_history", lambda _spec: runs)
    status = job_status(spec, utc(2026, 11, 21, 5, 0))
    assert status.due_now and status.lag_s == 2 * 3600
    assert status.next_due == utc(2026, 11, 21, 3, 0)
    runs.append(run_at(utc(2026, 11, 21, 5, 0), slot=utc(2026, 11, 21, 3, 0)))
    status = job_status(spec, utc(2026, 11, 21, 6, 0))
    assert not status.due_now and status.lag_s == 0
    assert status.next_due == utc(2026, 11, 22, 3, 0)
    text = "\n".join(schedule.status_lines(status, "UTC", utc(2026, 11, 21, 6, 0)))
    assert "next due: 2026-11-22 03:00:00 UTC" in text and "lag: 0s" in text


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if len(self.sleeps) >= 8:
            raise StopIteration  # end the endless loop


def test_scheduler_loop_runs_each_slot_once_across_midnight(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    import jobs.schedule as schedule

    spec = make_spec(tmp_path, "0 0 * * *")  # daily at midnight
    history: list[RunRecord] = []
    monkeypatch.setattr(schedule, "_history", lambda _spec: history)

    def fake_run(spec: JobSpec, *, trigger: str, slot: float, clock: object, echo: bool,
                 due_check: object) -> object:
        record = run_at(clock(), slot=slot)  # type: ignore[operator]
        history.append(record)
        return type("Result", (), {"record": record})()

    monkeypatch.setattr(schedule, "run_job", fake_run)
    clock = FakeClock(utc(2026, 11, 21, 23, 58))
    history.append(run_at(utc(2026, 11, 21, 0, 0), slot=utc(2026, 11, 21, 0, 0)))
    with pytest.raises(StopIteration):
        schedule_loop([spec], clock=clock, sleep=clock.sleep, max_sleep_s=60, echo=False)
    slots = [r.slot for r in history[1:]]
    assert slots == [utc(2026, 11, 22, 0, 0)]  # exactly one run, for the midnight slot
    assert history[1].started_at == utc(2026, 11, 22, 0, 0)  # woke right at the slot
    assert clock.sleeps[:2] == [60, 60]


def test_scheduler_rejects_a_spec_without_schedule(tmp_path: Path) -> None:
    from elmo_model.errors import ElmoUserError

    spec = dataclasses.replace(make_spec(tmp_path, "0 0 * * *"), schedule=None)
    with pytest.raises(ElmoUserError, match="schedule: no cron expression"):
        schedule_loop([spec], once=True, echo=False)


def test_once_summary_says_what_happened_to_every_job(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`elmo jobs schedule --once` printed nothing when no job was due."""
    import jobs.schedule as schedule

    spec = make_spec(tmp_path, "0 3 * * *")
    idle = dataclasses.replace(make_spec(tmp_path, "30 4 * * *"), name="idle")
    history = {spec.name: [run_at(utc(2026, 11, 21, 3, 0), slot=utc(2026, 11, 21, 3, 0))],
               "idle": []}
    monkeypatch.setattr(schedule, "_history", lambda s: history[s.name])
    clock = FakeClock(utc(2026, 11, 21, 5, 0))
    lines = schedule.once_summary([spec, idle], {spec.name: "not due", "idle": "ok"}, clock)
    assert lines == [
        f"{spec.name}: not due (last run 2026-11-21 03:00:00 UTC (ok)); "
        "next due 2026-11-22 03:00:00 UTC",
        "idle: ok; next due 2026-11-22 04:30:00 UTC",
    ]
