"""The hourly rollups (issue 29, reports as fast as pages): a report over rolled-up hours is the report
computed from the allocations, samples and transitions themselves, to the cent and the ten-thousandth
of a device-hour, partial hours at the window's edges included; and the cycle's commit keeps them."""

from datetime import timedelta

from broker.costs import pending, report, rolling, rollup
from broker.costs.models import CostRollup, DeviceClassPrice, PendingRollup, RollupProgress
from broker.costs.pending import pending_report
from broker.costs.report import allocation_report, chargeback
from broker.workloads.models import ExplanationChange
from broker.workloads.states import State
from tests.costs.helpers import NOV, hold, release, sample, submit
from tests.costs.test_lifecycle import devices, story

H = timedelta(hours=1)
M = timedelta(minutes=1)
NOW = NOV + 30 * H


def busy_history(cluster):
    """The lifecycle story, plus what splits hours inside: a price change at 4:20, a sample at 1:40 with
    unhealthy and reserved devices, and a waiting job explained anew at 6:10 that never runs."""
    story(cluster)
    DeviceClassPrice.objects.create(
        device_class=cluster.h100, price_per_hour="5.5000", effective_from=NOV + 4 * H + 20 * M
    )
    sample(cluster.h100, NOV + H + 40 * M, total=16, unhealthy=1, stranded=2, reserved={"team-b": 3})
    waiting = submit(cluster.queue_b, name="waiter", replicas=3, devices_per_pod=2, at=NOV + 4 * H + 7 * M)
    waiting.transition(State.PENDING, at=NOV + 4 * H + 7 * M)
    ExplanationChange.objects.create(workload=waiting, reason="InsufficientCapacity", message="full", at=NOV + 5 * H)
    ExplanationChange.objects.create(workload=waiting, reason="Priority", message="held", at=NOV + 6 * H + 10 * M)
    long_run = submit(cluster.queue_b, name="long", replicas=1, devices_per_pod=2, at=NOV + 6 * H + 33 * M)
    long_run.transition(State.PENDING, at=NOV + 6 * H + 33 * M)
    long_run.transition(State.ADMITTED, at=NOV + 7 * H + 5 * M)
    held = hold(long_run, devices(cluster, 3, 2), cluster.h100, NOV + 7 * H + 5 * M)
    long_run.transition(State.RUNNING, at=NOV + 7 * H + 5 * M)
    release(held, NOV + 9 * H + 50 * M)
    long_run.transition(State.SUCCEEDED, at=NOV + 9 * H + 50 * M)
    server = submit(cluster.queue_a, name="server", resource_class=cluster.inference, at=NOV - 2 * H)
    server.transition(State.PENDING, at=NOV - 2 * H)
    server.transition(State.ADMITTED, at=NOV - 2 * H)
    hold(server, devices(cluster, 3, 3)[2:], cluster.h100, NOV - 2 * H)
    server.transition(State.RUNNING, at=NOV - 2 * H)


WINDOWS = [
    (NOV + 17 * M, NOV + 10 * H + 41 * M),  # partial hours at both edges
    (NOV - 3 * H, NOV + 40 * H),  # past `now` at the end
    (NOV + 2 * H, NOV + 9 * H),  # whole hours only
]


def reports(cluster):
    out = []
    for start, end in WINDOWS:
        for step in ("hour", "day"):
            for aggregate in (("team",), ("queue",), ("resource_class",), ("cost_label",), ("team", "device_class")):
                out.append(allocation_report(start, end, aggregate=aggregate, step=step, now=NOW, share_idle=True))
            out.append(allocation_report(start, end, aggregate=("queue",), step=step, now=NOW, top=1))
            for aggregate in (("team",), ("queue",), ("reason",), ("device_class", "reason")):
                out.append(pending_report(start, end, aggregate=aggregate, step=step, now=NOW))
            out.append(pending_report(start, end, step=step, now=NOW, team_ids=[cluster.team_b.pk]))
    out.append(chargeback(NOV, NOV + 31 * 24 * H, now=NOW))
    return out


def test_it_reports_the_same_from_rolled_up_hours_as_from_the_history(cluster, monkeypatch):
    busy_history(cluster)
    one_line_per_workload = report.direct_ledger
    with monkeypatch.context() as patched:
        patched.setattr(
            report,
            "direct_ledger",
            lambda steps, now, prices, grouped, names=None: one_line_per_workload(steps, now, prices),
        )
        every_workload = pending.direct_ledger
        patched.setattr(
            pending,
            "direct_ledger",
            lambda steps, now, prices, team_ids, listed, names=None: every_workload(
                steps, now, prices, team_ids, listed=True
            ),
        )
        direct = reports(cluster)
    assert reports(cluster) == direct, "work held all along, summed per group, costs the same"
    assert rolling.catch_up(NOW, batches=6) == {"costs": 31, "pending": 31}
    assert rollup.covered(rollup.COSTS, WINDOWS[0][0], WINDOWS[0][1], NOW) == (NOV + H, NOV + 10 * H)
    assert CostRollup.objects.filter(category="reserved_unused", reserved_team="team-b").exists()
    assert PendingRollup.objects.filter(reason="Priority").exists()
    assert reports(cluster) == direct


def test_it_reads_the_rollup_for_the_hours_it_covers(cluster):
    """Not a second direct computation: a rolled-up hour's rows are what the report shows."""
    busy_history(cluster)
    rolling.catch_up(NOW, batches=6)
    by_class = {"aggregate": ("resource_class",), "step": "hour", "now": NOW}
    before = allocation_report(NOV, NOV + 8 * H, **by_class)
    assert before["steps"][1]["allocations"]["distributed-training"]["cost"] == 16
    CostRollup.objects.filter(hour=NOV + H, category="allocated").delete()
    after = allocation_report(NOV, NOV + 8 * H, **by_class)
    assert "distributed-training" not in after["steps"][1]["allocations"]
    assert after["steps"][5] == before["steps"][5]


