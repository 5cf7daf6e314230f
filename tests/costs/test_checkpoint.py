"""The checkpoint inside the current hour (issue 29, reports as fast as pages): a report that reads the
checkpoint's stretch and bills what was open at it on, correcting the workloads changed since, is the
report computed from the allocations, samples and transitions themselves, to the cent and the
ten-thousandth of a device-hour."""

import random
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from broker.costs import checkpoint, report, rolling, rollup
from broker.costs.models import (
    Checkpoint,
    CheckpointOpen,
    CostCheckpointRow,
    DeviceClassPrice,
    PendingCheckpointRow,
)
from broker.costs.pending import pending_report
from broker.costs.report import allocation_report
from broker.costs.ticker import running_cost
from broker.inventory.models import Device
from broker.policy.models import DeviceClass, SharingRule
from broker.workloads.models import ExplanationChange
from broker.workloads.states import State
from tests.builders import make_resource_class
from tests.costs.helpers import NOV, hold, release, sample, submit
from tests.costs.test_lifecycle import devices
from tests.costs.test_rollup import busy_history

# What PostgreSQL alone does: see other transactions (the checkpoint's safe instant), and run the
# costliest-workloads query. CI runs the suite on PostgreSQL (tests/conftest.py).
postgresql_only = pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL only")

H = timedelta(hours=1)
M = timedelta(minutes=1)
BASE = NOV + 9 * H  # the hourly rollup's `until` in these tests
UNTIL = BASE + 20 * M  # the checkpoint's


def reports(cluster, now):
    out = []
    for start, end in ((NOV - 3 * H, now), (NOV + 2 * H, NOV + 40 * H), (BASE - 30 * M, now + 2 * H)):
        for step in ("hour", "day"):
            for aggregate in (("team",), ("queue",), ("resource_class",), ("team", "device_class")):
                out.append(allocation_report(start, end, aggregate=aggregate, step=step, now=now, share_idle=True))
            out.append(allocation_report(start, end, aggregate=("queue",), step=step, now=now, top=1))
            for top in (1, 2, 50):
                by_workload = {"aggregate": ("workload",), "step": step, "now": now, "top": top}
                out.append(allocation_report(start, end, share_idle=True, workload_detail=True, **by_workload))
            for aggregate in (("team",), ("queue",), ("reason",), ("device_class", "reason")):
                out.append(pending_report(start, end, aggregate=aggregate, step=step, now=now))
            out.append(pending_report(start, end, step=step, now=now, team_ids=[cluster.team_b.pk]))
    out.append(running_cost(now))
    return out


def direct_reports(cluster, now, monkeypatch):
    """The same reports from the history alone: neither the hourly rollup nor the checkpoint is read."""
    with monkeypatch.context() as patched:
        patched.setattr(rollup, "covered", lambda *args: None)
        patched.setattr(checkpoint, "usable", lambda *args: None)
        patched.setattr(report, "costliest_workloads", lambda *args: None)
        return reports(cluster, now)


def differences(got, wanted, path=""):
    """Where two reports differ, as paths with both values: a readable failure for a long report."""
    if isinstance(got, dict) and isinstance(wanted, dict):
        out = []
        for key in sorted(set(got) | set(wanted), key=str):
            out += differences(got.get(key), wanted.get(key), f"{path}/{key}")
        return out
    if isinstance(got, list) and isinstance(wanted, list) and len(got) == len(wanted):
        return [
            line for i, (a, b) in enumerate(zip(got, wanted, strict=True)) for line in differences(a, b, f"{path}[{i}]")
        ]
    return [] if got == wanted else [f"{path}: {got!r} != {wanted!r}"]


def assert_same(got, wanted):
    found = differences(got, wanted)
    assert not found, "\n".join(found[:20])


def roll_up_to_the_checkpoint(until=UNTIL):
    assert rolling.catch_up(BASE + 6 * M, batches=8)["costs"] > 0
    assert rollup.rolled_until(rollup.COSTS) == rollup.rolled_until(rollup.PENDING) == BASE
    assert rolling.take_checkpoint(until + 10 * M, until=until) == {"costs": until, "pending": until}


