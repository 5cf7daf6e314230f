"""Work in and decisions out: PodGroups become workloads, the cycle admits them, the applier allocates their
claims and binds their pods exactly once, and every PodGroup carries the broker's explanation."""

from kubernetes import client

from broker.audit.models import AuditEvent
from broker.cycle.runner import run_once
from broker.inventory.models import Node
from broker.kube.applier import CONDITION, Applier
from broker.kube.models import MirroredPodGroup, OutboxEntry
from broker.kube.sync import INVENTORY, RESOURCES, WORK
from broker.workloads.models import Allocation, Explanation, Workload
from broker.workloads.states import State
from tests.kube import objects
from tests.kube.helpers import admit, bound_nodes

PODS = next(resource for resource in WORK if resource.name == "pods")
NODES = next(resource for resource in INVENTORY if resource.name == "nodes")


def test_it_admits_a_gang_allocates_its_claims_and_binds_its_pods_on_one_rack(sync, lab):
    group = admit(sync, lab)
    assert group.workload.state == State.ADMITTED
    assert group.workload.topology_required == "rack"
    assert OutboxEntry.objects.filter(pod_group=group, done_at__isnull=True).count() == 1
    assert Applier().drain()
    nodes = bound_nodes(lab, "train-")
    assert len(nodes) == 8 and None not in nodes.values()
    reads = [path for _, path in lab.requests("GET") if "/train-" in path]
    assert reads == [], "two calls a pod, from the mirror: no pod or claim read first"
    assert {Node.objects.get(name=node).domain.name for node in nodes.values()} == {"r0"}
    for i in range(8):
        claim = lab.get("ResourceClaim", f"train-{i}-gpus", "ml")
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [r["pool"] for r in results] == [nodes[f"train-{i}"]]
        assert claim["status"]["reservedFor"][0]["name"] == f"train-{i}"
    held = Allocation.objects.filter(workload=group.workload, released_at__isnull=True)
    assert sorted(f"{a.device.pool}/{a.device.name}" for a in held) == sorted(
        f"{r['pool']}/{r['device']}"
        for i in range(8)
        for r in lab.get("ResourceClaim", f"train-{i}-gpus", "ml")["status"]["allocation"]["devices"]["results"]
    )
    group.workload.refresh_from_db()
    assert group.workload.state == State.RUNNING
    Applier().write_conditions()
    condition = lab.get("PodGroup", "train", "ml")["status"]["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (CONDITION, "True", "Scheduled")


def test_it_binds_each_pod_exactly_once_when_the_applier_dies_after_the_commit(sync, lab):
    admit(sync, lab)
    # The process that committed died before its after-commit hook: the entry waits in the outbox.
    assert len(lab.requests("POST", "binding")) == 0
    assert Applier().drain()
    assert Applier().drain() == []  # a second applier finds nothing left to do
    assert len(lab.requests("POST", "binding")) == 8


def test_it_resumes_a_half_applied_entry_without_binding_a_pod_twice(sync, lab):
    group = admit(sync, lab)
    lab.fail("POST", "binding", 500, after=4)  # the fifth binding fails: the worker dies mid-gang
    assert Applier().drain() == []
    entry = OutboxEntry.objects.get(pod_group=group)
    assert entry.done_at is None and entry.attempts == 1 and "500" in entry.last_error
    assert sum(1 for node in bound_nodes(lab, "train-").values() if node) == 7, "the other pods bound in parallel"
    assert Applier().drain() == [entry.pk]
    assert sum(1 for node in bound_nodes(lab, "train-").values() if node) == 8
    assert len(lab.requests("POST", "binding")) == 9, "8 bindings, and the one that failed; none twice"


def test_it_rereads_and_retries_a_claim_on_409_conflict(sync, lab):
    admit(sync, lab)
    lab.fail("PUT", "status", 409, times=2)
    assert Applier().drain()
    assert all(lab.get("ResourceClaim", f"train-{i}-gpus", "ml")["status"]["allocation"] for i in range(8))


def test_it_explains_a_pending_pod_group_in_its_condition(sync, lab):
    admit(sync, lab, "first")
    group = admit(sync, lab, "second", pods=12)
    assert group.workload.state == State.PENDING
    Applier().write_conditions()
    explanation = Explanation.objects.get(workload=group.workload)
    condition = lab.get("PodGroup", "second", "ml")["status"]["conditions"][0]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        explanation.reason,
        explanation.message,
    )
    assert Applier().write_conditions() == 0, "unchanged: not written again"


