"""Claims with several requests end to end on the database (API -> loader -> decide -> commit): 2 GPUs and
a NIC under one PCIe root are allocated to one pod, and a bad claim is refused with a 400."""

import pytest

from broker.cycle.runner import run_once
from broker.inventory.models import Device
from broker.policy.models import DeviceClass, PriorityClass
from broker.workloads.models import Allocation, Explanation, PodSet, Workload
from broker.workloads.services import PodSetRequest, Submission
from broker.workloads.states import State
from tests.api.base import signed_in
from tests.builders import make_resource_class

NIC = 'device.attributes["gpu.example.com"].kind == "nic"'
CLAIM = {
    "requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "h100", "count": 2}},
        {"name": "net", "exactly": {"deviceClassName": "nic"}},
    ],
    "constraints": [{"requests": ["gpu", "net"], "matchAttribute": "gpu.example.com/pcie_root"}],
}


def fabric(cluster):
    """n1's GPUs under roots a (0, 1) and b (2, 3), one NIC under root b; a class offering both, and
    quota for NICs (a claim's NIC counts under its own class)."""
    node = cluster.nodes[0]
    for device in Device.objects.filter(node=node):
        device.attributes = {**device.attributes, "pcie_root": "a" if device.name in ("0", "1") else "b"}
        device.save()
    Device.objects.create(node=node, name="nic0", attributes={"kind": "nic", "pcie_root": "b"})
    nic = DeviceClass.objects.create(name="nic", selector=NIC, price_per_hour="0.10")
    for queue in (cluster.queue_a, cluster.queue_b):
        queue.nominal_quota = {**queue.nominal_quota, "nic": 1}
        queue.save()
    return make_resource_class("fabric", PriorityClass.objects.get(name="batch"), [cluster.h100, nic])


