"""Retention of the scheduling history (broker/cycle/retention.py, `manage.py prune_history`)."""

import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.costs.models import CapacitySample
from broker.cycle import retention, tasks
from broker.workloads.models import (
    Allocation,
    Explanation,
    ExplanationChange,
    SchedulingCycle,
    WorkloadTransition,
)
from broker.workloads.states import State
from tests.cycle.helpers import pending, rack_devices, running

ROOT = Path(__file__).resolve().parent.parent.parent
Outcome = SchedulingCycle.Outcome


@pytest.fixture
def now():
    return timezone.now()


def cycle_at(at, outcome=Outcome.COMMITTED, cluster="default"):
    return SchedulingCycle.objects.create(
        cluster=cluster, started_at=at, finished_at=None if outcome == Outcome.RUNNING else at, outcome=outcome
    )


def ended(queue, name, state, at, actor=None):
    """A workload that went Pending -> ... -> `state` at `at`, through the state machine, with history."""
    workload = pending(queue, name)
    ExplanationChange.objects.create(workload=workload, reason="InsufficientCapacity", message="full", at=at)
    path = {State.SUCCEEDED: [State.ADMITTED, State.RUNNING], State.FAILED: [State.ADMITTED], State.CANCELLED: []}
    for step in [*path[state], state]:
        workload.transition(step, actor=actor, at=at)
    return workload


def history_of(workload):
    return (
        ExplanationChange.objects.filter(workload=workload).count(),
        WorkloadTransition.objects.filter(workload=workload).count(),
    )


