"""Small builders for cycle tests."""

from broker.workloads.models import Allocation, PodSet, Workload
from broker.workloads.states import State
from tests.builders import make_workload


def pending(queue, name, replicas=1, devices_per_pod=1, resource_class=None, **fields):
    fields.setdefault("state", State.PENDING)
    return make_workload(
        queue, name=name, replicas=replicas, devices_per_pod=devices_per_pod, resource_class=resource_class, **fields
    )


def running(queue, name, devices, device_class, resource_class=None, **fields):
    """A Running workload holding `devices` (one pod per node they sit on)."""
    fields.setdefault("state", State.RUNNING)
    workload = Workload.objects.create(name=name, team=queue.team, queue=queue, resource_class=resource_class, **fields)
    by_node = {}
    for device in devices:
        by_node.setdefault(device.node_id, []).append(device)
    PodSet.objects.create(
        workload=workload, name="main", replicas=len(by_node), devices_per_pod=len(next(iter(by_node.values())))
    )
    for index, node_devices in enumerate(by_node.values()):
        for device in node_devices:
            Allocation.objects.create(
                workload=workload, device=device, device_class=device_class, pod_set="main", pod_index=index
            )
    return workload


def preempting_within(queue):
    """`queue` may preempt its own lower-priority work and has no quota to stop it."""
    from broker.policy.models import WithinQueuePolicy

    queue.within_queue_preemption = WithinQueuePolicy.LOWER_PRIORITY
    queue.nominal_quota = None
    queue.save()


def rack_devices(rack):
    from broker.inventory.models import Device

    return list(Device.objects.filter(node__domain__name=rack).order_by("node__name", "name"))
