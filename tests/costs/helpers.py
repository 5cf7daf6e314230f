"""Builders for cost tests: allocation intervals and samples at chosen times."""

from datetime import UTC, datetime

from broker.costs.models import CapacitySample
from broker.workloads.models import Allocation

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)


def hold(workload, devices, device_class, start, end=None, consumed_capacity=None):
    """Allocate `devices` to `workload` from start to end (None: still held), one pod each; with
    `consumed_capacity` ({"memory": "20Gi"}), a share of each (a device may come several times)."""
    return [
        Allocation.objects.create(
            workload=workload,
            device=device,
            device_class=device_class,
            pod_set="main",
            pod_index=index,
            allocated_at=start,
            released_at=end,
            consumed_capacity=consumed_capacity,
        )
        for index, device in enumerate(devices)
    ]


def release(allocations, at):
    for allocation in allocations:
        allocation.released_at = at
        allocation.save(update_fields=["released_at"])


def sample(device_class, at, total, unhealthy=0, stranded=0, reserved=None, shared=None):
    """`shared`: {category: millionths of a device} of shared devices' remainders (CapacitySample.shared)."""
    reserved = reserved or {}
    return CapacitySample.objects.create(
        device_class=device_class,
        at=at,
        total=total,
        unhealthy=unhealthy,
        stranded=stranded,
        reserved_unused=sum(reserved.values()),
        reserved_by_team=reserved,
        shared=shared or {},
    )


def submit(queue, name, at, replicas=1, devices_per_pod=1, resource_class=None, **fields):
    """A workload submitted at `at` (make_workload always submits "minutes ago" from the wall clock)."""
    from broker.workloads.models import PodSet, Workload

    workload = Workload.objects.create(
        name=name,
        team=queue.team,
        queue=queue,
        resource_class=resource_class,
        submitted_at=at,
        state_changed_at=at,
        **fields,
    )
    PodSet.objects.create(workload=workload, name="main", replicas=replicas, devices_per_pod=devices_per_pod)
    return workload