def test_it_reports_the_same_from_a_checkpoint_as_from_the_history(cluster, monkeypatch):
    """busy_history's long job is released at 9:50, after the checkpoint's 9:20 but written before it
    was taken; after it: a workload admitted, one explained anew, one submitted, one leaving the queue,
    a sample and a price change."""
    busy_history(cluster)
    leaving = submit(
        cluster.queue_b, name="leaving", devices_per_pod=3, resource_class=cluster.training, at=BASE - 40 * M
    )
    leaving.transition(State.PENDING, at=BASE - 40 * M)
    roll_up_to_the_checkpoint()
    assert CheckpointOpen.objects.filter(kind=rollup.COSTS).exists()
    assert CheckpointOpen.objects.get(kind=rollup.PENDING, team_id=cluster.team_b.pk).devices == 3

    late = submit(cluster.queue_a, name="late", replicas=2, resource_class=cluster.inference, at=UNTIL + 5 * M)
    late.transition(State.PENDING, at=UNTIL + 5 * M)
    ExplanationChange.objects.create(workload=late, reason="InsufficientCapacity", message="full", at=UNTIL + 6 * M)
    late.transition(State.ADMITTED, at=UNTIL + 12 * M)
    held = hold(late, devices(cluster, 1, 2), cluster.h100, UNTIL + 12 * M)
    late.transition(State.RUNNING, at=UNTIL + 12 * M)
    release(held[:1], UNTIL + 30 * M)
    waiter = cluster.queue_b.workloads.get(name="waiter")
    ExplanationChange.objects.create(workload=waiter, reason="DeviceUnhealthy", message="sick", at=UNTIL + 8 * M)
    leaving.transition(State.CANCELLED, at=UNTIL + 9 * M)
    sample(cluster.h100, UNTIL + 15 * M, total=16, unhealthy=2, stranded=1, reserved={"team-a": 1})
    DeviceClassPrice.objects.create(device_class=cluster.h100, price_per_hour="6.2500", effective_from=UNTIL + 20 * M)

    for now in (UNTIL + 45 * M, BASE + 2 * H + 7 * M):
        assert_same(reports(cluster, now), direct_reports(cluster, now, monkeypatch))


def test_it_reads_the_checkpoint_not_the_history_before_it(cluster):
    """Not a second direct computation: the checkpoint's rows and open groups are what the report bills."""
    busy_history(cluster)
    stuck = submit(cluster.queue_b, name="stuck", devices_per_pod=2, resource_class=cluster.training, at=BASE - 30 * M)
    stuck.transition(State.PENDING, at=BASE - 30 * M)
    roll_up_to_the_checkpoint()
    now = UNTIL + 40 * M
    by_class = {"aggregate": ("resource_class",), "step": "hour", "now": now}
    before = allocation_report(NOV, NOV + 12 * H, **by_class)
    inference = before["steps"][9]["allocations"]["small-inference"]
    assert inference["device_hours"] == Decimal("1.0000")  # the server's device, held all hour
    CheckpointOpen.objects.filter(kind=rollup.COSTS, resource_class_id=cluster.inference.pk).delete()
    after = allocation_report(NOV, NOV + 12 * H, **by_class)
    assert after["steps"][9]["allocations"]["small-inference"]["device_hours"] == Decimal("0.3333")
    CostCheckpointRow.objects.all().delete()
    assert "small-inference" not in allocation_report(NOV, NOV + 12 * H, **by_class)["steps"][9]["allocations"]

    waiting = pending_report(NOV, NOV + 12 * H, aggregate=("reason",), step="hour", now=now)
    PendingCheckpointRow.objects.all().delete()
    CheckpointOpen.objects.filter(kind=rollup.PENDING).delete()
    assert pending_report(NOV, NOV + 12 * H, aggregate=("reason",), step="hour", now=now) != waiting