def test_it_rolls_up_only_hours_past_the_late_writes_margin(cluster):
    busy_history(cluster)
    now = NOV + 5 * H + 3 * M
    assert rolling.catch_up(now) == {"costs": 6, "pending": 6}  # from 22:00, the server's first hour
    assert RollupProgress.objects.get(name=rollup.COSTS).until == NOV + 4 * H
    assert rolling.catch_up(now + 3 * M) == {"costs": 1, "pending": 1}
    assert rolling.catch_up(now + 4 * M) == {"costs": 0, "pending": 0}


def test_it_starts_the_rollup_at_the_first_row(cluster):
    """Nothing billed yet: nothing to roll up, and what comes later is rolled from its own hour on."""
    assert rolling.catch_up(NOV) == {"costs": 0, "pending": 0}
    assert RollupProgress.objects.get(name=rollup.PENDING).until == NOV - H


def test_it_splits_a_raw_amount_beyond_64_bits_exactly(cluster):
    raw = 100_000 * 3_600_000_000 * 99_999  # 100,000 devices for an hour at 9.9999 an hour
    assert raw > 2**63
    high, low = rollup.split_raw(raw)
    assert (high << rollup.RAW_SPLIT) + low == raw


def test_it_rolls_up_in_the_periodic_task_not_in_the_cycles_commit(cluster, django_capture_on_commit_callbacks):
    from django.utils import timezone

    from broker.costs import tasks
    from broker.cycle.runner import run_once

    job = submit(
        cluster.queue_a, name="earlier", devices_per_pod=2, resource_class=cluster.training, at=timezone.now() - 6 * H
    )
    # Six hours back, so at least five whole hours lie before the rollup's late-write margin whatever
    # minute of the hour the test runs at (five hours back gave four between :00 and :05).
    job.transition(State.PENDING, at=timezone.now() - 6 * H)
    with django_capture_on_commit_callbacks(execute=True):
        assert run_once() is not None
    assert not RollupProgress.objects.exists(), "the cycle's path rolls nothing up"

    assert tasks.roll_up()["pending"] >= 5
    progress = RollupProgress.objects.get(name=rollup.PENDING).until
    assert progress == rollup.hour_floor(timezone.now() - rolling.LATE_WRITES)
    assert PendingRollup.objects.filter(team_id=cluster.team_a.pk).count() >= 4


def test_it_runs_the_catch_up_from_celery_beat(settings):
    from broker.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["cost-rollups"]
    assert entry["task"] == "broker.costs.tasks.roll_up" in app.tasks
    assert entry["schedule"] == settings.ROLLUP_INTERVAL_SECONDS


def test_it_reports_the_same_while_the_rollup_lags_behind(cluster):
    """Whole hours past but not rolled up yet are read from the history: a lagging rollup changes nothing."""
    busy_history(cluster)
    expected = reports(cluster)
    assert rolling.catch_up(NOW) == {"costs": rolling.HOURS_PER_BATCH, "pending": rolling.HOURS_PER_BATCH}
    lagging_until = RollupProgress.objects.get(name=rollup.COSTS).until
    assert lagging_until < rollup.hour_floor(NOW) - 20 * H
    assert rollup.covered(rollup.PENDING, WINDOWS[0][0], WINDOWS[0][1], NOW) == (NOV + H, lagging_until)
    assert reports(cluster) == expected


def test_it_catches_up_a_long_history_a_bounded_number_of_hours_per_call(cluster):
    busy_history(cluster)
    assert rolling.catch_up(NOW) == {"costs": rolling.HOURS_PER_BATCH, "pending": rolling.HOURS_PER_BATCH}
    assert RollupProgress.objects.get(name=rollup.COSTS).until == NOV - 2 * H + rolling.HOURS_PER_BATCH * H
    assert rolling.catch_up(NOW)["costs"] == rolling.HOURS_PER_BATCH


def test_it_catches_up_in_the_embedded_loop_at_start_and_then_every_interval(cluster, settings, monkeypatch):
    """Without Celery the embedded default's loop does what beat does: both rollups, as often."""
    from django.utils import timezone

    from broker.cycle import embedded
    from broker.metrics import tasks as metrics_tasks
    from broker.metrics.models import PendingSecondsProgress

    settings.ROLLUP_INTERVAL_SECONDS = 60
    job = submit(cluster.queue_a, name="earlier", devices_per_pod=2, at=timezone.now() - 5 * H)
    job.transition(State.PENDING, at=timezone.now() - 5 * H)
    ExplanationChange.objects.create(workload=job, reason="Priority", message="held", at=timezone.now() - 5 * H)
    monkeypatch.setattr(embedded, "run_once", lambda: None)  # this test is about the rollup step
    runner = embedded.Runner(interval=1)
    runner.step(embedded.get_executor())

    reached = rollup.hour_floor(timezone.now() - rolling.LATE_WRITES)
    assert RollupProgress.objects.get(name=rollup.PENDING).until == reached
    assert PendingSecondsProgress.reached() == reached
    now = timezone.now()
    assert runner.roll_up_when_due(now + M / 2) is None
    assert runner.roll_up_when_due(now + 2 * M) == {
        "costs": {"costs": 0, "pending": 0},
        "pending_seconds": 0,
    }

    def broken():
        raise RuntimeError("cost rollup broken")

    monkeypatch.setattr(embedded.cost_tasks, "roll_up", broken)
    monkeypatch.setattr(metrics_tasks, "roll_up", lambda: 7)
    assert runner.roll_up_when_due(now + 3 * rollup.HOUR) == {"pending_seconds": 7}
