"""Devices another scheduler allocated (kube-scheduler, another DRA scheduler): a ResourceClaim allocated
outside the broker holds its devices, and their share of a counter set, until it lets them go; the cycle
never places on them, finance bills them to nobody and the dashboard counts them busy."""

from django.utils import timezone

from broker.cycle.loader import load_snapshot
from broker.cycle.runner import run_once
from broker.inventory.models import Device, Node
from broker.kube.applier import Applier
from broker.kube.models import MirroredClaim
from broker.kube.sync import INVENTORY, WORK
from broker.scheduler.accounting import capacity_by_class
from broker.scheduler.capacity import TAINTED, Access, Slot
from broker.scheduler.snapshot import HELD_OUTSIDE_TAINT, CycleResult, Taint, Toleration
from broker.workloads.models import Explanation
from broker.workloads.states import HOLDING_STATES, State
from dashboard.inventory_state import inventory_state
from dashboard.queries import OUTSIDE_THE_BROKER, heatmap_node, heatmap_racks
from tests.kube import objects
from tests.kube.helpers import admit, bound_nodes, held, submit
from tests.kube_apiserver import to_dict

CLAIMS = next(resource for resource in WORK if resource.name == "resourceclaims")


def allocate_outside(cluster, name, devices, namespace="web"):
    """A claim of a pod another scheduler placed, allocated by it."""
    cluster.create(objects.claim(name, namespace))
    cluster.set_status("ResourceClaim", name, to_dict(objects.allocated(devices)), namespace)


def outside_holders():
    return {
        f"{device.node.name}/{device.name}": [t["value"] for t in device.taints if t["key"] == HELD_OUTSIDE_TAINT]
        for device in Device.objects.select_related("node")
        if any(t["key"] == HELD_OUTSIDE_TAINT for t in device.taints)
    }


def test_it_never_places_on_devices_allocated_outside_until_they_are_released(sync, lab):
    # One GPU of each rack is kube-scheduler's: no rack has the 8 a rack-bound gang of 8 needs.
    allocate_outside(lab, "serving", [("k0", "gpu-0")])
    allocate_outside(lab, "notebook", [("k2", "gpu-3")])
    group = admit(sync, lab)
    assert outside_holders() == {"k0/gpu-0": ["web/serving"], "k2/gpu-3": ["web/notebook"]}
    assert group.workload.state == State.PENDING
    explanation = Explanation.objects.get(workload=group.workload)
    assert explanation.reason == "TopologyFragmented", "held, not unhealthy: healing them would not help"
    assert "14 h100 free" in explanation.message

    lab.set_status("ResourceClaim", "notebook", {"allocation": None}, "web")  # deallocated
    sync.watch_once(CLAIMS, sync.cursor(CLAIMS))
    assert outside_holders() == {"k0/gpu-0": ["web/serving"]}
    run_once()
    Applier().drain()
    group.workload.refresh_from_db()
    assert group.workload.state in HOLDING_STATES
    assert set(bound_nodes(lab, "train-").values()) == {"k2"}, "rack r1, which the release freed"


def test_it_counts_its_own_allocations_as_its_own(sync, lab):
    group = admit(sync, lab)
    Applier().drain()
    sync.list_all(WORK)  # the claims come back allocated, by the broker
    assert MirroredClaim.objects.filter(allocated=True).count() == 8
    assert not MirroredClaim.objects.filter(outside=True).exists() and outside_holders() == {}
    assert group.workload.allocations.filter(released_at__isnull=True).count() == 8


def test_it_takes_what_a_partition_allocated_outside_consumes_from_its_gpu(sync, mig):
    allocate_outside(mig, "serving", [("mig", "gpu-0-half-0")])
    whole = submit(sync, mig, "whole", "training", "h100")
    assert whole.state == State.PENDING, "half of the GPU's memory is kube-scheduler's"
    half = submit(sync, mig, "half", "inference", "h100-half")
    assert half.state in HOLDING_STATES and held(half) == ["gpu-0-half-1"]

    mig.delete("ResourceClaim", "serving", "web")
    mig.delete("Pod", "half-0", "ml")
    sync.list_all(WORK)
    assert outside_holders() == {}
    run_once()
    half.refresh_from_db()
    assert half.state == State.SUCCEEDED or half.state not in HOLDING_STATES
    whole.refresh_from_db()
    assert whole.state in HOLDING_STATES and held(whole) == ["gpu-0"]