def test_it_ignores_a_checkpoint_the_hourly_rollup_has_moved_past(cluster, monkeypatch):
    busy_history(cluster)
    roll_up_to_the_checkpoint()
    now = BASE + H + 8 * M
    assert rolling.catch_up(now) == {"costs": 1, "pending": 1}
    assert checkpoint.usable(rollup.COSTS, BASE + H, now, now) is None
    CostCheckpointRow.objects.update(device_us=0, raw_high=0, raw_low=0)  # would show if it were read
    assert_same(reports(cluster, now), direct_reports(cluster, now, monkeypatch))


def test_it_ignores_the_checkpoint_for_a_report_ending_before_it(cluster):
    busy_history(cluster)
    roll_up_to_the_checkpoint()
    assert checkpoint.usable(rollup.COSTS, BASE, UNTIL + M, UNTIL - M) is None  # `now` before it
    assert checkpoint.usable(rollup.COSTS, BASE, UNTIL - M, UNTIL + M) is None  # the window ends before it
    assert checkpoint.usable(rollup.COSTS, BASE + M, UNTIL + M, UNTIL + M) is None  # starts after its base
    assert checkpoint.usable(rollup.COSTS, BASE, UNTIL + M, UNTIL + M).until == UNTIL


def test_it_ignores_the_checkpoint_on_a_fractional_billing_scale(cluster, settings):
    busy_history(cluster)
    roll_up_to_the_checkpoint()
    settings.SIMULATION_SPEED = 2.5
    assert checkpoint.usable(rollup.COSTS, BASE, UNTIL + M, UNTIL + M) is None


def test_it_takes_no_checkpoint_before_the_hourly_rollup_has_started(cluster):
    assert rolling.take_checkpoint(NOV, until=NOV) == {"costs": None, "pending": None}
    assert not Checkpoint.objects.exists()


def test_it_replaces_the_last_checkpoint(cluster):
    busy_history(cluster)
    roll_up_to_the_checkpoint()
    rows = CostCheckpointRow.objects.count()
    assert rolling.take_checkpoint(UNTIL + 20 * M, until=UNTIL + 10 * M)["costs"] == UNTIL + 10 * M
    assert CostCheckpointRow.objects.count() == rows
    assert Checkpoint.objects.get(name=rollup.COSTS).until == UNTIL + 10 * M


@postgresql_only
def test_it_takes_the_checkpoint_before_the_oldest_open_transaction(cluster):
    """A transaction open elsewhere may still write rows stamped from its start on: the checkpoint stops
    STAMP_LEAD before it, or at `now` less STAMP_LEAD when none is open."""
    import psycopg
    from django.utils import timezone

    now = timezone.now()
    assert checkpoint.safe_until(now, rolling.LATE_WRITES) == now - checkpoint.STAMP_LEAD
    settings_dict = connection.settings_dict
    with psycopg.connect(
        dbname=settings_dict["NAME"],
        user=settings_dict["USER"],
        host=settings_dict["HOST"],
        port=settings_dict["PORT"],
        password=settings_dict["PASSWORD"],
    ) as other:
        other.execute("SELECT 1")  # a transaction is open from here on
        begun = other.execute("SELECT now()").fetchone()[0]
        later = timezone.now() + H
        assert checkpoint.safe_until(later, rolling.LATE_WRITES) == begun - checkpoint.STAMP_LEAD


@postgresql_only
def test_it_takes_the_checkpoint_in_the_periodic_task(cluster):
    from django.utils import timezone

    from broker.costs import tasks

    job = submit(
        cluster.queue_a, name="earlier", devices_per_pod=2, resource_class=cluster.training, at=timezone.now() - 3 * H
    )
    job.transition(State.PENDING, at=timezone.now() - 3 * H)
    tasks.roll_up()
    taken = Checkpoint.objects.get(name=rollup.PENDING)
    assert taken.base == rollup.rolled_until(rollup.PENDING)
    assert timezone.now() - M < taken.until <= timezone.now() - checkpoint.STAMP_LEAD
    assert CheckpointOpen.objects.get(kind=rollup.PENDING).devices == 2


