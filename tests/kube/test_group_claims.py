"""PodGroup-owned ResourceClaims (Kubernetes 1.36, KEP-5729) through the bridge: the claims a gang owns
become its workload's group claims, are allocated once for the whole gang (reserved for the PodGroup)
before its pods are bound where the claim's device reaches, and are deallocated once the pods are gone."""

import pytest

from broker.cycle.runner import run_once
from broker.inventory.models import Device
from broker.kube.applier import CONDITION, Applier, ApplyFailed, group_results
from broker.kube.mirror import shared_home
from broker.kube.models import MirroredClaim, MirroredPodGroup, OutboxEntry
from broker.kube.sync import INVENTORY, WORK
from broker.workloads.models import Allocation
from broker.workloads.states import HOLDING_STATES, State
from tests.kube import objects
from tests.kube.helpers import bound_nodes

PODS = next(resource for resource in WORK if resource.name == "pods")
SCRATCH = [("scratch", "train-scratch", None)]  # the gang's claim entry, naming its ResourceClaim
RACK_R1 = {"k2"}  # without the claim, a gang of 4 goes to k0 (rack r0)


@pytest.fixture
def storage(sync, lab):
    """The lab, plus one scratch volume published for the nodes of rack r1 (k2)."""
    lab.create(objects.storage_slice("r1"))
    lab.create(objects.device_class("scratch", objects.SCRATCH, driver=objects.STORAGE))
    sync.list_all(INVENTORY)
    return lab


def gang_with_scratch(sync, cluster, claims=SCRATCH, create_claim=True):
    if create_claim:
        cluster.create(objects.claim("train-scratch", device_class_name="scratch", request="scratch"))
    objects.gang(cluster, "train", pods=4, resource_claims=claims)
    sync.list_all(WORK)
    run_once()
    return MirroredPodGroup.objects.select_related("workload").get(name="train")


def claim_writes(cluster, name):
    return [path for _, path in cluster.requests("PUT", "status", "resourceclaims") if path.endswith(f"/{name}/status")]


