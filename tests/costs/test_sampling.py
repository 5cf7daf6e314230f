from datetime import timedelta
from decimal import Decimal

from broker.costs.models import CapacitySample
from broker.costs.report import allocation_report
from broker.costs.sampling import record_capacity_sample
from broker.cycle.commit import sample_capacity
from broker.inventory.models import Device, Health
from broker.policy.models import Reservation
from broker.workloads.states import State
from tests.builders import make_workload
from tests.costs.helpers import NOV, hold


def busy_cluster(cluster, at):
    """3 devices held on n1, one unhealthy on n2, 2 reserved for team-b, a waiting 4-device pod."""
    n1, n2 = cluster.nodes[0], cluster.nodes[1]
    running = make_workload(cluster.queue_a, name="running", state=State.RUNNING)
    hold(running, list(n1.devices.order_by("name")[:3]), cluster.h100, at - timedelta(hours=1))
    Device.objects.filter(node=n2, name="0").update(health=Health.UNHEALTHY)
    Reservation.objects.create(
        name="b-hold",
        team=cluster.team_b,
        device_class=cluster.h100,
        count=2,
        start=at - timedelta(days=1),
        end=at + timedelta(days=1),
    )
    make_workload(cluster.queue_b, name="wide", devices_per_pod=4, resource_class=cluster.training, state=State.PENDING)


def test_it_counts_every_device_once_by_what_it_is_doing(cluster):
    busy_cluster(cluster, NOV)
    [row] = sample_capacity(NOV)
    # n1/3 and n2/1 are reserved (device order), n2 keeps 2 free: fewer than the 4 a pod needs.
    assert row == {
        "device_class_id": cluster.h100.pk,
        "total": 16,
        "unhealthy": 1,
        "reserved_unused": 2,
        "stranded": 2,
        "reserved_by_team": {"team-b": 2},
    }


def test_it_calls_nothing_stranded_when_nothing_waits(cluster):
    [row] = sample_capacity(NOV)
    assert (row["total"], row["stranded"], row["unhealthy"]) == (16, 0, 0)


def test_it_calls_free_devices_idle_when_the_waiting_work_wants_another_class(cluster):
    # Stranded is free capacity pending work wants but cannot use because of its shape; capacity nobody
    # waiting wants is idle (it waits for demand, not for a shape).
    from broker.policy.models import DeviceClass

    DeviceClass.objects.create(
        name="l4", selector='device.attributes["gpu.example.com"].model == "L4"', price_per_hour="1.00"
    )
    make_workload(cluster.queue_a, name="needs-l4", state=State.PENDING).pod_sets.update(device_classes=["l4"])
    [row] = [r for r in sample_capacity(NOV) if r["device_class_id"] == cluster.h100.pk]
    assert (row["total"], row["stranded"]) == (16, 0)


def test_it_strands_what_the_smallest_waiting_pod_cannot_use(cluster):
    # 3 free on n1, 4 on each other node; the smallest waiting pod wants 4: n1's 3 are stranded.
    running = make_workload(cluster.queue_a, name="running", state=State.RUNNING)
    hold(running, [cluster.nodes[0].devices.get(name="0")], cluster.h100, NOV - timedelta(hours=1))
    make_workload(cluster.queue_b, name="wide", devices_per_pod=4, resource_class=cluster.training, state=State.PENDING)
    make_workload(cluster.queue_b, name="big", devices_per_pod=8, resource_class=cluster.training, state=State.PENDING)
    [row] = sample_capacity(NOV)
    assert (row["total"], row["stranded"]) == (16, 3)


def test_it_strands_nothing_for_a_request_explained_as_invalid(cluster):
    from broker.workloads.models import Explanation

    workload = make_workload(
        cluster.queue_b, name="too-wide", devices_per_pod=8, resource_class=cluster.training, state=State.PENDING
    )
    assert sample_capacity(NOV)[0]["stranded"] == 16  # 8 per pod: no node of 4 can take one
    Explanation.objects.create(workload=workload, reason="InvalidRequest", message="8 per pod, nodes have 4")
    assert sample_capacity(NOV)[0]["stranded"] == 0


def test_it_writes_a_sample_only_when_a_count_changes(cluster):
    assert record_capacity_sample(NOV, sample_capacity(NOV)) == 1
    assert record_capacity_sample(NOV + timedelta(seconds=3), sample_capacity(NOV + timedelta(seconds=3))) == 0
    Device.objects.filter(node=cluster.nodes[3], name="1").update(health=Health.UNHEALTHY)
    assert record_capacity_sample(NOV + timedelta(seconds=6), sample_capacity(NOV + timedelta(seconds=6))) == 1
    assert list(CapacitySample.objects.values_list("unhealthy", flat=True)) == [0, 1]


def test_it_bills_a_sampled_hour_by_category(cluster):
    busy_cluster(cluster, NOV)
    record_capacity_sample(NOV, sample_capacity(NOV))
    report = allocation_report(NOV, NOV + timedelta(hours=1), step="hour", now=NOV + timedelta(days=1))
    totals = report["totals"]
    assert totals["allocated"]["cost"] == Decimal("12.00")
    assert totals["unhealthy"]["cost"] == Decimal("4.00")
    assert totals["reserved_unused"]["cost"] == Decimal("8.00")
    assert totals["reserved_unused_by_team"]["team-b"]["cost"] == Decimal("8.00")
    assert totals["stranded"]["cost"] == Decimal("8.00")
    assert totals["idle"]["cost"] == Decimal("32.00")
    assert totals["total"] == {"device_hours": Decimal("16.0000"), "cost": Decimal("64.00")}
