"""Running work on failed devices: a device that went unhealthy or took a NoExecute taint under running
work stops it (issue 26). A PodGroup-mode workload is evicted whole; a Pod-mode one loses only the pods
on failed devices while each pod set keeps its gang minimum, else it goes whole too. Evicted work keeps
its devices while it shuts down (as a preemption victim does) and then goes back to its queue at its
original place: its priority and submission time are unchanged. A NoSchedule taint keeps running work
and only blocks new placements.

Pure: the cycle finds the holders of the failed devices in its device records (no pass over the
running work), and `evictions_for` says what to evict and how the rest of the cycle sees it."""

from __future__ import annotations

from dataclasses import replace

from broker.scheduler.snapshot import Eviction, RunningWorkload, Snapshot, split_leaving

DEVICE_FAILED = "DeviceFailed"

# The failed devices of the last devices tuple seen: the loader hands out the same tuple while the
# inventory stands, and a pass over 100k devices each cycle would find the same few (usually none).
_last: tuple = (None, {})


def failed_devices(snapshot: Snapshot) -> dict[str, str]:
    """{device id: why it failed} of the devices that stop running work on them."""
    global _last
    devices, failed = _last
    if devices is snapshot.devices:
        return failed
    failed = {}
    for device in snapshot.devices:
        if not device.healthy:
            failed[device.id] = "unhealthy"
        elif device.taints:
            evicting = [taint for taint in device.taints if taint.effect == "NoExecute"]
            if evicting:
                failed[device.id] = ", ".join(_taint_text(taint) for taint in evicting)
    _last = (snapshot.devices, failed)
    return failed


def _taint_text(taint) -> str:
    return f"{taint.key} {taint.value}" if taint.value is not None else taint.key


def evictions_for(hits: dict[str, list[str]], running: dict, failed: dict[str, str]) -> tuple[list, list]:
    """(evictions, the records that replace the evicted ones) for `hits`: workload id -> the failed
    devices it holds (the workloads running, not evicting already). A shrunk workload is replaced by its
    staying pods and its leaving ones (`split_leaving`), one evicted whole by itself marked evicting."""
    evictions, records = [], []
    for workload_id in sorted(hits):
        workload = running[workload_id]
        devices = sorted(hits[workload_id])
        why = f"device {devices[0]} failed ({failed[devices[0]]})"
        if len(devices) > 1:
            why += f" and {len(devices) - 1} more"
        wanted = set(devices)
        leaving = {(pod.pod_set, pod.index) for pod in workload.pods if wanted.intersection(pod.device_ids)}
        if _may_shrink(workload, leaving):
            pods = tuple(sorted(leaving))
            evictions.append(Eviction(workload_id, DEVICE_FAILED, f"evicted: {why}; its other pods run on", pods))
            records.append(split_leaving(workload, leaving, None))
        else:
            evictions.append(Eviction(workload_id, DEVICE_FAILED, f"evicted: {why}"))
            records.append((replace(workload, evicting=True, evicted_for=None),))
    return evictions, records


def _may_shrink(workload: RunningWorkload, leaving: set) -> bool:
    """Pod disruption mode, and every pod set keeps at least its gang minimum without the leaving pods."""
    if workload.disruption != "Pod" or not workload.min_counts:
        return False
    minimum = dict(workload.min_counts)
    sizes: dict[str, int] = {}
    for pod in workload.pods:
        if (pod.pod_set, pod.index) not in leaving:
            sizes[pod.pod_set] = sizes.get(pod.pod_set, 0) + 1
    for pod_set in {pod_set for pod_set, _ in leaving}:
        keep = minimum.get(pod_set)
        if keep is None or sizes.get(pod_set, 0) < keep:
            return False
    return True
