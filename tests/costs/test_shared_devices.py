"""Shared devices in the bill (issue 26): a device several allocations share is billed once, each
allocation its share (what it consumes of the device's capacity), and what the shares leave of it is
free capacity, so finance's categories still add up to the capacity it bills."""

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest

from broker.costs import rolling
from broker.costs.models import CapacitySample, CostRollup
from broker.costs.pending import pending_report
from broker.costs.report import allocation_report
from broker.costs.sampling import record_capacity_sample
from broker.costs.ticker import running_cost
from broker.cycle.commit import sample_capacity
from broker.inventory.models import Device
from broker.policy.models import SharingRule
from broker.workloads.models import Allocation, PodSet
from broker.workloads.states import State
from tests.builders import make_resource_class
from tests.costs.helpers import NOV, submit

H = timedelta(hours=1)


@pytest.fixture
def sliced(cluster):
    """The cluster with n1/0 shared by capacity (80Gi of memory, time-sliced) and a class to share it."""
    device = Device.objects.get(node=cluster.nodes[0], name="0")
    device.capacity = {"memory": "80Gi"}
    device.allow_multiple_allocations = True
    device.save()
    cluster.shared_device = device
    cluster.time_sliced = make_resource_class(
        "time-sliced",
        cluster.training.priority_class,
        [cluster.h100],
        sharing=SharingRule.TIME_SLICED,
    )
    return cluster


def share(cluster, name, queue, memory, start, end=None):
    """A running workload holding `memory` of the shared device from `start` to `end`."""
    workload = submit(queue, name, start, resource_class=cluster.time_sliced, state=State.RUNNING)
    workload.pod_sets.update(capacity={"memory": memory})
    return Allocation.objects.create(
        workload=workload,
        device=cluster.shared_device,
        device_class=cluster.h100,
        pod_set="main",
        pod_index=0,
        allocated_at=start,
        released_at=end,
        consumed_capacity={"memory": memory},
    )


def sampled(at):
    record_capacity_sample(at, sample_capacity(at))
    return CapacitySample.objects.filter(at=at).first() or CapacitySample.objects.order_by("-at").first()


def hour_report(aggregate=("team",), now=NOV + 2 * H):
    return allocation_report(NOV, NOV + H, aggregate=aggregate, step="hour", now=now)


def assert_categories_add_up(totals, device_hours, cost):
    categories = ("allocated", "idle", "stranded", "unhealthy", "reserved_unused")
    assert sum(totals[name]["device_hours"] for name in categories) == totals["total"]["device_hours"] == device_hours
    assert sum(totals[name]["cost"] for name in categories) == totals["total"]["cost"] == cost
    assert sum(row["cost"] for row in totals["allocations"].values()) == totals["allocated"]["cost"]


def test_it_bills_two_halves_of_a_shared_device_one_device_hour_in_all(sliced):
    halves = [
        share(sliced, "half-a", sliced.queue_a, "40Gi", NOV),
        share(sliced, "half-b", sliced.queue_b, "40Gi", NOV),
    ]
    row = sampled(NOV)
    assert (row.total, row.shared) == (16, {})  # the shared device once, nothing of it left
    Allocation.objects.filter(pk__in=[a.pk for a in halves]).update(released_at=NOV + H)
    totals = hour_report()["totals"]
    half_hour = {"device_hours": Decimal("0.5000"), "cost": Decimal("2.00")}
    assert totals["allocations"] == {"team-a": half_hour, "team-b": half_hour}
    assert totals["allocated"] == {"device_hours": Decimal("1.0000"), "cost": Decimal("4.00")}
    assert totals["idle"] == {"device_hours": Decimal("15.0000"), "cost": Decimal("60.00")}
    # 16 devices for an hour at 4.00: the shared one is billed once, not once per workload.
    assert_categories_add_up(totals, Decimal("16.0000"), Decimal("64.00"))


def test_it_bills_what_a_share_leaves_of_the_device_as_idle(sliced):
    share(sliced, "quarter", sliced.queue_a, "20Gi", NOV, NOV + H)
    Allocation.objects.update(released_at=None)
    row = sampled(NOV)
    assert (row.total, row.shared) == (16, {"idle": 750_000})
    totals = hour_report()["totals"]
    assert totals["allocations"]["team-a"] == {"device_hours": Decimal("0.2500"), "cost": Decimal("1.00")}
    assert totals["idle"] == {"device_hours": Decimal("15.7500"), "cost": Decimal("63.00")}
    assert_categories_add_up(totals, Decimal("16.0000"), Decimal("64.00"))


def test_it_bills_the_remainder_of_a_failed_shared_device_as_unhealthy(sliced):
    from broker.inventory.models import Health

    share(sliced, "quarter", sliced.queue_a, "20Gi", NOV)
    Device.objects.filter(pk=sliced.shared_device.pk).update(health=Health.UNHEALTHY)
    row = sampled(NOV)
    assert (row.unhealthy, row.shared) == (0, {"unhealthy": 750_000})
    totals = hour_report()["totals"]
    assert totals["unhealthy"] == {"device_hours": Decimal("0.7500"), "cost": Decimal("3.00")}
    assert_categories_add_up(totals, Decimal("16.0000"), Decimal("64.00"))