def test_it_allocates_every_request_of_a_claim_under_one_root(cluster, api_client, alice):
    fabric(cluster)
    body = {"name": "pair", "resource_class": "fabric", "pod_sets": [{"name": "main", "replicas": 1, "claim": CLAIM}]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 201, response.data
    workload = Workload.objects.get(pk=response.data["id"])
    assert PodSet.objects.get(workload=workload).claim == CLAIM
    assert response.data["pod_sets"][0]["claim"] == CLAIM

    run_once()

    workload.refresh_from_db()
    assert workload.state == State.ADMITTED
    held = Allocation.objects.filter(workload=workload, released_at__isnull=True)
    assert sorted(held.values_list("device__node__name", "device__name")) == [("n1", "2"), ("n1", "3"), ("n1", "nic0")]


def test_it_refuses_a_claim_whose_constraint_names_an_unknown_request(cluster, api_client, alice):
    fabric(cluster)
    claim = {**CLAIM, "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": "pcie_root"}]}
    body = {"name": "bad", "resource_class": "fabric", "pod_sets": [{"name": "main", "replicas": 1, "claim": claim}]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 400
    message = str(response.data)
    assert "constraint on pcie_root names unknown request 'nic'" in message
    assert not Workload.objects.filter(name="bad").exists()


def test_it_refuses_a_claim_naming_a_class_the_resource_class_does_not_offer(cluster, api_client, alice):
    fabric(cluster)
    body = {
        "name": "bad",
        "resource_class": "distributed-training",
        "pod_sets": [{"name": "main", "replicas": 1, "claim": CLAIM}],
    }
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 400
    assert "does not offer nic" in str(response.data)


def test_it_still_requires_devices_per_pod_without_a_claim(cluster, api_client, alice):
    body = {"name": "plain", "resource_class": "distributed-training", "pod_sets": [{"name": "main", "replicas": 1}]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 400
    assert "devices_per_pod" in str(response.data)


def test_it_calls_a_claim_written_past_the_api_invalid(cluster):
    fabric(cluster)
    workload = Workload.objects.create(name="raw", team=cluster.team_a, queue=cluster.queue_a, state=State.PENDING)
    PodSet.objects.create(workload=workload, name="main", replicas=1, devices_per_pod=1, claim={"requests": [{}]})

    run_once()

    workload.refresh_from_db()
    assert workload.state == State.PENDING
    explanation = workload.explanation
    assert explanation.reason == "InvalidRequest"
    assert "requests[0]: a request needs a name" in explanation.message


def test_it_charges_each_request_of_a_claim_to_its_own_class(cluster):
    """The NIC is allocated (and counted in quota) under the nic class, the GPUs under h100: a queue with
    quota for exactly 2 h100 and 1 nic starts the claim, and the next cycle reads the NIC's usage back."""
    from django.utils import timezone

    from broker.cycle.loader import load_snapshot
    from broker.scheduler.cycle import decide
    from tests.cycle.helpers import pending

    fabric_class = fabric(cluster)
    cluster.queue_a.nominal_quota = {"h100": 2, "nic": 1}
    cluster.queue_a.save()
    cluster.queue_b.nominal_quota = {"h100": 8}  # nothing to lend of nic
    cluster.queue_b.save()
    claimed = pending(cluster.queue_a, "pair", resource_class=fabric_class)
    PodSet.objects.filter(workload=claimed).update(claim=CLAIM)

    run_once()

    held = Allocation.objects.filter(workload=claimed, released_at__isnull=True)
    assert sorted(held.values_list("device__name", "device_class__name")) == [
        ("2", "h100"),
        ("3", "h100"),
        ("nic0", "nic"),
    ]
    snapshot, _ = load_snapshot(timezone.now())
    (running,) = [workload for workload in snapshot.running if workload.id == str(claimed.pk)]
    assert (running.device_class, running.device_classes) == ("h100", (("n1/nic0", "nic"),))
    # A second NIC request is over the nic quota now: the loader counted the first one there.
    nic_only = {"requests": [{"name": "net", "exactly": {"deviceClassName": "nic"}}]}
    second = pending(cluster.queue_a, "nic-only", resource_class=fabric_class)
    PodSet.objects.filter(workload=second).update(claim=nic_only)
    Device.objects.create(node=cluster.nodes[1], name="nic1", attributes={"kind": "nic"})
    snapshot, _ = load_snapshot(timezone.now())
    result = decide(snapshot)
    assert str(second.pk) not in {admission.workload_id for admission in result.admissions}


ALL_AND_APART = {
    "requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "h100", "count": 2}},
        {"name": "net", "exactly": {"deviceClassName": "nic", "allocationMode": "All"}},
    ],
    "constraints": [{"requests": ["gpu"], "distinctAttribute": "gpu.example.com/pcie_root"}],
}


def test_it_allocates_every_nic_and_gpus_under_distinct_roots(cluster, api_client, alice):
    fabric(cluster)
    pod_set = {"name": "main", "replicas": 1, "claim": ALL_AND_APART}
    body = {"name": "apart", "resource_class": "fabric", "pod_sets": [pod_set]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 201, response.data
    workload = Workload.objects.get(pk=response.data["id"])

    run_once()

    workload.refresh_from_db()
    assert workload.state == State.ADMITTED
    held = Allocation.objects.filter(workload=workload, released_at__isnull=True)
    # n1's GPUs 0, 1 sit under root a and 2, 3 under b: one of each; its only NIC, as All takes every one.
    assert sorted(held.values_list("device__node__name", "device__name")) == [("n1", "0"), ("n1", "2"), ("n1", "nic0")]


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            {"requests": [{"name": "net", "exactly": {"deviceClassName": "nic", "allocationMode": "All", "count": 2}}]},
            "requests[0].count: allocationMode All takes every matching device; give no count",
        ),
        (
            {"requests": [{"name": "net", "exactly": {"deviceClassName": "nic", "allocationMode": "Most"}}]},
            "requests[0].allocationMode: ExactCount or All, not 'Most'",
        ),
        (
            {**ALL_AND_APART, "constraints": [{"matchAttribute": "pcie_root", "distinctAttribute": "pcie_root"}]},
            "constraints[0]: give one matchAttribute or one distinctAttribute",
        ),
        (
            {**ALL_AND_APART, "constraints": [{"requests": ["gpus"], "distinctAttribute": "pcie_root"}]},
            "constraint on pcie_root names unknown request 'gpus'",
        ),
    ],
)
def test_it_refuses_bad_all_requests_and_distinct_constraints(cluster, api_client, alice, claim, message):
    fabric(cluster)
    body = {"name": "bad", "resource_class": "fabric", "pod_sets": [{"name": "main", "replicas": 1, "claim": claim}]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 400
    assert message in str(response.data["pod_sets"][0]["claim"])
    assert not Workload.objects.filter(name="bad").exists()


ALL_GPUS = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "h100", "allocationMode": "All"}}]}


