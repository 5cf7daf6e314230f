"""Checks every cycle result must pass, shared by the scenario and property tests."""

from collections import Counter

from broker.scheduler.capacity import natural_key
from broker.scheduler.snapshot import NO_SCHEDULE_EFFECTS


def assert_valid_result(snapshot, result):
    pending_ids = [workload.id for workload in snapshot.pending]
    decided = [admission.workload_id for admission in result.admissions] + [
        decision.workload_id for decision in result.pending
    ]
    assert Counter(decided) == Counter(pending_ids), "every pending workload decided exactly once"
    devices = {device.id: device for device in snapshot.devices}
    nodes = {node.name: node for node in snapshot.nodes}
    held = Counter(device_id for workload in snapshot.running for pod in workload.pods for device_id in pod.device_ids)
    workloads = {workload.id: workload for workload in snapshot.pending}
    for admission in result.admissions:
        workload = workloads[admission.workload_id]
        for pod in admission.pods:
            for device_id in pod.device_ids:
                held[device_id] += 1
                device = devices[device_id]
                assert device.node == pod.node
                assert device.healthy, f"{device_id} is unhealthy"
                assert nodes[device.node].schedulable, f"{device.node} is cordoned"
                tolerations = {t for pod_set in workload.pod_sets for t in pod_set.tolerations}
                for taint in device.taints:
                    if taint.effect in NO_SCHEDULE_EFFECTS:
                        assert any(t.key == taint.key for t in tolerations), f"{device_id} is tainted"
        assert_gang_complete(workload, admission)
    doubled = [device_id for device_id, count in held.items() if count > 1]
    assert not doubled, f"devices allocated twice: {sorted(doubled, key=natural_key)}"


def assert_gang_complete(workload, admission):
    per_set = Counter(pod.pod_set for pod in admission.pods)
    for pod_set in workload.pod_sets:
        placed = per_set.get(pod_set.name, 0)
        assert pod_set.gang_size <= placed <= pod_set.count, f"{workload.id}/{pod_set.name}: {placed} pods"
        for pod in admission.pods:
            if pod.pod_set == pod_set.name:
                assert len(pod.device_ids) == pod_set.devices_per_pod
