"""Partitions synced from a cluster are never double-booked: a GPU published whole and cut in two halves,
all consuming its shared counter set, is given out either whole or as halves, never both."""

import pytest

from broker.cycle.loader import forget_everything_loaded
from broker.cycle.runner import run_once
from broker.kube.applier import Applier
from broker.kube.models import MirroredPodGroup
from broker.kube.sync import INVENTORY, WORK
from broker.policy.models import DeviceClass, PriorityClass, Queue, ResourceClass, ResourceClassDeviceClass, Team
from broker.workloads.models import Allocation
from broker.workloads.states import HOLDING_STATES, State
from tests.kube import objects
from tests.kube.helpers import bound_nodes

PODS = next(resource for resource in WORK if resource.name == "pods")


@pytest.fixture
def mig(sync, apiserver):
    """One node with one GPU: whole (class h100) or two halves (class h100-half), queue `ml`."""
    forget_everything_loaded()
    apiserver.create(objects.node("mig"))
    apiserver.create(objects.counter_slice("mig"))
    apiserver.create(objects.partitioned_slice("mig"))
    apiserver.create(objects.device_class())
    apiserver.create(objects.device_class("h100-half", objects.H100_HALF))
    sync.list_all(INVENTORY)
    team = Team.objects.create(name="ml-team")
    Queue.objects.create(name="ml", team=team)
    batch = PriorityClass.objects.create(name="batch", value=100)
    for name, device_class in (("training", "h100"), ("inference", "h100-half")):
        resource_class = ResourceClass.objects.create(name=name, display_name=name, priority_class=batch)
        ResourceClassDeviceClass.objects.create(
            resource_class=resource_class, device_class=DeviceClass.objects.get(name=device_class)
        )
    yield apiserver
    forget_everything_loaded()


def submit(sync, cluster, name, resource_class, device_class):
    objects.gang(cluster, name, pods=1, resource_class=resource_class, device_class_name=device_class, topology=None)
    sync.list_all(WORK)
    run_once()
    Applier().drain()
    return MirroredPodGroup.objects.select_related("workload").get(name=name).workload


def held(workload):
    return sorted(
        Allocation.objects.filter(workload=workload, released_at__isnull=True).values_list("device__name", flat=True)
    )


def test_it_gives_a_gpu_whole_or_as_halves_never_both(sync, mig):
    whole = submit(sync, mig, "whole", "training", "h100")
    assert whole.state == State.RUNNING and held(whole) == ["gpu-0"]
    half = submit(sync, mig, "half", "inference", "h100-half")
    assert half.state == State.PENDING, "the GPU's memory is all taken by the whole device"
    assert not bound_nodes(mig, "half-")["half-0"]
    assert not (mig.get("ResourceClaim", "half-0-gpus", "ml").get("status") or {}).get("allocation")

    # The whole GPU's pod ends: the halves are free, both of them.
    mig.delete("Pod", "whole-0", "ml")
    sync.watch_once(PODS, sync.cursor(PODS))
    run_once()
    Applier().drain()
    half.refresh_from_db()
    assert half.state in HOLDING_STATES and len(held(half)) == 1
    other = submit(sync, mig, "other-half", "inference", "h100-half")
    assert other.state in HOLDING_STATES and held(half) + held(other) == ["gpu-0-half-0", "gpu-0-half-1"]
    again = submit(sync, mig, "whole-again", "training", "h100")
    assert again.state == State.PENDING, "the halves hold the GPU's memory"
