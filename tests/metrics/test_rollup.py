"""The hourly rollup of the seconds waited by reason gives exactly what the walk over all history gives."""

from datetime import timedelta

from django.utils import timezone

from broker.cycle.executor import SimulatedExecutor
from broker.cycle.runner import run_once
from broker.metrics import queries, rolling
from broker.metrics.models import PendingSecondsProgress, PendingSecondsRollup
from broker.workloads.states import State
from tests.cycle.helpers import pending
from tests.metrics.conftest import admit_and_run, explain, submitted
from tests.metrics.test_prometheus import DT, LRT, key, scrape, series


def direct(now):
    return queries.pending_seconds_by_reason(now, rolled=False)


def rolled_until():
    return PendingSecondsProgress.reached()


def test_it_rolls_up_the_history_to_exactly_the_direct_seconds(history):
    now = timezone.now()
    expected = direct(now)

    hours = rolling.catch_up(now, batches=1000)

    # Ten days of whole hours, the history's first hour on.
    assert hours == (rolled_until() - history.t0.replace(minute=0, second=0)) // timedelta(hours=1)
    assert hours >= 239
    assert PendingSecondsRollup.objects.filter(reason="QuotaExceeded", us__gt=0).exists()
    # The walk since the rollup sees only the workloads that may still be waiting after it.
    since = queries.pending_us_by_reason(now, rolled_until())
    assert {reason for reason, _, _ in since} == {"QuotaExceeded", "InvalidRequest"}
    assert queries.pending_seconds_by_reason(now) == expected


def test_it_scrapes_the_rolled_up_hours(history, client):
    rolling.catch_up(timezone.now(), batches=1000)

    held = series(scrape(client), "capacity_broker_pending_seconds_total")

    # Worked out by hand (conftest): every one of these stretches lies in the rolled-up hours.
    assert held[key(reason="TopologyFragmented", team="team-a", resource_class=DT)] == 200
    assert held[key(reason="InsufficientCapacity", team="team-a", resource_class=DT)] == 540 + 200
    assert held[key(reason="Preempted", team="team-b", resource_class=DT)] == 100
    assert held[key(reason="NotEntitled", team="team-b", resource_class=LRT)] == 500


def test_it_stays_exact_while_the_history_grows_past_the_rollup(history, cluster):
    now = timezone.now()
    rolling.catch_up(now, batches=1000)
    stuck, toobig = history.workloads["stuck"], history.workloads["toobig"]

    # After the rollup: a stuck workload gets a new reason then runs; a new one waits; one is cancelled.
    explain(stuck, "Priority", now + timedelta(minutes=10))
    admit_and_run(stuck, cluster.h100, now + timedelta(minutes=70))
    late = submitted(cluster.queue_a, "late", cluster.training, now + timedelta(minutes=20))
    explain(late, "InsufficientCapacity", now + timedelta(minutes=20))
    toobig.transition(State.CANCELLED, at=now + timedelta(minutes=30))
    # A reason at the very moment its workload leaves the queue: a series of no time, still shown.
    explain(late, "Preempted", now + timedelta(minutes=150))
    late.transition(State.CANCELLED, at=now + timedelta(minutes=150))

    for later in (now + timedelta(minutes=40), now + timedelta(hours=3), now + timedelta(hours=30)):
        rolling.catch_up(later, batches=1)
        assert queries.pending_seconds_by_reason(later) == direct(later)
    assert rolled_until() > now + timedelta(hours=24)
    assert {"reason": "Preempted", "team": "team-a", "resource_class": "distributed-training", "seconds": 0.0} in (
        direct(now + timedelta(hours=30))
    )


def test_it_matches_the_direct_seconds_after_cycles_and_a_restart_from_empty(cluster):
    training = cluster.training
    first = pending(cluster.queue_a, "first", 2, 4, resource_class=training, expected_duration_seconds=600)
    pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=training)
    run_once()
    executor = SimulatedExecutor(speed=1)
    started = timezone.now()
    executor.start([first.pk], started)
    pending(cluster.queue_a, "second", 4, 4, resource_class=training, expected_duration_seconds=600)
    run_once()
    executor.advance(started + timedelta(seconds=601))
    run_once()
    later = timezone.now() + timedelta(hours=2)
    expected = direct(later)
    assert {row["reason"] for row in expected} >= {"InvalidRequest"}

    assert rolling.catch_up(later) >= 1
    assert PendingSecondsRollup.objects.exists()
    assert queries.pending_seconds_by_reason(later) == expected

    rolling.forget()
    assert queries.pending_seconds_by_reason(later) == expected
    rolling.catch_up(later)
    assert queries.pending_seconds_by_reason(later) == expected


def test_it_starts_the_rollup_in_the_periodic_task_not_in_the_cycles_commit(
    cluster, django_capture_on_commit_callbacks
):
    from broker.metrics import tasks

    pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)
    with django_capture_on_commit_callbacks(execute=True):
        run_once()
    assert rolled_until() is None, "the cycle's path rolls nothing up"

    assert tasks.roll_up() == 0
    # Nothing whole is past yet: the rollup starts at the hour of the first change and waits there.
    assert rolled_until() == (timezone.now() - rolling.LATE_WRITES).replace(minute=0, second=0, microsecond=0)


def test_it_runs_the_catch_up_from_celery_beat(settings):
    from broker.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["pending-seconds-rollup"]
    assert entry["task"] == "broker.metrics.tasks.roll_up" in app.tasks
    assert entry["schedule"] == settings.ROLLUP_INTERVAL_SECONDS


def test_it_scrapes_the_same_while_the_rollup_lags_behind(history):
    """Whole hours past but not rolled up yet are walked from the history: a lagging rollup changes nothing."""
    now = timezone.now()
    expected = direct(now)
    assert rolling.catch_up(now, batches=2) == 2 * rolling.HOURS_PER_BATCH
    assert rolled_until() < now - timedelta(days=7)
    assert queries.pending_seconds_by_reason(now) == expected


def test_it_carries_the_progress_over_from_the_costs_table(db):
    """Migration 0002: the progress kept under the costs' progress table moves to its own, unchanged."""
    import importlib

    from django.apps import apps

    from broker.costs.models import RollupProgress

    migration = importlib.import_module("broker.metrics.migrations.0002_pending_seconds_progress")
    until = timezone.now().replace(minute=0, second=0, microsecond=0)
    RollupProgress.objects.create(name="pending_seconds", until=until)
    RollupProgress.objects.create(name="costs", until=until - timedelta(hours=3))

    migration.carry_over(apps, None)

    assert PendingSecondsProgress.reached() == until
    assert list(RollupProgress.objects.values_list("name", flat=True)) == ["costs"]
    migration.carry_back(apps, None)
    assert RollupProgress.objects.get(name="pending_seconds").until == until