def test_it_gives_a_pod_group_it_cannot_take_a_clear_condition(sync, lab):
    objects.gang(lab, "stray", pods=2, queue="nowhere")
    objects.gang(lab, "classless", pods=2, resource_class=None)
    sync.list_all(WORK)
    assert not Workload.objects.exists()
    Applier().write_conditions()
    stray = lab.get("PodGroup", "stray", "ml")["status"]["conditions"][0]
    assert stray["reason"] == "UnknownQueue" and "'nowhere'" in stray["message"]
    classless = lab.get("PodGroup", "classless", "ml")["status"]["conditions"][0]
    assert classless["reason"] == "UnknownResourceClass"


def test_it_waits_for_the_whole_gang_before_submitting(sync, lab):
    lab.create(objects.pod_group("late", min_count=4))
    for i in range(3):
        lab.create(objects.claim(f"late-{i}-gpus"))
        lab.create(objects.pod(f"late-{i}", "late", claim_name=f"late-{i}-gpus"))
    sync.list_all(WORK)
    group = MirroredPodGroup.objects.get(name="late")
    assert group.workload is None and (group.refused, group.refused_message) == (
        "WaitingForPods",
        "3 of the gang's 4 pods exist",
    )
    lab.create(objects.claim("late-3-gpus"))
    lab.create(objects.pod("late-3", "late", claim_name="late-3-gpus"))
    sync.watch_once(
        next(r for r in WORK if r.name == "resourceclaims"),
        sync.cursor(next(r for r in WORK if r.name == "resourceclaims")),
    )
    sync.watch_once(PODS, sync.cursor(PODS))
    group.refresh_from_db()
    assert group.workload is not None and group.workload.pod_sets.get().replicas == 4