# --- a property: random histories around the checkpoint --------------------------------------------------

REASONS = ("InsufficientCapacity", "Priority", "QuotaExceeded", "TopologyFragmented")
# What a time-sliced pod takes of an 80Gi shared device: a quarter, 0.015063 (1234/81920 floored to the
# millionth) and three eighths.
SLICES = ("20Gi", "1234Mi", "30Gi")


def slicing(cluster):
    """n1/0 shared by memory (80Gi), and a time-sliced resource class on h100 to share it."""
    shared = Device.objects.get(node=cluster.nodes[0], name="0")
    shared.capacity = {"memory": "80Gi"}
    shared.allow_multiple_allocations = True
    shared.save()
    time_sliced = make_resource_class(
        "time-sliced", cluster.training.priority_class, [cluster.h100], sharing=SharingRule.TIME_SLICED
    )
    return shared, time_sliced


def random_history(cluster, seed):
    """(events before the checkpoint is taken, events after): closures in time order. Each of 7 workloads
    is submitted, explained, maybe admitted on devices of its own or on shares of one shared device
    (time-sliced, about two in five), and maybe released, at random times from 50 minutes before the
    hourly rollup's end to 40 minutes after the checkpoint; samples too, some with shared remainders.
    The checkpoint is taken late: some rows stamped after it are written before it is."""
    rng = random.Random(seed)
    a100 = DeviceClass.objects.create(
        name="a100", selector='device.attributes["gpu.example.com"].model == "A100"', price_per_hour="2.5000"
    )
    shared, time_sliced = slicing(cluster)
    sample(cluster.h100, NOV, total=16, shared={"idle": 734_567})
    sample(a100, BASE - 2 * H, total=8, unhealthy=1)
    events = []

    def at(low, high):
        return low + timedelta(seconds=rng.randrange(int((high - low).total_seconds())))

    def remainders():
        return rng.choice(
            [{}, {"idle": rng.randrange(1, 10**6)}, {"stranded": 250_001, "over": rng.randrange(1, 10**6)}]
        )

    free = [device for node in range(4) for device in devices(cluster, node, 4) if device.pk != shared.pk]
    rng.shuffle(free)
    for index in range(7):
        queue = rng.choice([cluster.queue_a, cluster.queue_b])
        resource_class = rng.choice([None, cluster.training, cluster.training, cluster.inference])
        device_class = rng.choice([cluster.h100, a100])
        count = rng.randint(1, 2)
        submitted = at(BASE - 50 * M, UNTIL + 30 * M)
        memory = rng.choice(SLICES) if rng.random() < 0.4 else None
        if memory is not None:
            resource_class, device_class, owned = time_sliced, cluster.h100, None
        else:
            owned = [free.pop() for _ in range(count)]
        state = {}

        def submit_it(i=index, q=queue, rc=resource_class, n=count, t=submitted, s=state, mem=memory):
            s["workload"] = submit(q, name=f"w{i}", replicas=n, devices_per_pod=1, resource_class=rc, at=t)
            if mem is not None:
                s["workload"].pod_sets.update(capacity={"memory": mem})
            s["workload"].transition(State.PENDING, at=t)

        events.append((submitted, submit_it))
        cursor = submitted
        for _ in range(rng.randint(0, 3)):
            cursor = at(cursor, cursor + 25 * M)
            reason = rng.choice(REASONS)
            events.append(
                (cursor, lambda t=cursor, r=reason, s=state: ExplanationChange.objects.create(
                    workload=s["workload"], reason=r, message=r, at=t))
            )  # fmt: skip
        if rng.random() < 0.7:
            admitted = at(cursor, cursor + 30 * M)

            def admit(t=admitted, s=state, d=owned, dc=device_class, mem=memory, n=count):
                s["workload"].transition(State.ADMITTED, at=t)
                if mem is None:
                    s["held"] = hold(s["workload"], d, dc, t)
                else:
                    s["held"] = hold(s["workload"], [shared] * n, dc, t, consumed_capacity={"memory": mem})
                s["workload"].transition(State.RUNNING, at=t)

            events.append((admitted, admit))
            if rng.random() < 0.5:
                released = at(admitted, admitted + 30 * M)

                def finish(t=released, s=state):
                    release(s["held"], t)
                    s["workload"].transition(State.SUCCEEDED, at=t)

                events.append((released, finish))
    for _ in range(rng.randint(0, 3)):
        moment = at(BASE - 30 * M, UNTIL + 40 * M)
        events.append(
            (
                moment,
                lambda t=moment: sample(cluster.h100, t, total=16, stranded=rng.randint(0, 3), shared=remainders()),
            )
        )
    events.sort(key=lambda event: event[0])
    taken_at = UNTIL + timedelta(seconds=rng.choice([0, 0, 90, 600]))
    return [e for e in events if e[0] < taken_at], [e for e in events if e[0] >= taken_at]


