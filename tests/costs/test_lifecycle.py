"""Attribution survives preemption, re-admission and cancellation in the middle of a step."""

from datetime import timedelta
from decimal import Decimal

from broker.costs.pending import pending_report
from broker.costs.report import allocation_report
from broker.workloads.models import ExplanationChange
from broker.workloads.states import State
from tests.costs.helpers import NOV, hold, release, sample, submit

H = timedelta(hours=1)


def devices(cluster, node, count):
    return list(cluster.nodes[node].devices.order_by("name")[:count])


def story(cluster):
    """team-a's trainer: waits 1 h, runs 2 h on n1, is preempted, waits 2 h, runs 1 h on n3 and succeeds.
    team-b's job runs on n2 from 2:00 and is cancelled at 2:30."""
    trainer = submit(
        cluster.queue_a,
        name="trainer",
        replicas=1,
        devices_per_pod=4,
        resource_class=cluster.training,
        at=NOV,
    )
    ExplanationChange.objects.create(workload=trainer, reason="InsufficientCapacity", message="full", at=NOV)
    trainer.transition(State.PENDING, at=NOV)
    trainer.transition(State.ADMITTED, at=NOV + H)
    first = hold(trainer, devices(cluster, 0, 4), cluster.h100, NOV + H)
    trainer.transition(State.RUNNING, at=NOV + H)
    trainer.transition(State.PREEMPTED, at=NOV + 3 * H)
    release(first, NOV + 3 * H)
    ExplanationChange.objects.create(workload=trainer, reason="Priority", message="held", at=NOV + 3 * H)
    trainer.transition(State.PENDING, at=NOV + 3 * H)
    trainer.transition(State.ADMITTED, at=NOV + 5 * H)
    second = hold(trainer, devices(cluster, 2, 4), cluster.h100, NOV + 5 * H)
    trainer.transition(State.RUNNING, at=NOV + 5 * H)
    trainer.transition(State.SUCCEEDED, at=NOV + 6 * H)
    release(second, NOV + 6 * H)

    job = submit(
        cluster.queue_b,
        name="short",
        replicas=2,
        devices_per_pod=1,
        resource_class=cluster.inference,
        at=NOV + 2 * H,
    )
    job.transition(State.PENDING, at=NOV + 2 * H)
    job.transition(State.ADMITTED, at=NOV + 2 * H)
    held = hold(job, devices(cluster, 1, 2), cluster.h100, NOV + 2 * H)
    job.transition(State.CANCELLED, at=NOV + 2.5 * H)
    release(held, NOV + 2.5 * H)
    sample(cluster.h100, NOV, total=16)
    return trainer, job


def test_it_charges_each_team_only_for_the_time_it_held_devices(cluster):
    story(cluster)
    report = allocation_report(NOV, NOV + 8 * H, aggregate=("team",), step="hour", now=NOV + 30 * H)
    by_hour = [{k: v["cost"] for k, v in step["allocations"].items()} for step in report["steps"]]
    four = Decimal("16.00")  # 4 devices x 4.00
    assert by_hour == [
        {},
        {"team-a": four},
        {"team-a": four, "team-b": Decimal("4.00")},  # 2 devices for half an hour
        {},
        {},
        {"team-a": four},
        {},
        {},
    ]
    assert report["totals"]["allocations"] == {
        "team-a": {"device_hours": Decimal("12.0000"), "cost": Decimal("48.00")},
        "team-b": {"device_hours": Decimal("1.0000"), "cost": Decimal("4.00")},
    }
    for step in report["steps"]:
        totals = step["totals"]
        parts = sum(totals[name]["cost"] for name in ("allocated", "idle", "stranded", "unhealthy", "reserved_unused"))
        assert parts == totals["total"]["cost"] == Decimal("64.00")


def test_it_keeps_a_workload_one_line_across_preemption_and_readmission(cluster):
    story(cluster)
    report = allocation_report(NOV, NOV + 8 * H, aggregate=("workload",), step="day", now=NOV + 30 * H)
    assert report["totals"]["allocations"]["team-a/trainer"]["cost"] == Decimal("48.00")
    assert report["totals"]["allocations"]["team-b/short"]["cost"] == Decimal("4.00")
    assert report["totals"]["idle"]["cost"] == Decimal("8") * 16 * 4 - Decimal("52.00")


def test_it_prices_the_waiting_by_reason_and_never_adds_it_to_the_bill(cluster):
    story(cluster)
    window = (NOV, NOV + 8 * H)
    bill = allocation_report(*window, step="day", now=NOV + 30 * H)
    pending = pending_report(*window, aggregate=("workload", "reason"), step="day", now=NOV + 30 * H)
    assert pending["totals"]["pending"] == {
        "team-a/trainer/InsufficientCapacity": {"device_hours": Decimal("4.0000"), "cost": Decimal("16.00")},
        "team-a/trainer/Priority": {"device_hours": Decimal("8.0000"), "cost": Decimal("32.00")},
    }
    assert bill["totals"]["total"]["cost"] == Decimal("8") * 16 * 4


def test_it_leaves_out_the_waiting_of_a_workload_whose_history_was_pruned(cluster):
    from broker.workloads.models import WorkloadTransition

    story(cluster)
    window = (NOV, NOV + 8 * H)
    # HISTORY_RETENTION_DAYS removed the trainer's transitions and explanation changes: when it waited
    # is no longer known, and it must not be counted as waiting from submission on.
    WorkloadTransition.objects.filter(workload__name="trainer").delete()
    ExplanationChange.objects.filter(workload__name="trainer").delete()
    pending = pending_report(*window, aggregate=("workload", "reason"), step="day", now=NOV + 30 * H)
    assert pending["totals"]["pending"] == {}