def test_it_removes_cycles_older_than_the_retention_and_keeps_recent_ones(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 14
    old = [cycle_at(now - timedelta(days=days)) for days in (30, 20, 15)]
    recent = [cycle_at(now - timedelta(days=days)) for days in (13, 1)]
    latest = cycle_at(now - timedelta(seconds=3))

    counts = retention.prune_history(now)

    assert counts["cycles"] == 3
    assert not SchedulingCycle.objects.filter(pk__in=[c.pk for c in old]).exists()
    assert set(SchedulingCycle.objects.values_list("pk", flat=True)) == {c.pk for c in [*recent, latest]}


def test_it_always_keeps_the_latest_cycle_whatever_its_age(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 1
    oldest = cycle_at(now - timedelta(days=40))
    committed = cycle_at(now - timedelta(days=30))
    failed = cycle_at(now - timedelta(days=20), outcome=Outcome.FAILED)
    # Readers ask by recency: the latest row, the latest committed (dashboard), the latest finished (metrics).
    stuck = cycle_at(now - timedelta(days=10), outcome=Outcome.RUNNING)
    other_cluster = cycle_at(now - timedelta(days=50), cluster="east")

    counts = retention.prune_history(now)

    assert counts["cycles"] == 1
    assert not SchedulingCycle.objects.filter(pk=oldest.pk).exists()
    assert set(SchedulingCycle.objects.values_list("pk", flat=True)) == {
        committed.pk,
        failed.pk,
        stuck.pk,
        other_cluster.pk,
    }


def test_it_keeps_everything_when_the_retention_is_zero(cluster, now, settings, olivia):
    settings.CYCLE_RETENTION_DAYS = 0
    settings.HISTORY_RETENTION_DAYS = 0
    cycles = [cycle_at(now - timedelta(days=days)) for days in (400, 300, 0)]
    workload = ended(cluster.queue_a, "ancient", State.CANCELLED, now - timedelta(days=400), actor=olivia)

    counts = retention.prune_history(now)

    assert counts == {"cycles": 0, "cycle_references": 0, "explanation_changes": 0, "workload_transitions": 0}
    assert SchedulingCycle.objects.count() == len(cycles)
    assert history_of(workload) == (1, 1)


def test_it_removes_the_history_of_workloads_that_ended_before_the_cutoff(cluster, now, settings, olivia):
    settings.HISTORY_RETENTION_DAYS = 90
    long_ago = now - timedelta(days=91)
    done = ended(cluster.queue_a, "done", State.SUCCEEDED, long_ago)
    failed = ended(cluster.queue_a, "failed", State.FAILED, long_ago)
    cancelled = ended(cluster.queue_b, "cancelled", State.CANCELLED, long_ago, actor=olivia)
    lately = ended(cluster.queue_b, "lately", State.SUCCEEDED, now - timedelta(days=89))

    counts = retention.prune_history(now)

    assert counts["explanation_changes"] == 3
    assert counts["workload_transitions"] == 3 + 2 + 1
    for workload in (done, failed, cancelled):
        assert history_of(workload) == (0, 0)
        workload.refresh_from_db()  # the workload itself stays
    assert history_of(lately) == (1, 3)


def test_it_keeps_the_history_of_workloads_that_have_not_finished(cluster, now, settings):
    settings.HISTORY_RETENTION_DAYS = 90
    long_ago = now - timedelta(days=200)
    waiting = pending(cluster.queue_a, "waiting", minutes_ago=200 * 24 * 60)
    ExplanationChange.objects.create(workload=waiting, reason="QuotaExceeded", message="over", at=long_ago)
    # Preempted sets finished_at but is not final: the workload goes back to its queue.
    requeued = pending(cluster.queue_a, "requeued")
    for step in (State.ADMITTED, State.RUNNING, State.PREEMPTED):
        requeued.transition(step, at=long_ago)
    holding = running(cluster.queue_b, "holding", rack_devices("r1")[:1], cluster.h100, submitted_at=long_ago)
    WorkloadTransition.objects.create(workload=holding, from_state=State.ADMITTED, to_state=State.RUNNING, at=long_ago)

    counts = retention.prune_history(now)

    assert counts["explanation_changes"] == counts["workload_transitions"] == 0
    assert history_of(waiting) == (1, 0)
    assert history_of(requeued) == (0, 3)
    assert history_of(holding) == (0, 1)


def test_it_clears_the_references_to_the_cycles_it_removes(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 14
    old = cycle_at(now - timedelta(days=30))
    latest = cycle_at(now - timedelta(minutes=1))
    still_pending = pending(cluster.queue_a, "still-pending")
    Explanation.objects.create(workload=still_pending, cycle=old, reason="InsufficientCapacity", message="full")
    old_change = ExplanationChange.objects.create(workload=still_pending, cycle=old, reason="Priority", message="m")
    new_change = ExplanationChange.objects.create(workload=still_pending, cycle=latest, reason="Priority", message="n")
    holder = running(cluster.queue_b, "holder", rack_devices("r1")[:2], cluster.h100)
    Allocation.objects.filter(workload=holder).update(cycle=old)
    Allocation.objects.filter(workload=holder).filter(pk=Allocation.objects.filter(workload=holder).last().pk).update(
        cycle=latest
    )

    counts = retention.prune_history(now)

    assert counts["cycles"] == 1
    assert counts["cycle_references"] == 1 + 1 + 1
    assert Explanation.objects.get(workload=still_pending).cycle_id is None
    assert ExplanationChange.objects.get(pk=old_change.pk).cycle_id is None
    assert ExplanationChange.objects.get(pk=new_change.pk).cycle_id == latest.pk
    assert sorted(Allocation.objects.filter(workload=holder).values_list("cycle_id", flat=True), key=str) == sorted(
        [None, latest.pk], key=str
    )
    referenced = set()
    for field in retention.cycle_references():
        referenced |= set(field.model.objects.exclude(**{field.name: None}).values_list(field.attname, flat=True))
    assert referenced <= set(SchedulingCycle.objects.values_list("pk", flat=True))


def test_it_knows_every_column_that_names_a_cycle():
    names = {f"{field.model.__name__}.{field.name}" for field in retention.cycle_references()}
    assert names == {"Allocation.cycle", "Explanation.cycle", "ExplanationChange.cycle"}


def test_it_works_through_a_backlog_in_batches(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 14
    settings.HISTORY_RETENTION_DAYS = 90
    SchedulingCycle.objects.bulk_create(
        SchedulingCycle(started_at=now - timedelta(days=20, seconds=i), outcome=Outcome.COMMITTED) for i in range(25)
    )
    latest = cycle_at(now)
    workloads = [ended(cluster.queue_a, f"w{i}", State.CANCELLED, now - timedelta(days=100)) for i in range(7)]

    counts = retention.prune_history(now, batch_size=4)

    assert counts == {"cycles": 25, "cycle_references": 0, "explanation_changes": 7, "workload_transitions": 7}
    assert list(SchedulingCycle.objects.values_list("pk", flat=True)) == [latest.pk]
    assert all(history_of(w) == (0, 0) for w in workloads)


def test_it_changes_nothing_on_a_dry_run(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 14
    settings.HISTORY_RETENTION_DAYS = 90
    old = cycle_at(now - timedelta(days=30))
    cycle_at(now)
    workload = ended(cluster.queue_a, "gone", State.SUCCEEDED, now - timedelta(days=100))
    Explanation.objects.create(workload=pending(cluster.queue_a, "p"), cycle=old, reason="Priority", message="m")

    would = retention.prune_history(now, dry_run=True)

    assert would == {"cycles": 1, "cycle_references": 1, "explanation_changes": 1, "workload_transitions": 3}
    assert SchedulingCycle.objects.count() == 2
    assert Explanation.objects.get().cycle_id == old.pk
    assert history_of(workload) == (1, 3)
    assert retention.prune_history(now) == would


def test_it_leaves_the_audit_log_allocations_and_capacity_samples_alone(cluster, now, settings, olivia):
    settings.CYCLE_RETENTION_DAYS = settings.HISTORY_RETENTION_DAYS = 1
    long_ago = now - timedelta(days=400)
    workload = running(cluster.queue_a, "billed", rack_devices("r1")[:2], cluster.h100)
    Allocation.objects.update(allocated_at=long_ago - timedelta(hours=1), released_at=long_ago)
    workload.transition(State.SUCCEEDED, at=long_ago)
    AuditEvent.objects.create(
        at=long_ago, actor=olivia, actor_name="olivia", action="workload.cancel", target_type="workloads.workload"
    )
    CapacitySample.objects.create(device_class=cluster.h100, at=long_ago, total=16)
    cycle_at(long_ago)
    cycle_at(now)
    before = (AuditEvent.objects.count(), Allocation.objects.count(), CapacitySample.objects.count())

    counts = retention.prune_history(now)

    assert counts["cycles"] == 1 and counts["workload_transitions"] == 1
    assert (AuditEvent.objects.count(), Allocation.objects.count(), CapacitySample.objects.count()) == before


def test_it_runs_daily_from_celery_beat(cluster, now, settings):
    from broker.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["prune-history"]
    assert entry["task"] == "broker.cycle.tasks.prune_history" in app.tasks
    assert entry["schedule"].remaining_estimate(now) <= timedelta(days=1)
    settings.CYCLE_RETENTION_DAYS = 14
    cycle_at(now - timedelta(days=15))
    cycle_at(now)

    assert tasks.prune_history()["cycles"] == 1
    assert SchedulingCycle.objects.count() == 1


def run_command(*args):
    out = StringIO()
    call_command("prune_history", *args, stdout=out)
    return out.getvalue()


def test_it_prints_what_it_removed(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 14
    settings.HISTORY_RETENTION_DAYS = 90
    for days in (30, 20):
        cycle_at(now - timedelta(days=days))
    cycle_at(now)
    ended(cluster.queue_a, "gone", State.CANCELLED, now - timedelta(days=100))

    output = run_command()

    assert "Dry run" not in output
    assert "Scheduling cycles: removed 2 started before" in output
    assert "(CYCLE_RETENTION_DAYS=14; the latest are kept)" in output
    assert "removed 1 explanation changes and 1 state transitions" in output
    assert "(HISTORY_RETENTION_DAYS=90)" in output
    assert SchedulingCycle.objects.count() == 1


def test_it_prints_what_it_would_remove_on_a_dry_run(cluster, now, settings):
    settings.CYCLE_RETENTION_DAYS = 14
    settings.HISTORY_RETENTION_DAYS = 0
    cycle_at(now - timedelta(days=30))
    cycle_at(now)

    output = run_command("--dry-run", "--cycle-days", "7")

    assert output.startswith("Dry run: nothing was changed.")
    assert "Scheduling cycles: would remove 1 started before" in output
    assert "(--cycle-days=7;" in output
    assert "Finished workloads' history: all kept (HISTORY_RETENTION_DAYS=0)." in output
    assert SchedulingCycle.objects.count() == 2


def manage(*args, **env):
    unset = ("DATABASE_URL", "REDIS_URL", "CYCLE_RETENTION_DAYS", "HISTORY_RETENTION_DAYS")
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update(env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=full_env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["--cycle-days", "two"], {}, 2, "argument --cycle-days: expected a whole number of days, 0 or more"),
        (["--history-days=-3"], {}, 2, "argument --history-days: expected a whole number of days, 0 or more"),
        (["--batch-size", "0"], {}, 2, "argument --batch-size: expected a whole number, 1 or more"),
        (["--all"], {}, 2, "unrecognized arguments: --all"),
        ([], {"CYCLE_RETENTION_DAYS": "-1"}, 1, "CYCLE_RETENTION_DAYS must be a whole number of days, 0 or more"),
    ],
)
def test_it_rejects_bad_arguments_in_one_line(tmp_path, args, env, code, message):
    result = manage("prune_history", *args, DATA_DIR=str(tmp_path), **env)

    assert result.returncode == code
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr


def test_it_defaults_to_two_weeks_of_cycles_and_all_of_the_history(tmp_path):
    code = "from django.conf import settings; print(settings.CYCLE_RETENTION_DAYS, settings.HISTORY_RETENTION_DAYS)"
    result = manage("shell", "-c", code, DATA_DIR=str(tmp_path))

    assert result.stdout.strip().splitlines()[-1].split() == ["14", "0"], result.stderr


def test_it_prunes_in_the_embedded_loop_at_start_and_then_once_a_day(cluster, now, settings):
    from broker.cycle.embedded import Runner

    settings.CYCLE_RETENTION_DAYS = 14
    old = cycle_at(now - timedelta(days=30))
    cycle_at(now - timedelta(seconds=3))
    runner = Runner(interval=1)

    assert runner.prune_when_due(now)["cycles"] == 1
    assert not SchedulingCycle.objects.filter(pk=old.pk).exists()
    later = cycle_at(now - timedelta(days=20))
    assert runner.prune_when_due(now + timedelta(hours=23)) is None
    assert SchedulingCycle.objects.filter(pk=later.pk).exists()
    assert runner.prune_when_due(now + timedelta(days=1))["cycles"] == 1
    assert not SchedulingCycle.objects.filter(pk=later.pk).exists()


def test_it_runs_the_retention_as_one_of_the_embedded_loops_steps(cluster, now, settings, monkeypatch):
    from broker.cycle import embedded

    settings.CYCLE_RETENTION_DAYS = 14
    old = cycle_at(now - timedelta(days=30))
    cycle_at(now - timedelta(seconds=3))
    monkeypatch.setattr(embedded, "run_once", lambda: None)  # this test is about the retention step
    embedded.Runner(interval=1).step(embedded.get_executor())

    assert not SchedulingCycle.objects.filter(pk=old.pk).exists()


def test_it_prunes_each_clusters_cycles_under_that_clusters_lock(cluster, now, settings, monkeypatch):
    """Cycles of several clusters in one database: a cluster's rows are cleared while no cycle of that
    cluster runs, whichever cluster the pruning process itself belongs to."""
    settings.CYCLE_RETENTION_DAYS = 14
    for name in ("default", "east"):
        cycle_at(now - timedelta(days=30), cluster=name)
        cycle_at(now - timedelta(days=1), cluster=name)
    locked = []
    real = retention.excluding_cycles

    def recording(cluster_name=None):
        locked.append((cluster_name, sorted(SchedulingCycle.objects.filter(started_at__lt=now - timedelta(days=14))
                                            .values_list("cluster", flat=True))))  # fmt: skip
        return real(cluster_name)

    monkeypatch.setattr(retention, "excluding_cycles", recording)

    assert retention.prune_history(now)["cycles"] == 2
    assert locked == [("default", ["default", "east"]), ("east", ["east"])]