def test_it_bills_shares_by_workload_and_from_the_rollup_alike(sliced):
    share(sliced, "third-a", sliced.queue_a, "20Gi", NOV)  # a quarter
    share(sliced, "third-b", sliced.queue_b, "30Gi", NOV)  # three eighths
    sampled(NOV)
    # Released a few microseconds past a minute: a share of that is no whole device-microsecond.
    released = NOV + H + 17 * timedelta(minutes=1) + timedelta(microseconds=3)
    Allocation.objects.update(released_at=released)
    sampled(released)
    now = NOV + 6 * H
    window = (NOV, NOV + 3 * H)
    direct = allocation_report(*window, aggregate=("team",), step="hour", now=now)
    by_workload = allocation_report(*window, aggregate=("workload",), step="hour", now=now)
    assert by_workload["totals"]["allocations"]["team-a/third-a"]["device_hours"] == Decimal("0.3208")  # 1/4 x 77 min
    assert rolling.catch_up(now, batches=2)["costs"] > 0
    stored = CostRollup.objects.filter(hour=NOV + H, category="allocated")
    assert {row.device_us_millionths for row in stored} == {750_000, 125_000}  # 3 us x 1/4 and x 3/8
    rolled = allocation_report(*window, aggregate=("team",), step="hour", now=now)
    assert rolled == direct
    assert by_workload["totals"]["total"] == direct["totals"]["total"]
    assert_categories_add_up(direct["totals"], Decimal("48.0000"), Decimal("192.00"))


def test_it_exports_fractional_device_hours_to_the_month_csv(sliced, api_client, fiona):
    share(sliced, "half-a", sliced.queue_a, "40Gi", NOV, NOV + H)
    share(sliced, "half-b", sliced.queue_b, "40Gi", NOV, NOV + H)
    api_client.force_authenticate(fiona)
    text = api_client.get("/api/costs/export.csv", {"month": "2026-11"}).content.decode()
    rows = {row["line"]: row for row in csv.DictReader(io.StringIO(text))}
    assert rows["team-a"]["device_hours"] == rows["team-b"]["device_hours"] == "0.5000"
    assert rows["team-a"]["allocated_cost"] == "2.00"
    body = api_client.get(
        "/api/costs/allocation", {"window": "2026-11-01T00:00:00Z,2026-11-01T01:00:00Z", "step": "hour"}
    ).json()
    assert body["totals"]["allocations"]["team-a"]["device_hours"] == 0.5


def test_it_ticks_the_running_cost_of_a_share(sliced):
    share(sliced, "quarter", sliced.queue_a, "20Gi", NOV)
    tick = running_cost(now=NOV + H)
    assert tick["devices"]["allocated"] == Decimal("0.250000")
    assert tick["per_hour"]["allocated"] == Decimal("1.00")


def test_it_costs_a_waiting_time_slice_by_its_share_of_the_class_s_shared_devices(sliced):
    waiting = submit(sliced.queue_b, "slice", NOV, resource_class=sliced.time_sliced)
    PodSet.objects.filter(workload=waiting).update(capacity={"memory": "20Gi"}, replicas=2)
    waiting.transition(State.PENDING, at=NOV)
    report = pending_report(NOV, NOV + H, step="hour", now=NOV + 2 * H)
    # Two pods, each a quarter of an 80Gi device, for an hour at 4.00.
    assert report["totals"]["pending"]["team-b"] == {"device_hours": Decimal("0.5000"), "cost": Decimal("2.00")}


def test_it_keeps_the_share_a_device_published_when_it_is_republished_with_more_capacity(sliced):
    # A quarter of the 80Gi device for an hour. The driver then publishes 160Gi for it: the hour was
    # still a quarter of the device, in the report read directly, by workload, and from the checkpoint.
    quarter = share(sliced, "quarter", sliced.queue_a, "20Gi", NOV, NOV + H)
    assert quarter.share_millionths == 250_000
    sampled(NOV)
    Device.objects.filter(pk=sliced.shared_device.pk).update(capacity={"memory": "160Gi"})
    totals = hour_report()["totals"]
    assert totals["allocations"]["team-a"] == {"device_hours": Decimal("0.2500"), "cost": Decimal("1.00")}
    by_workload = hour_report(aggregate=("workload",))["totals"]["allocations"]
    assert by_workload["team-a/quarter"]["device_hours"] == Decimal("0.2500")
    assert_categories_add_up(totals, Decimal("16.0000"), Decimal("64.00"))


def test_it_ticks_a_held_share_at_the_part_it_was_given(sliced):
    share(sliced, "quarter", sliced.queue_a, "20Gi", NOV)
    Device.objects.filter(pk=sliced.shared_device.pk).update(capacity={"memory": "40Gi"})
    assert running_cost(now=NOV + H)["devices"]["allocated"] == Decimal("0.250000")


def test_it_reads_a_share_written_without_its_part_against_the_capacity_published(sliced):
    # Rows written past the model (a script, a restore) carry what they consume only.
    quarter = share(sliced, "quarter", sliced.queue_a, "20Gi", NOV, NOV + H)
    Allocation.objects.filter(pk=quarter.pk).update(share_millionths=None)
    Device.objects.filter(pk=sliced.shared_device.pk).update(capacity={"memory": "40Gi"})
    totals = hour_report()["totals"]
    assert totals["allocations"]["team-a"]["device_hours"] == Decimal("0.5000")