def test_it_keeps_the_millionths_of_shares_open_at_the_checkpoint(cluster, monkeypatch):
    """Shares held and requested at the checkpoint are stored as the rollups store amounts, whole devices
    plus millionths, and billed on exactly: two pods of 1234Mi of 80Gi hold 2 x 0.015063 of a device,
    three waiting pods of 20Gi ask for 3 x 0.25."""
    shared, time_sliced = slicing(cluster)
    sample(cluster.h100, NOV, total=16, shared={"idle": 969_874})
    slices = submit(cluster.queue_a, name="slices", replicas=2, resource_class=time_sliced, at=BASE - 40 * M)
    slices.pod_sets.update(capacity={"memory": "1234Mi"})
    slices.transition(State.PENDING, at=BASE - 40 * M)
    slices.transition(State.ADMITTED, at=BASE - 35 * M)
    hold(slices, [shared] * 2, cluster.h100, BASE - 35 * M, consumed_capacity={"memory": "1234Mi"})
    slices.transition(State.RUNNING, at=BASE - 35 * M)
    waiting = submit(cluster.queue_b, name="waiting", replicas=3, resource_class=time_sliced, at=BASE - 30 * M)
    waiting.pod_sets.update(capacity={"memory": "20Gi"})
    waiting.transition(State.PENDING, at=BASE - 30 * M)
    roll_up_to_the_checkpoint()
    held = CheckpointOpen.objects.get(kind=rollup.COSTS)
    asked = CheckpointOpen.objects.get(kind=rollup.PENDING)
    assert (held.team_id, held.devices, held.devices_millionths) == (cluster.team_a.pk, 0, 30_126)
    assert (asked.team_id, asked.devices, asked.devices_millionths) == (cluster.team_b.pk, 0, 750_000)
    now = UNTIL + 30 * M
    by_workload = allocation_report(BASE, now, aggregate=("workload",), step="hour", now=now, top=1)
    assert by_workload["totals"]["allocations"]["team-a/slices"]["device_hours"] == Decimal("0.0251")  # 50 min
    assert_same(reports(cluster, now), direct_reports(cluster, now, monkeypatch))


@pytest.mark.parametrize("seed", range(12))
def test_it_reports_the_same_as_the_history_for_random_histories(cluster, monkeypatch, seed):
    before, after = random_history(cluster, seed)
    for _, write in before:
        write()
    roll_up_to_the_checkpoint()
    for _, write in after:
        write()
    now = UNTIL + 50 * M
    assert_same(reports(cluster, now), direct_reports(cluster, now, monkeypatch))


@postgresql_only
def test_it_ranks_the_costliest_workloads_from_the_allocation_groups(cluster, monkeypatch):
    """The top workloads come from the allocations' groups (report.Pieces), not from a ledger line per
    workload (the equality with that ledger is held by the tests above, whose direct reports turn the
    groups off)."""
    busy_history(cluster)

    def per_workload_ledger(*args, **kwargs):
        raise AssertionError("the top workloads were ranked from the ledger by workload")

    monkeypatch.setattr(report, "keep_costliest", per_workload_ledger)
    ranked = allocation_report(NOV, NOV + 12 * H, aggregate=("workload",), step="day", now=NOV + 30 * H, top=2)
    assert list(ranked["totals"]["allocations"]) == ["(other)", "team-a/server", "team-a/trainer"]
    assert set(ranked["workloads"]) == {"team-a/server", "team-a/trainer"}