def test_it_bills_nobody_and_shows_busy_what_is_held_outside(sync, lab):
    allocate_outside(lab, "serving", [("k2", "gpu-0"), ("k2", "gpu-1")])
    sync.list_all(WORK)
    snapshot, _ = load_snapshot(timezone.now())
    (h100,) = capacity_by_class(snapshot, CycleResult())
    assert (h100.total, h100.unhealthy, h100.idle) == (14, 0, 14), "16 GPUs, 2 of them not the broker's"
    counts = inventory_state().by_class()["h100"]
    assert (counts["busy"], counts["unhealthy"], counts["free"]) == (2, 0, 14)
    (rack,) = [cell for cell in heatmap_racks()["cells"] if cell["name"] == "r1"]
    assert rack["counts"]["busy"] == 2 and rack["teams"] == {OUTSIDE_THE_BROKER: 2}
    node = heatmap_node(None, Node.objects.get(name="k2").pk)
    held = [device for device in node["devices"] if device["team"] == OUTSIDE_THE_BROKER]
    assert [(d["name"], d["state"], d["unavailable"]) for d in held] == [
        ("gpu-0", "busy", False),
        ("gpu-1", "busy", False),
    ]


def test_it_lets_neither_a_toleration_nor_a_healing_use_a_device_held_outside():
    held_outside = (Taint(key=HELD_OUTSIDE_TAINT, value="web/serving", effect="NoSchedule"),)
    slot = Slot(0, "k0/gpu-0", 0, (0,), {}, TAINTED, held_outside)
    tolerant = Access("ml-team", tolerations=(Toleration(key=HELD_OUTSIDE_TAINT),))
    assert tolerant.rank(slot) is None and Access("ml-team", healed=True).rank(slot) is None
    slot.taints = (Taint(key="example.com/hot", effect="NoSchedule"),)
    assert Access("ml-team", tolerations=(Toleration(key="example.com/hot"),)).rank(slot) is not None


def test_it_releases_a_claim_deleted_while_the_sync_was_away(sync, lab):
    allocate_outside(lab, "serving", [("k1", "gpu-2")])
    sync.list_all(WORK)
    assert outside_holders() == {"k1/gpu-2": ["web/serving"]}
    lab.delete("ResourceClaim", "serving", "web")
    lab.compact()
    sync.relist(CLAIMS)
    assert outside_holders() == {} and not MirroredClaim.objects.exists()


def test_it_keeps_an_outside_allocation_when_the_slice_is_published_again(sync, lab):
    allocate_outside(lab, "serving", [("k2", "gpu-5")])
    sync.list_all(WORK)
    lab.apply(objects.resource_slice("k2", devices=8, model="H100"))
    sync.list_all()
    assert outside_holders() == {"k2/gpu-5": ["web/serving"]}
    lab.apply(objects.resource_slice("k2", devices=5))  # gpu-5 unpublished: its row goes
    sync.list_all()
    assert outside_holders() == {}
    lab.apply(objects.resource_slice("k2", devices=8))  # and published again: still allocated
    sync.list_all()
    assert outside_holders() == {"k2/gpu-5": ["web/serving"]}


def test_it_takes_back_the_claims_of_a_group_it_takes_after_seeing_them_allocated(sync, lab):
    # A sync that lost its database lists claims the broker allocated before it has taken their group.
    objects.gang(lab, "train", pods=2, topology=None)
    for i in range(2):
        lab.set_status("ResourceClaim", f"train-{i}-gpus", to_dict(objects.allocated([("k2", f"gpu-{i}")])), "ml")
    sync.list_all(WORK)
    assert MirroredClaim.objects.filter(outside=False, allocated=True).count() == 2
    assert outside_holders() == {}


def scratch_gang(sync, lab):
    """A gang of 2 owning a claim of a scratch volume published for rack r1 (a PodGroup claim)."""
    lab.create(objects.storage_slice("r1"))
    lab.create(objects.device_class("scratch", objects.SCRATCH, driver=objects.STORAGE))
    sync.list_all(INVENTORY)
    lab.create(objects.claim("train-scratch", device_class_name="scratch", request="scratch"))
    objects.gang(lab, "train", pods=2, topology=None, resource_claims=[("scratch", "train-scratch", None)])


def test_it_counts_its_own_group_claims_as_its_own(sync, lab):
    scratch_gang(sync, lab)
    sync.list_all(WORK)
    run_once()
    Applier().drain()
    sync.list_all(WORK)  # the group claim comes back allocated, by the broker
    claim = MirroredClaim.objects.get(name="train-scratch")
    assert claim.allocated and not claim.outside
    assert outside_holders() == {}


def test_it_takes_back_a_group_claim_seen_allocated_before_its_group(sync, lab):
    scratch_gang(sync, lab)
    status = objects.allocated([("r1-scratch", "scratch-0")])
    status.allocation.devices.results[0].driver = objects.STORAGE
    lab.set_status("ResourceClaim", "train-scratch", to_dict(status), "ml")
    sync.list_all(WORK)
    assert not MirroredClaim.objects.get(name="train-scratch").outside
    assert outside_holders() == {}
