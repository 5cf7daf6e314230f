"""Running work on failed devices: a device that went unhealthy or took a NoExecute taint under running
work stops it (issue 26). A PodGroup-mode workload is evicted whole; a Pod-mode one loses only the pods
on failed devices while each pod set keeps its gang minimum, else it goes whole too. Evicted work keeps
its devices while it shuts down (as a preemption victim does) and then goes back to its queue at its
original place: its priority and submission time are unchanged. A NoSchedule taint keeps running work
and only blocks new placements.

Pure: `device_failures(snapshot)` returns the evictions and the snapshot as the rest of the cycle must
see it (the evicted records marked evicting, for nobody)."""

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


def device_failures(snapshot: Snapshot) -> tuple[tuple[Eviction, ...], Snapshot]:
    """(evictions, the snapshot with the evicted work marked evicting); the snapshot itself when nothing
    runs on a failed device."""
    failed = failed_devices(snapshot)
    if not failed:
        return (), snapshot
    evictions = []
    running = []
    changed = False
    for workload in snapshot.running:
        if workload.evicting or workload.part_of is not None:
            running.append(workload)
            continue
        hit = [(pod, device_id) for pod in workload.pods for device_id in pod.device_ids if device_id in failed]
        if not hit:
            running.append(workload)
            continue
        changed = True
        device_id = hit[0][1]
        why = f"device {device_id} failed ({failed[device_id]})"
        if len(hit) > 1:
            why += f" and {len({d for _, d in hit}) - 1} more"
        leaving = {(pod.pod_set, pod.index) for pod, _ in hit}
        if _may_shrink(workload, leaving):
            evictions.append(
                Eviction(workload.id, DEVICE_FAILED, f"evicted: {why}; its other pods run on", tuple(sorted(leaving)))
            )
            running.extend(split_leaving(workload, leaving, None))
        else:
            evictions.append(Eviction(workload.id, DEVICE_FAILED, f"evicted: {why}"))
            running.append(replace(workload, evicting=True, evicted_for=None))
    if not changed:
        return (), snapshot
    return tuple(evictions), replace(snapshot, running=tuple(running))


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