def test_it_allocates_a_pod_groups_claim_once_and_binds_its_pods_where_the_device_reaches(sync, storage):
    group = gang_with_scratch(sync, storage)
    assert group.workload.state in HOLDING_STATES
    assert group.workload.group_claims == [
        {
            "name": "scratch",
            "requests": [{"name": "scratch", "exactly": {"deviceClassName": "scratch", "count": 1}}],
            "constraints": [],
        }
    ]
    assert group.group_claims == {"scratch": "train-scratch"}
    Applier().drain()

    nodes = bound_nodes(storage, "train-")
    assert len(nodes) == 4 and set(nodes.values()) == RACK_R1, "the scratch volume reaches rack r1 only"
    status = storage.get("ResourceClaim", "train-scratch", "ml")["status"]
    assert status["allocation"]["devices"]["results"] == [
        {"request": "scratch", "driver": objects.STORAGE, "pool": "r1-scratch", "device": "scratch-0"}
    ]
    assert status["reservedFor"] == [
        {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "train", "uid": group.uid}
    ]
    terms = status["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert set(terms[0]["matchFields"][0]["values"]) == set(nodes.values())
    assert len(claim_writes(storage, "train-scratch")) == 1, "allocated once for the gang"
    assert len(claim_writes(storage, "train-0-gpus")) == 1, "each pod's own claim as before"
    rows = Allocation.objects.filter(workload=group.workload, released_at__isnull=True)
    assert rows.filter(pod_set="podgroup:scratch").count() == 1 and rows.count() == 5


def test_it_binds_no_pod_before_the_group_claim_is_allocated(sync, storage):
    group = gang_with_scratch(sync, storage)
    storage.fail("PUT", "status", 500)  # the group claim's write is the applier's first
    assert Applier().drain() == []
    assert storage.requests("POST", "binding") == [], "no pod starts without the devices it shares"
    assert not storage.get("ResourceClaim", "train-scratch", "ml").get("status")
    assert Applier().drain() == [OutboxEntry.objects.get(pod_group=group).pk]
    assert len(storage.requests("POST", "binding")) == 4
    assert storage.get("ResourceClaim", "train-scratch", "ml")["status"]["allocation"]


def test_it_allocates_the_group_claim_exactly_once_when_the_applier_dies_between_commit_and_binding(sync, storage):
    group = gang_with_scratch(sync, storage)
    # The worker dies after the commit, mid-way through the gang: the claim allocated, not every pod bound.
    storage.fail("POST", "binding", 500, after=2)
    assert Applier().drain() == []
    assert storage.get("ResourceClaim", "train-scratch", "ml")["status"]["allocation"]
    assert sum(1 for node in bound_nodes(storage, "train-").values() if node) == 3
    entry = OutboxEntry.objects.get(pod_group=group)
    assert Applier().drain() == [entry.pk]
    assert len(claim_writes(storage, "train-scratch")) == 1, "read back, found allocated: not written again"
    assert sum(1 for node in bound_nodes(storage, "train-").values() if node) == 4


def test_it_waits_with_a_condition_for_a_group_claim_that_does_not_exist(sync, storage):
    group = gang_with_scratch(sync, storage, create_claim=False)
    assert group.workload is None
    assert (group.refused, group.refused_message) == (
        "WaitingForClaims",
        "ResourceClaim train-scratch (group claim scratch) does not exist yet",
    )
    Applier().write_conditions()
    condition = storage.get("PodGroup", "train", "ml")["status"]["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (CONDITION, "False", "WaitingForClaims")

    storage.create(objects.claim("train-scratch", device_class_name="scratch", request="scratch"))
    sync.list_all(WORK)
    group.refresh_from_db()
    assert group.workload is not None and group.refused == ""


def test_it_takes_the_claim_the_controller_made_from_a_claim_template(sync, storage):
    template = [("scratch", None, "scratch-template")]
    group = gang_with_scratch(sync, storage, claims=template, create_claim=False)
    assert group.refused == "WaitingForClaims"
    assert "from template scratch-template for claim scratch" in group.refused_message

    # The resourceclaim controller makes the PodGroup's claim and records its name in the status.
    storage.create(objects.claim("train-scratch-x7k2p", device_class_name="scratch", request="scratch"))
    storage.set_status(
        "PodGroup",
        "train",
        {"resourceClaimStatuses": [{"name": "scratch", "resourceClaimName": "train-scratch-x7k2p"}]},
        "ml",
    )
    sync.list_all(WORK)
    group.refresh_from_db()
    assert group.workload is not None and group.group_claims == {"scratch": "train-scratch-x7k2p"}
    run_once()
    Applier().drain()
    assert storage.get("ResourceClaim", "train-scratch-x7k2p", "ml")["status"]["allocation"]


def test_it_takes_the_claims_of_a_workloads_template(sync, storage):
    storage.create(objects.workload("job", templates={"workers": {"min_count": 4, "resource_claims": SCRATCH}}))
    storage.create(objects.claim("train-scratch", device_class_name="scratch", request="scratch"))
    storage.create(objects.pod_group("train", min_count=None, topology=None, template=("job", "workers")))
    for i in range(4):
        storage.create(objects.claim(f"train-{i}-gpus"))
        storage.create(objects.pod(f"train-{i}", "train", claim_name=f"train-{i}-gpus", shared=SCRATCH))
    sync.list_all(WORK)
    group = MirroredPodGroup.objects.select_related("workload").get(name="train")
    assert group.refused == "" and group.group_claims == {"scratch": "train-scratch"}
    assert [claim["name"] for claim in group.workload.group_claims] == ["scratch"]


def test_it_deallocates_the_group_claim_once_the_pods_are_gone(sync, storage):
    group = gang_with_scratch(sync, storage)
    Applier().drain()
    sync.list_all(WORK)  # the claims are seen allocated
    assert MirroredClaim.objects.get(name="train-scratch").allocated
    for i in range(3):
        storage.set_status("Pod", f"train-{i}", {"phase": "Succeeded"}, "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    assert Applier().release_claims() == [], "the gang runs on"
    storage.set_status("Pod", "train-3", {"phase": "Succeeded"}, "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    group.workload.refresh_from_db()
    assert group.workload.state == State.SUCCEEDED
    released = Applier().release_claims()
    assert "ml/train-scratch" in released and len(released) == 5
    assert not storage.get("ResourceClaim", "train-scratch", "ml").get("status")
    assert Applier().release_claims() == []


def test_it_refuses_a_group_claim_no_device_could_ever_meet(sync, storage):
    storage.create(objects.claim("train-scratch", device_class_name="scratch", count=2, request="scratch"))
    group = gang_with_scratch(sync, storage, create_claim=False)
    assert group.workload is None and group.refused == "InvalidRequest"
    assert group.refused_message.startswith("group_claims: requests: Request scratch: no device class can ever")


def test_it_names_each_allocated_device_by_the_request_the_cycle_chose_it_for():
    devices = {
        "requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "h100", "count": 2}},
            {
                "name": "volume",
                "firstAvailable": [
                    {"name": "fast", "deviceClassName": "nvme", "count": 1},
                    {"name": "slow", "deviceClassName": "scratch", "count": 2},
                ],
            },
        ]
    }
    rows = [
        ("gpu.example.com", "k2", "gpu-0", "h100"),
        ("gpu.example.com", "k2", "gpu-1", "h100"),
        (objects.STORAGE, "r1-scratch", "scratch-0", "scratch"),
        (objects.STORAGE, "r1-scratch", "scratch-1", "scratch"),
    ]
    assert [(result["request"], result["device"]) for result in group_results(devices, rows)] == [
        ("gpus", "gpu-0"),
        ("gpus", "gpu-1"),
        ("volume/slow", "scratch-0"),
        ("volume/slow", "scratch-1"),
    ]
    with pytest.raises(ApplyFailed, match="1 allocated devices belong to no request"):
        group_results(devices, [*rows, rows[-1]])


def test_it_keeps_the_devices_of_a_rack_on_one_node_of_it_reaching_the_rack(sync, storage):
    device = Device.objects.select_related("node").get(name="scratch-0")
    assert (device.node.name, device.pool, device.attributes) == (
        "k2",
        "r1-scratch",
        {"model": "scratch", "reach": "rack"},
    )
    storage.create(objects.node("k10", rack="r1"))  # first by name now: the devices stay on k2
    storage.apply(objects.storage_slice("r1", devices=2))
    sync.list_all(INVENTORY)
    assert sorted(Device.objects.filter(pool="r1-scratch").values_list("node__name", "name")) == [
        ("k2", "scratch-0"),
        ("k2", "scratch-1"),
    ]
    storage.delete("ResourceSlice", f"r1-{objects.STORAGE}")
    sync.list_all(INVENTORY)
    assert not Device.objects.filter(name="scratch-0").exists()


def test_it_finds_the_domain_a_shared_slice_serves():
    nodes = [("k2", {objects.RACK: "r1"}), ("k0", {objects.RACK: "r0"}), ("k1", {objects.RACK: "r0"})]

    def selector(*expressions, fields=None):
        term = {"matchExpressions": list(expressions)}
        if fields:
            term["matchFields"] = fields
        return {"nodeSelector": {"nodeSelectorTerms": [term]}}

    rack_r0 = {"key": objects.RACK, "operator": "In", "values": ["r0"]}
    assert shared_home(selector(rack_r0), nodes) == ("k0", "rack")
    assert shared_home({"allNodes": True}, nodes) == ("k0", "cluster")
    assert shared_home(selector(rack_r0), nodes, kept="k1") == ("k1", "rack"), "its devices stay where they are"
    assert shared_home(selector(rack_r0), nodes, kept="k2") == ("k0", "rack"), "k2 left rack r0"
    assert shared_home(selector({**rack_r0, "values": ["r9"]}), nodes) == (None, "rack"), "no node there yet"
    assert shared_home(selector({**rack_r0, "operator": "NotIn"}), nodes) == (None, None)
    assert shared_home(selector({**rack_r0, "key": "example.com/zone"}), nodes) == (None, None)
    assert shared_home(selector(rack_r0, fields=[{"key": "metadata.name"}]), nodes) == (None, None)


def test_it_rereads_and_retries_the_group_claim_on_409_conflict(sync, storage):
    gang_with_scratch(sync, storage)
    storage.fail("PUT", "status", 409, times=2)  # the group claim's write is the applier's first
    assert Applier().drain()
    status = storage.get("ResourceClaim", "train-scratch", "ml")["status"]
    assert [result["device"] for result in status["allocation"]["devices"]["results"]] == ["scratch-0"]
    assert len(claim_writes(storage, "train-scratch")) == 3, "two conflicts, then the write"
    assert len(storage.requests("POST", "binding")) == 4


def all_claim(name, *requests):
    """A ResourceClaim whose requests [(name, class, All or a count)] each are `exactly`."""
    from kubernetes import client

    def exactly(device_class, how):
        if how == "All":
            return client.V1ExactDeviceRequest(device_class_name=device_class, allocation_mode="All")
        return client.V1ExactDeviceRequest(device_class_name=device_class, count=how)

    claim = objects.claim(name, device_class_name="scratch", request="scratch")
    claim.spec.devices.requests = [
        client.V1DeviceRequest(name=request, exactly=exactly(device_class, how))
        for request, device_class, how in requests
    ]
    return claim


def test_it_allocates_a_group_claim_for_every_volume_the_rack_reaches(sync, storage):
    storage.create(all_claim("train-scratch", ("scratch", "scratch", "All")))
    group = gang_with_scratch(sync, storage, create_claim=False)
    assert group.workload is not None, group.refused_message
    assert group.workload.state in HOLDING_STATES
    Applier().drain()
    assert set(bound_nodes(storage, "train-").values()) == RACK_R1
    results = storage.get("ResourceClaim", "train-scratch", "ml")["status"]["allocation"]["devices"]["results"]
    assert results == [{"request": "scratch", "driver": objects.STORAGE, "pool": "r1-scratch", "device": "scratch-0"}]


def test_it_refuses_a_group_claim_with_two_requests_for_all(sync, storage):
    storage.create(all_claim("train-scratch", ("scratch", "scratch", "All"), ("more", "scratch", "All")))
    group = gang_with_scratch(sync, storage, create_claim=False)
    assert group.workload is None and group.refused == "InvalidRequest"
    assert "an allocationMode All request goes only beside exactly requests" in group.refused_message


def test_it_names_the_devices_of_a_request_for_all_between_counted_ones():
    devices = {
        "requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "h100", "count": 2}},
            {"name": "volumes", "exactly": {"deviceClassName": "scratch", "allocationMode": "All"}},
            {"name": "nic", "exactly": {"deviceClassName": "nic"}},
        ]
    }
    rows = [
        ("gpu.example.com", "k2", "gpu-0", "h100"),
        ("gpu.example.com", "k2", "gpu-1", "h100"),
        (objects.STORAGE, "r1-scratch", "scratch-0", "scratch"),
        (objects.STORAGE, "r1-scratch", "scratch-1", "scratch"),
        (objects.STORAGE, "r1-scratch", "scratch-2", "scratch"),
        ("gpu.example.com", "k2", "nic-0", "nic"),
    ]
    assert [(result["request"], result["device"]) for result in group_results(devices, rows)] == [
        ("gpus", "gpu-0"),
        ("gpus", "gpu-1"),
        ("volumes", "scratch-0"),
        ("volumes", "scratch-1"),
        ("volumes", "scratch-2"),
        ("nic", "nic-0"),
    ]
