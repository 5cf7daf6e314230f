"""The operator's overview and finance's capacity samples count stranded devices by one definition
(broker.scheduler.accounting): after a committed cycle, they agree class by class."""

from django.urls import reverse

from broker.costs.models import CapacitySample
from broker.cycle.runner import run_once
from broker.workloads.models import Explanation, SchedulingCycle
from broker.workloads.states import State
from tests.builders import make_workload


def overview_and_latest_sample(client, user, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = run_once()
    assert run.outcome == SchedulingCycle.Outcome.COMMITTED
    client.force_login(user)
    capacity = {row["device_class"]: row for row in client.get(reverse("dashboard:overview")).context["capacity"]}
    latest = {}
    for sample in CapacitySample.objects.select_related("device_class").order_by("at"):
        latest[sample.device_class.name] = sample
    return capacity, latest


def test_it_counts_as_many_stranded_devices_as_the_latest_finance_sample(
    client, scene, cluster, alice, django_capture_on_commit_callbacks
):
    # Enough quota that only the shape of the free devices holds big-a back (quota-held work is no demand).
    cluster.queue_a.nominal_quota = {"h100": 16}
    cluster.queue_a.save()
    capacity, latest = overview_and_latest_sample(client, alice, django_capture_on_commit_callbacks)
    assert Explanation.objects.get(workload=scene.a_wait).reason in ("InsufficientCapacity", "TopologyFragmented")
    assert latest["h100"].stranded > 0  # the scene leaves too few free devices per node for big-a's pods
    for name, sample in latest.items():
        assert capacity[name]["stranded"] == sample.stranded, name
        assert capacity[name]["unhealthy"] == sample.unhealthy, name
        assert capacity[name]["reserved"] == sample.reserved_unused, name


def test_it_agrees_that_quota_held_work_strands_nothing(client, scene, alice, django_capture_on_commit_callbacks):
    capacity, latest = overview_and_latest_sample(client, alice, django_capture_on_commit_callbacks)
    assert Explanation.objects.get(workload=scene.a_wait).reason == "QuotaExceeded"
    assert latest["h100"].stranded == capacity["h100"]["stranded"] == 0


def test_it_agrees_that_an_invalid_request_strands_nothing(
    client, scene, cluster, alice, django_capture_on_commit_callbacks
):
    # 16 devices per pod: no node of 4 could ever hold one. The cycle explains it as InvalidRequest, and
    # neither side calls free devices stranded for it.
    too_wide = make_workload(
        cluster.queue_a, "too-wide", devices_per_pod=16, resource_class=cluster.training, state=State.PENDING
    )
    scene.a_wait.transition(State.CANCELLED)
    scene.b_wait.transition(State.CANCELLED)
    capacity, latest = overview_and_latest_sample(client, alice, django_capture_on_commit_callbacks)
    assert Explanation.objects.get(workload=too_wide).reason == "InvalidRequest"
    assert latest["h100"].stranded == capacity["h100"]["stranded"] == 0


def test_it_agrees_on_devices_a_rack_bound_gang_cannot_use(client, cluster, alice, django_capture_on_commit_callbacks):
    """Issue 27: two racks of two 4-device nodes, two devices of each node unhealthy: 4 free per rack,
    8 in all. A gang of 3 × 2 that must stay in one rack fits no rack although every node has room for
    a pod: both sides call the 8 free devices stranded (per-pod fit alone called them free)."""
    from broker.inventory.models import Device, Health

    for node in ("n1", "n2", "n3", "n4"):
        broken = Device.objects.filter(node__name=node).order_by("pk").values_list("pk", flat=True)[:2]
        Device.objects.filter(pk__in=list(broken)).update(health=Health.UNHEALTHY)
    gang = make_workload(
        cluster.queue_a, "rack-gang", replicas=3, devices_per_pod=2, resource_class=cluster.training,
        state=State.PENDING, topology_required="rack",
    )  # fmt: skip
    capacity, latest = overview_and_latest_sample(client, alice, django_capture_on_commit_callbacks)
    assert Explanation.objects.get(workload=gang).reason not in ("QuotaExceeded", "InvalidRequest")
    assert latest["h100"].stranded == capacity["h100"]["stranded"] == 8