def test_it_lets_the_cluster_win_when_a_bound_pod_is_deleted_by_hand(sync, lab):
    group = admit(sync, lab)
    Applier().drain()
    lab.delete("Pod", "train-3", "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    group.workload.refresh_from_db()
    assert group.workload.state == State.FAILED
    assert not Allocation.objects.filter(workload=group.workload, released_at__isnull=True).exists()
    event = AuditEvent.objects.get(action="workload.ended_in_cluster")
    assert event.manual_intervention and "train-3" in event.reason


def test_it_evicts_a_group_through_the_eviction_api_and_requeues_it_once_its_pods_are_gone(sync, lab):
    group = admit(sync, lab)
    Applier().drain()
    lab.create(objects.taint_rule("broken", pool="k0", device_name="gpu-0"))
    sync.list_all(INVENTORY)
    run_once()
    group.workload.refresh_from_db()
    assert group.workload.eviction_requested_at is not None
    entry = OutboxEntry.objects.get(pod_group=group, action="Evict")
    assert Applier().drain() == [entry.pk]
    assert len(lab.requests("POST", "eviction")) == 8
    sync.watch_once(PODS, sync.cursor(PODS))
    group.workload.refresh_from_db()
    assert group.workload.state == State.PENDING
    assert not Allocation.objects.filter(workload=group.workload, released_at__isnull=True).exists()


def test_it_evicts_only_the_pod_on_a_failed_device_of_a_pod_mode_group(sync, lab):
    group = admit(sync, lab, "elastic", min_count=6, disruption_mode="Pod")
    Applier().drain()
    node = bound_nodes(lab, "elastic-")["elastic-3"]
    (device,) = Allocation.objects.filter(workload=group.workload, pod_index=3).values_list("device__name", flat=True)
    lab.create(objects.taint_rule("broken", pool=node, device_name=device))
    sync.list_all(INVENTORY)
    run_once()
    entry = OutboxEntry.objects.get(pod_group=group, action="Evict")
    assert Applier().drain() == [entry.pk]
    assert [path.rsplit("/", 2)[1] for _, path in lab.requests("POST", "eviction")] == ["elastic-3"]
    sync.watch_once(PODS, sync.cursor(PODS))
    group.workload.refresh_from_db()
    assert group.workload.state == State.RUNNING and group.workload.eviction_requested_at is None
    staying = Allocation.objects.filter(workload=group.workload, released_at__isnull=True)
    assert sorted(staying.values_list("pod_index", flat=True)) == [0, 1, 2, 4, 5, 6, 7]
    sync.list_all(WORK)
    assert Applier().release_claims() == ["ml/elastic-3-gpus"], "the pod that left gives back its claim"
    for i in (0, 1, 2, 4, 5, 6, 7):
        lab.set_status("Pod", f"elastic-{i}", {"phase": "Succeeded"}, "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    group.workload.refresh_from_db()
    assert group.workload.state == State.SUCCEEDED, "the pods it runs on all succeeded"


def test_it_writes_no_outbox_with_the_bridge_off(sync, lab, settings):
    settings.KUBE_ENABLED = False
    admit(sync, lab)
    assert not OutboxEntry.objects.exists()


def test_it_lists_every_resource_kind_it_watches(sync, lab):
    assert {resource.name for resource in RESOURCES} == {
        "nodes",
        "resourceslices",
        "deviceclasses",
        "devicetaintrules",
        "priorityclasses",
        "workloads",
        "podgroups",
        "resourceclaims",
        "pods",
    }


def test_it_deallocates_the_claims_once_the_pods_are_gone(sync, lab):
    group = admit(sync, lab)
    Applier().drain()
    sync.list_all(WORK)  # the claims are seen allocated
    for i in range(8):
        pod = lab.get("Pod", f"train-{i}", "ml")
        pod["status"] = {"phase": "Succeeded"}
        lab.set_status("Pod", f"train-{i}", pod["status"], "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    group.workload.refresh_from_db()
    assert group.workload.state == State.SUCCEEDED
    assert len(Applier().release_claims()) == 8
    assert not any(lab.get("ResourceClaim", f"train-{i}-gpus", "ml").get("status") for i in range(8))
    assert Applier().release_claims() == []


def test_it_takes_a_claim_for_all_devices_of_the_node_and_allocates_every_one(sync, lab):
    """allocationMode All: each pod's claim gets every h100 of its node, so the two pods of the gang go to
    two nodes of one rack (r0: k0 and k1, 4 each), and each claim's results name all four."""
    lab.create(objects.pod_group("every", min_count=2))
    for i in range(2):
        claim = objects.claim(f"every-{i}-gpus")
        claim.spec.devices.requests[0].exactly = client.V1ExactDeviceRequest(
            device_class_name="h100", allocation_mode="All"
        )
        lab.create(claim)
        lab.create(objects.pod(f"every-{i}", "every", claim_name=f"every-{i}-gpus"))
    sync.list_all(WORK)
    run_once()
    group = MirroredPodGroup.objects.select_related("workload").get(name="every")
    assert group.workload.state == State.ADMITTED, group.refused
    assert Applier().drain()
    nodes = bound_nodes(lab, "every-")
    assert sorted(nodes.values()) == ["k0", "k1"]
    for i in range(2):
        results = lab.get("ResourceClaim", f"every-{i}-gpus", "ml")["status"]["allocation"]["devices"]["results"]
        assert {(r["request"], r["pool"]) for r in results} == {("gpus", nodes[f"every-{i}"])}
        assert len(results) == 4
    held = Allocation.objects.filter(workload=group.workload, released_at__isnull=True)
    assert held.count() == 8
