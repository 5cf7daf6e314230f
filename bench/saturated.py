"""A saturated cluster for the decision core: the synthetic cluster after one cycle admitted all it could,
topped up to the same pending count with fresh draws of the same mix. Every pending gang then needs an
explanation (the cycle bench's "refill" and "steady" cycles, without a database)."""

from __future__ import annotations

import dataclasses

from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import RunningPod, RunningWorkload, Snapshot
from broker.scheduler.synthetic import synthetic_snapshot


def admitted_as_running(snapshot: Snapshot, result) -> list[RunningWorkload]:
    """The workloads `result` admitted, as the next snapshot's running work (started at `snapshot.now`)."""
    waiting = {workload.id: workload for workload in snapshot.pending}
    return [
        RunningWorkload(
            id=admission.workload_id,
            queue=waiting[admission.workload_id].queue,
            pods=tuple(RunningPod(pod.pod_set, pod.index, pod.node, pod.device_ids) for pod in admission.pods),
            device_class=admission.device_class,
            priority=waiting[admission.workload_id].priority,
            started=snapshot.now,
        )
        for admission in result.admissions
    ]


def saturated_snapshot(nodes: int, pending: int, sizes, seed: int = 1) -> Snapshot:
    first = synthetic_snapshot(nodes=nodes, pending=pending, sizes=sizes, seed=seed)
    result = decide(first)
    admitted = admitted_as_running(first, result)
    admitted_ids = {admission.workload_id for admission in result.admissions}
    left = [workload for workload in first.pending if workload.id not in admitted_ids]
    extra = synthetic_snapshot(nodes=1, pending=pending - len(left), sizes=sizes, seed=seed + 1).pending
    renamed = [dataclasses.replace(workload, id=f"r{workload.id}") for workload in extra]
    return dataclasses.replace(first, running=first.running + tuple(admitted), pending=tuple(left + renamed))