@postgresql_only
def test_it_gives_the_cent_of_equal_remainders_to_the_first_keys(cluster, monkeypatch):
    """Six workloads of one amount, admitted at two instants, each 1/6 of a cent and 4 1/6 ten-thousandths
    of a device-hour: the step's cent and its 25th unit go to one of them only, the first by key in byte
    order ("team-a/job-b" < "team-a/jobb"), not the first created nor the first by name alone; a
    workload of a whole 400 cents stays first. The ranked report is the ledger's by workload."""
    nodes = [devices(cluster, node, 4) for node in range(4)]
    held_for = timedelta(milliseconds=1500)
    first, second = NOV + 10 * M, NOV + 20 * M
    tied = []
    for (queue, name), at, device in zip(
        (
            (cluster.queue_a, "jobb"),
            (cluster.queue_b, "aa"),
            (cluster.queue_a, "zz"),
            (cluster.queue_b, "ab"),
            (cluster.queue_a, "job-b"),
            (cluster.queue_a, "w"),
        ),
        (first, first, first, second, second, second),
        nodes[0] + nodes[1][:2],
        strict=True,
    ):
        workload = submit(queue, name=name, at=at)
        hold(workload, [device], cluster.h100, at, at + held_for)
        tied.append(workload)
    big = submit(cluster.queue_b, name="big", at=NOV)
    hold(big, nodes[2][:1], cluster.h100, NOV, NOV + H)
    now = NOV + 3 * H

    def ranked(top):
        return allocation_report(NOV, NOV + 2 * H, aggregate=("workload",), step="hour", now=now, top=top)

    with monkeypatch.context() as patched:
        patched.setattr(report, "keep_costliest", lambda *args: pytest.fail("ranked from the ledger by workload"))
        fast = [ranked(top) for top in (1, 2, 3, 7, 8)]
    with monkeypatch.context() as patched:
        patched.setattr(report, "costliest_workloads", lambda *args: None)
        direct = [ranked(top) for top in (1, 2, 3, 7, 8)]
    assert_same(fast, direct)
    first_hour = fast[1]["steps"][0]["allocations"]
    assert set(first_hour) == {"team-b/big", "team-a/job-b", "(other)"}
    assert first_hour["team-a/job-b"] == {"device_hours": Decimal("0.0005"), "cost": Decimal("0.01")}
    assert first_hour["(other)"] == {"device_hours": Decimal("0.0020"), "cost": Decimal("0.00")}
    assert first_hour["team-b/big"]["cost"] == Decimal("4.00")


@postgresql_only
@pytest.mark.parametrize("speed", [2.5, 0.3])
def test_it_ranks_the_costliest_workloads_on_a_fractional_billing_scale(cluster, monkeypatch, settings, speed):
    """On a fractional simulated clock each piece of an allocation (per step and price) is floored before
    it is billed: the top workloads' pieces are floored as the ledger's stretches are."""
    busy_history(cluster)
    settings.SIMULATION_SPEED = speed
    now = NOV + 30 * H

    def ranked():
        return [
            allocation_report(start, end, aggregate=("workload",), step=step, now=now, top=top, share_idle=True)
            for start, end in ((NOV - 3 * H, now), (NOV + 17 * M, NOV + 10 * H + 41 * M))
            for step in ("hour", "day")
            for top in (1, 2, 50)
        ]

    with monkeypatch.context() as patched:
        patched.setattr(report, "keep_costliest", lambda *args: pytest.fail("ranked from the ledger by workload"))
        fast = ranked()
    with monkeypatch.context() as patched:
        patched.setattr(report, "costliest_workloads", lambda *args: None)
        direct = ranked()
    assert_same(fast, direct)