def submit_all_gpus(cluster, api_client, alice, replicas=1):
    pod_set = {"name": "main", "replicas": replicas, "claim": ALL_GPUS}
    body = {"name": "every-gpu", "resource_class": "fabric", "pod_sets": [pod_set]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 201, response.data
    return response.data


def test_it_judges_an_all_request_by_the_most_devices_one_node_has(cluster, api_client, alice):
    """An All request's count says 1, but it takes every GPU of its node (4 on n1 with the NIC beside):
    an approval threshold of 3 must hold it, or All would walk past every size threshold."""
    fabric_class = fabric(cluster)
    fabric_class.approval_threshold_devices = 3
    fabric_class.save()
    data = submit_all_gpus(cluster, api_client, alice)
    assert (data["state"], data["approval"]) == (State.AWAITING_APPROVAL, "Requested")
    assert data["total_devices"] == 1, "the fewest it takes is still what quota-free sizes read"


def test_it_judges_an_all_request_by_the_class_limit_where_there_is_one(cluster, api_client, alice):
    """n1 has 5 devices (4 GPUs and a NIC): without a class limit an All request counts 5, over a threshold
    of 4; with max_devices 4, the most All may take, it counts 4 and needs no approval."""
    fabric_class = fabric(cluster)
    fabric_class.approval_threshold_devices = 4
    fabric_class.save()
    assert submit_all_gpus(cluster, api_client, alice)["state"] == State.AWAITING_APPROVAL
    Workload.objects.all().delete()
    fabric_class.max_devices = 4
    fabric_class.save()
    assert submit_all_gpus(cluster, api_client, alice)["state"] == State.PENDING


def test_it_reads_the_inventory_only_for_the_kind_of_claim_that_asks_all(cluster, django_assert_num_queries):
    """A pod's All request is bounded by the largest node, a group claim's by the whole inventory: each is
    read only when some claim of its kind asks All, and nothing is read when none does."""
    fabric_class = fabric(cluster)
    pod_asks_all = PodSetRequest("main", replicas=2, devices_per_pod=0, claim=ALL_GPUS)
    plain = PodSetRequest("main", replicas=2, devices_per_pod=0, claim=CLAIM)
    group_all = {"name": "shared", **ALL_GPUS}
    with django_assert_num_queries(0):
        assert Submission("plain", cluster.queue_a, fabric_class, (plain,)).approval_devices() == 6
    with django_assert_num_queries(1):
        # n1's 4 GPUs and a NIC: 5 devices per pod, on its largest node.
        assert Submission("pods", cluster.queue_a, fabric_class, (pod_asks_all,)).approval_devices() == 10
    devices = Device.objects.count()
    grouped = Submission("group", cluster.queue_a, fabric_class, (plain,), group_claims=(group_all,))
    with django_assert_num_queries(1):
        assert grouped.approval_devices() == 6 + devices


def test_it_preempts_lower_priority_work_for_a_claim_and_admits_it_on_the_freed_devices(
    cluster, api_client, alice, settings
):
    """Only n1's root b has a NIC beside two GPUs, and `hog` (priority 1) holds those GPUs: the claim
    (priority 100) preempts it, waits while it leaves, and then takes the very devices it freed."""
    from datetime import timedelta

    from django.utils import timezone

    from broker.cycle.executor import SimulatedExecutor
    from tests.cycle.helpers import preempting_within, running

    settings.EVICTION_GRACE_SECONDS = 60  # one second of wall time at 60x
    fabric(cluster)
    preempting_within(cluster.queue_a)
    root_b = list(Device.objects.filter(node=cluster.nodes[0], name__in=("2", "3")).order_by("name"))
    hog = running(cluster.queue_a, "hog", root_b, cluster.h100, priority=1)
    body = {"name": "pair", "resource_class": "fabric", "pod_sets": [{"name": "main", "replicas": 1, "claim": CLAIM}]}
    response = signed_in(api_client, alice).post("/api/workloads/", body, format="json")
    assert response.status_code == 201, response.data
    claimant = Workload.objects.get(pk=response.data["id"])
    Workload.objects.filter(pk=claimant.pk).update(priority=100)
    start = timezone.now()

    first = run_once(now=start)

    assert first.preempted == (hog.pk,)
    assert first.admitted == ()
    claimant.refresh_from_db()
    assert claimant.nominated_devices == sorted(device.pk for device in root_b)
    explanation = Explanation.objects.get(workload=claimant)
    assert explanation.reason == "PreemptionPending"
    assert f"{hog} (WithinQueue, priority 1)" in explanation.message

    SimulatedExecutor(speed=60).advance(start + timedelta(seconds=1))
    second = run_once(now=start + timedelta(seconds=2))

    assert second.admitted == (claimant.pk,)
    held = Allocation.objects.filter(workload=claimant, released_at__isnull=True)
    assert sorted(held.values_list("device__node__name", "device__name")) == [("n1", "2"), ("n1", "3"), ("n1", "nic0")]
