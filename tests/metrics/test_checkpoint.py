"""The checkpoint of the history-walking figures gives exactly what the walk over all history gives, while
history keeps growing after it, and steps aside when the history before it changes."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import generate_latest

from broker.cycle.executor import SimulatedExecutor
from broker.cycle.runner import run_once
from broker.metrics import checkpoint, queries, rolling
from broker.metrics.collector import build_registry
from broker.metrics.models import HistoryCheckpoint, PendingSecondsProgress, WorkloadCheckpoint
from broker.policy.models import ResourceClassDeviceClass
from broker.workloads.models import ExplanationChange
from broker.workloads.states import State
from tests.cycle.helpers import pending
from tests.metrics.conftest import admit_and_run, explain, submitted


@pytest.fixture
def checkpoint_only(monkeypatch):
    """Fail the test if `history` falls back to the direct computation."""
    computed = checkpoint.direct

    def refuse(now):
        raise AssertionError("the checkpoint did not hold")

    monkeypatch.setattr(checkpoint, "direct", refuse)
    return computed


def test_it_gives_the_direct_figures_from_a_fresh_checkpoint(history, checkpoint_only):
    now = timezone.now()
    rolling.catch_up(now, batches=1000)

    assert checkpoint.take(now) > 0

    for later in (now, now + timedelta(seconds=1), now + timedelta(minutes=50)):
        assert checkpoint.history(later) == checkpoint_only(later)
    figures = checkpoint.history(now + timedelta(minutes=50))
    assert {row["kind"] for row in figures["wrong_class"]} == {
        "InvalidRequest",
        "NotEntitled",
        "FallbackUsed",
        "FitsSmallerClass",
    }
    assert figures["waits"] and figures["seconds_by_reason"] and figures["workloads_by_reason"]


def test_it_gives_the_direct_figures_without_a_rollup(history, checkpoint_only):
    now = timezone.now()

    checkpoint.take(now)

    assert HistoryCheckpoint.objects.get().rolled_until is None
    later = now + timedelta(hours=5)
    assert checkpoint.history(later) == checkpoint_only(later)


def test_it_stays_exact_while_the_history_grows_past_the_checkpoint(history, cluster, checkpoint_only):
    now = timezone.now()
    rolling.catch_up(now, batches=1000)
    # Waiting since before the checkpoint and untouched until after the next one.
    waiting = submitted(cluster.queue_b, "waiting", cluster.training, now - timedelta(minutes=10))
    explain(waiting, "InsufficientCapacity", now - timedelta(minutes=10))
    checkpoint.take(now)
    stuck, toobig = history.workloads["stuck"], history.workloads["toobig"]

    # After the checkpoint: a stuck workload gets a new reason then runs; a new one waits, is preempted
    # back into the queue from running and waits again; one is cancelled.
    explain(stuck, "Priority", now + timedelta(minutes=10))
    admit_and_run(stuck, cluster.h100, now + timedelta(minutes=20))
    late = submitted(cluster.queue_a, "late", cluster.training, now + timedelta(minutes=5))
    explain(late, "InsufficientCapacity", now + timedelta(minutes=5))
    admit_and_run(late, cluster.h100, now + timedelta(minutes=15))
    late.transition(State.PREEMPTED, at=now + timedelta(minutes=25))
    late.transition(State.PENDING, at=now + timedelta(minutes=25))
    explain(late, "Preempted", now + timedelta(minutes=25))
    toobig.transition(State.CANCELLED, at=now + timedelta(minutes=30))
    # A reason at the very moment its workload leaves the queue: a series of no time, still shown.
    other = submitted(cluster.queue_b, "other", cluster.inference, now + timedelta(minutes=35))
    explain(other, "NotEntitled", now + timedelta(minutes=40))
    other.transition(State.CANCELLED, at=now + timedelta(minutes=40))

    for later in (now + timedelta(minutes=40), now + timedelta(minutes=50)):
        assert checkpoint.history(later) == checkpoint_only(later)
    seconds = checkpoint.history(now + timedelta(minutes=50))["seconds_by_reason"]
    assert {"reason": "NotEntitled", "team": "team-b", "resource_class": "small-inference", "seconds": 0.0} in (seconds)

    # A new checkpoint after the changes, brought forward from the last: it computes only the four
    # workloads touched since and ends where a checkpoint taken afresh would. Then more changes.
    assert checkpoint.take(now + timedelta(minutes=45)) == 4
    assert stored_totals() == fresh_totals(now + timedelta(minutes=45))
    # `waiting`'s part, stored at the first checkpoint, has grown by 45 minutes when it is taken away.
    late.transition(State.CANCELLED, at=now + timedelta(minutes=55))
    explain(waiting, "Priority", now + timedelta(minutes=50))
    assert checkpoint.history(now + timedelta(minutes=58)) == checkpoint_only(now + timedelta(minutes=58))


def stored_totals():
    return comparable(checkpoint.Totals.from_json(HistoryCheckpoint.objects.get().totals))


def fresh_totals(at):
    """The totals a checkpoint taken afresh at `at` would store."""
    totals = checkpoint.Totals()
    for part in checkpoint.parts(at, PendingSecondsProgress.reached(), queries.menu_heads()).values():
        totals.add(part)
    return comparable(checkpoint.Totals.from_json(totals.as_json()))


def comparable(totals):
    waits = {key: (group.count, group.total_us, group.le) for key, group in totals.waits.items()}
    return totals.seconds, waits, totals.reasons, totals.fallbacks


def test_it_stays_exact_across_cycles_after_the_checkpoint(cluster, checkpoint_only):
    training = cluster.training
    first = pending(cluster.queue_a, "first", 2, 4, resource_class=training, expected_duration_seconds=600)
    pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=training)
    run_once()
    checkpoint.take(timezone.now())

    executor = SimulatedExecutor(speed=1)
    started = timezone.now()
    executor.start([first.pk], started)
    pending(cluster.queue_a, "second", 4, 4, resource_class=training, expected_duration_seconds=600)
    run_once()
    later = timezone.now() + timedelta(minutes=1)
    assert checkpoint.history(later) == checkpoint_only(later)

    checkpoint.take(timezone.now())
    executor.advance(started + timedelta(seconds=601))
    run_once()
    later = timezone.now() + timedelta(minutes=2)
    figures = checkpoint.history(later)
    assert figures == checkpoint_only(later)
    assert {row["outcome"] for row in figures["waits"]} == {"Admitted"}
    assert {row["reason"] for row in figures["seconds_by_reason"]} >= {"InvalidRequest"}


def test_it_is_taken_by_the_periodic_roll_up(history):
    from broker.metrics import tasks

    tasks.roll_up()

    taken = HistoryCheckpoint.objects.get()
    assert taken.taken_at > history.at(6000)
    assert WorkloadCheckpoint.objects.filter(workload_id=history.workloads["stuck"].pk).exists()


def test_it_scrapes_the_same_page_from_the_checkpoint(history):
    now = timezone.now()
    rolling.catch_up(now, batches=1000)
    registry = build_registry(clock=lambda: now + timedelta(minutes=3))
    direct_page = generate_latest(registry)

    checkpoint.take(now)

    assert generate_latest(registry) == direct_page


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda h: h.workloads["denied"].delete(), id="a workload deleted"),
        pytest.param(
            lambda h: ExplanationChange.objects.filter(workload=h.workloads["trainer"], reason="TopologyFragmented")
            .get()
            .delete(),
            id="a change deleted",
        ),
        pytest.param(
            lambda h: ResourceClassDeviceClass.objects.filter(rank=0).update(rank=99),
            id="a class's first device class changed",
        ),
        pytest.param(lambda h: rolling.catch_up(timezone.now(), batches=1000), id="the rollup moved on"),
    ],
)
def test_it_computes_directly_when_the_history_before_it_changed(history, change):
    now = timezone.now()
    checkpoint.take(now)
    taken = HistoryCheckpoint.objects.get()

    change(history)

    later = now + timedelta(minutes=5)
    assert not checkpoint.holds(taken, later, queries.rolled_pending_us(later)[1])
    assert checkpoint.history(later) == checkpoint.direct(later)


def test_it_computes_directly_before_the_checkpoint_and_after_forget(history):
    now = timezone.now()
    checkpoint.take(now)

    earlier = now - timedelta(minutes=1)
    assert not checkpoint.holds(HistoryCheckpoint.objects.get(), earlier, queries.rolled_pending_us(earlier)[1])
    assert checkpoint.history(earlier) == checkpoint.direct(earlier)
    checkpoint.forget()
    assert not HistoryCheckpoint.objects.exists() and not WorkloadCheckpoint.objects.exists()
    assert checkpoint.history(now) == checkpoint.direct(now)


def test_it_reads_again_when_a_checkpoint_is_taken_during_the_scrape(history, monkeypatch, checkpoint_only):
    now = timezone.now()
    checkpoint.take(now)
    stuck = history.workloads["stuck"]
    late = submitted(stuck.queue, "late", stuck.resource_class, now)
    explain(late, "InsufficientCapacity", now + timedelta(minutes=1))
    taken = []
    touched = checkpoint.Touched

    def another_process_takes_one(last):
        # Between the scrape's read of the checkpoint and its read of the parts.
        if not taken:
            taken.append(None)
            taken[0] = checkpoint.take(now + timedelta(minutes=2))
        return touched(last)

    monkeypatch.setattr(checkpoint, "Touched", another_process_takes_one)

    later = now + timedelta(minutes=3)
    assert checkpoint.history(later) == checkpoint_only(later)
    assert taken == [1]
