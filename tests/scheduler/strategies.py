"""Small random clusters for property tests, and naive (obviously right, slow) answers to compare with."""

from dataclasses import replace
from itertools import combinations

from hypothesis import strategies as st

from broker.scheduler.snapshot import (
    NO_SCHEDULE_EFFECTS,
    Device,
    DeviceClass,
    Node,
    PendingWorkload,
    PodSet,
    Queue,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
    Taint,
    Toleration,
)

LEVELS = ("block", "rack")
CLASSES = (
    DeviceClass("h100", match={"model": "H100"}, price_per_hour=4.0),
    DeviceClass("a100", selector='device.attributes["gpu.example.com"].model == "A100"', price_per_hour=2.0),
)
QUIET = SchedulerConfig(enable_backfill_protection=False, enable_preemption=False, rerun_verification_limit=10)


@st.composite
def inventories(draw, max_racks=4, max_nodes_per_rack=3, max_devices=4):
    nodes, devices = [], []
    racks = draw(st.integers(1, max_racks))
    for rack in range(racks):
        for position in range(draw(st.integers(1, max_nodes_per_rack))):
            name = f"n{rack}{position}"
            nodes.append(
                Node(
                    name,
                    {"block": f"b{rack // 2}", "rack": f"r{rack}"},
                    schedulable=draw(st.booleans()) or True,
                )
            )
            if draw(st.integers(0, 9)) == 0:
                nodes[-1] = replace(nodes[-1], schedulable=False)
            model = draw(st.sampled_from(("H100", "H100", "A100")))
            for index in range(draw(st.integers(1, max_devices))):
                roll = draw(st.integers(0, 19))
                devices.append(
                    Device(
                        f"{name}/{index}",
                        name,
                        attributes={"model": model},
                        healthy=roll != 0,
                        taints=(Taint("maintenance", "yes", "NoSchedule"),) if roll == 1 else (),
                    )
                )
    return tuple(nodes), tuple(devices)


@st.composite
def running_work(draw, devices, queues=("q1", "q2"), chance=0.4):
    running = []
    free = [device for device in devices]
    while free and draw(st.floats(0, 1)) < chance:
        node = free[0].node
        on_node = [device for device in free if device.node == node]
        count = draw(st.integers(1, len(on_node)))
        taken = on_node[:count]
        free = [device for device in free if device not in taken]
        model = taken[0].attributes["model"]
        # Some are elastic (Pod disruption mode): one pod per device, a gang minimum below that.
        elastic = len(taken) > 1 and draw(st.booleans())
        ids = tuple(device.id for device in taken)
        pods = (
            tuple(RunningPod("main", index, node, (device_id,)) for index, device_id in enumerate(ids))
            if elastic
            else (RunningPod("main", 0, node, ids),)
        )
        running.append(
            RunningWorkload(
                id=f"run{len(running)}",
                queue=draw(st.sampled_from(queues)),
                pods=pods,
                device_class="h100" if model == "H100" else "a100",
                priority=draw(st.integers(0, 3)),
                preemptible=draw(st.booleans()) or True,
                started=float(draw(st.integers(0, 50))),
                disruption="Pod" if elastic else "PodGroup",
                min_counts=(("main", draw(st.integers(1, len(ids) - 1))),) if elastic else (),
            )
        )
    return tuple(running)


@st.composite
def pending_work(draw, count_range=(1, 5), queues=("q1", "q2"), with_classes=True):
    workloads = []
    for index in range(draw(st.integers(*count_range))):
        pods = draw(st.integers(1, 3))
        classes = draw(st.sampled_from((("h100",), ("a100",), ("h100", "a100"), ("a100", "h100"))))
        workloads.append(
            PendingWorkload(
                id=f"w{index}",
                queue=draw(st.sampled_from(queues)),
                pod_sets=(
                    PodSet(
                        "main",
                        pods,
                        pods,
                        draw(st.integers(1, 3)),
                        classes if with_classes else (),
                        tolerations=(Toleration("maintenance"),) if draw(st.integers(0, 5)) == 0 else (),
                    ),
                ),
                resource_class=draw(st.sampled_from((None, "open", "closed", "approval"))),
                topology_required=draw(st.sampled_from((None, None, "rack", "block"))),
                priority=draw(st.integers(0, 5)),
                submitted=float(index),
                approved=draw(st.sampled_from((None, True, False))),
            )
        )
    return tuple(workloads)


@st.composite
def snapshots(draw, config=QUIET, quotas=True):
    nodes, devices = draw(inventories())
    quota = draw(st.sampled_from((None, {"h100": 4}, {"h100": 8, "a100": 2}))) if quotas else None
    queues = (Queue("q1", "team1", quota=quota), Queue("q2", "team2"))
    resource_classes = (
        ResourceClass("open", ("h100", "a100")),
        ResourceClass("closed", ("h100", "a100"), teams=("team2",)),
        ResourceClass("approval", ("h100", "a100"), approval_required=True),
    )
    return Snapshot(
        levels=LEVELS,
        nodes=nodes,
        devices=devices,
        device_classes=CLASSES,
        queues=queues,
        resource_classes=resource_classes,
        running=draw(running_work(devices)),
        pending=draw(pending_work()),
        config=config,
    )


# --- naive answers --------------------------------------------------------------------------------------


def class_of(device):
    return "h100" if device.attributes["model"] == "H100" else "a100"


def usable(device, nodes, tolerations=()):
    if not device.healthy or not nodes[device.node].schedulable:
        return False
    keys = {toleration.key for toleration in tolerations}
    return all(taint.key in keys for taint in device.taints if taint.effect in NO_SCHEDULE_EFFECTS)


def free_devices(snapshot, result=None, healed=False, built=False, tolerations=()):
    """Free devices per (class, node) after the cycle's admissions."""
    nodes = {node.name: node for node in snapshot.nodes}
    held = set()
    if not built:
        held = {device_id for workload in snapshot.running for pod in workload.pods for device_id in pod.device_ids}
        if result is not None:
            held |= {device_id for a in result.admissions for pod in a.pods for device_id in pod.device_ids}
    counts = {}
    for device in snapshot.devices:
        if device.id in held:
            continue
        if not (built or healed) and not usable(device, nodes, tolerations):
            continue
        key = (class_of(device), device.node)
        counts[key] = counts.get(key, 0) + 1
    return counts


def naive_fits(snapshot, counts, device_class, pods, per_pod, level):
    domains = {}
    for node in snapshot.nodes:
        domain = node.domains[level] if level else "cluster"
        domains.setdefault(domain, 0)
        domains[domain] += counts.get((device_class, node.name), 0) // per_pod
    return any(fitting >= pods for fitting in domains.values())


def naive_primary(snapshot, result, workload, pools=None):
    """The primary reason code by the definitions, computed the slow, obvious way (no reservations,
    no backfill, no preemption, one pod set). `pools`: for workloads asked in cluster order, what is left
    per device class of the devices healing would make free (DeviceUnhealthy holds only while they
    last; taken from here); None: as if each workload were the only one waiting."""
    resource_classes = {rc.name: rc for rc in snapshot.resource_classes}
    queue = {queue.name: queue for queue in snapshot.queues}[workload.queue]
    rc = resource_classes.get(workload.resource_class)
    pod_set = workload.pod_sets[0]
    classes = pod_set.device_classes or rc.device_classes
    pods, per_pod, level = pod_set.count, pod_set.devices_per_pod, workload.topology_required
    needed = pods * per_pod
    tolerations = pod_set.tolerations
    built = free_devices(snapshot, built=True)
    if not any(naive_fits(snapshot, built, name, pods, per_pod, level) for name in classes):
        return "InvalidRequest"
    team = queue.team
    if rc is not None and rc.teams is not None and team not in rc.teams:
        return "NotEntitled"
    if rc is not None and rc.approval_required and workload.approved is not True:
        return "AwaitingApproval"
    usage = {}
    for running in snapshot.running:
        if running.queue == queue.name:
            usage[running.device_class] = usage.get(running.device_class, 0) + running.device_count
    by_id = {w.id: w for w in snapshot.pending}
    for admission in result.admissions:
        if by_id[admission.workload_id].queue == queue.name:
            devices = sum(len(pod.device_ids) for pod in admission.pods)
            usage[admission.device_class] = usage.get(admission.device_class, 0) + devices
    passing = [
        name for name in classes if queue.quota is None or usage.get(name, 0) + needed <= queue.quota.get(name, 0)
    ]
    if not passing:
        return "QuotaExceeded"
    now = free_devices(snapshot, result, tolerations=tolerations)
    if any(naive_fits(snapshot, now, name, pods, per_pod, level) for name in passing):
        return None
    healed = free_devices(snapshot, result, healed=True)
    totals = {name: sum(count for (cls, _), count in now.items() if cls == name) for name in passing}
    if any(naive_fits(snapshot, healed, name, pods, per_pod, level) for name in passing):
        if pools is None:
            return "DeviceUnhealthy"
        focus = next((name for name in passing if totals[name] >= needed), passing[0])
        left = pools.get(focus, sum(count for (cls, _), count in healed.items() if cls == focus))
        if left >= needed:
            pools[focus] = left - needed
            return "DeviceUnhealthy"
        pools[focus] = left
    if all(total < needed for total in totals.values()):
        return "InsufficientCapacity"
    return "TopologyFragmented"


def cost_key(victims):
    """Issue 27: lowest priorities first (highest of the set first), then pods before whole PodGroups,
    then fewest and smallest, then most recently started."""
    return (
        tuple(sorted((victim.priority for victim in victims), reverse=True)),
        sum(not victim.partial for victim in victims),
        len(victims),
        sum(len(device) for victim in victims for pod in victim.pods for device in [pod.device_ids]),
        -sum(victim.started for victim in victims),
        tuple(sorted(victim.id for victim in victims)),
    )


def naive_surplus(running):
    """The pods a Pod-mode workload can lose and keep each pod set's gang minimum: the highest indices."""
    if running.disruption != "Pod" or not running.min_counts:
        return ()
    minimum = dict(running.min_counts)
    surplus = []
    for pod_set in {pod.pod_set for pod in running.pods}:
        pods = sorted((pod for pod in running.pods if pod.pod_set == pod_set), key=lambda pod: pod.index)
        if pod_set in minimum:
            surplus.extend(pods[minimum[pod_set] :])
    return tuple(surplus)


def naive_cheapest_victims(snapshot, workload):
    """Brute force over every subset of lower-priority preemptible workloads of the same queue, device
    classes in fallback order (the first class some subset works for decides, as in Kueue). Shrinking
    comes first: subsets of Pod-mode workloads giving up only their pods above the gang minimum (returned
    as records of those pods, partial=True); whole workloads only when no such subset works."""
    pod_set = workload.pod_sets[0]
    eligible = [
        running
        for running in snapshot.running
        if running.queue == workload.queue and running.preemptible and running.priority < workload.priority
    ]
    counts = free_devices(snapshot, tolerations=pod_set.tolerations)
    for device_class in pod_set.device_classes:
        level = workload.topology_required
        if naive_fits(snapshot, counts, device_class, pod_set.count, pod_set.devices_per_pod, level):
            return ()  # fits somewhere without preemption: admitted, nobody is preempted
    shrinkable = [replace(r, pods=naive_surplus(r), partial=True) for r in eligible if naive_surplus(r)]
    for candidates in (shrinkable, eligible):
        for device_class in pod_set.device_classes:
            best = None
            for size in range(1, len(candidates) + 1):
                for chosen in combinations(candidates, size):
                    leaving = {device_id for r in chosen for pod in r.pods for device_id in pod.device_ids}
                    others = replace(snapshot, running=tuple(_without(r, leaving) for r in snapshot.running))
                    counts = free_devices(others, tolerations=pod_set.tolerations)
                    level = workload.topology_required
                    cheaper = best is None or cost_key(chosen) < cost_key(best)
                    fits = naive_fits(others, counts, device_class, pod_set.count, pod_set.devices_per_pod, level)
                    if cheaper and fits:
                        best = chosen
            if best is not None:  # every subset compared: a larger set of lower priority may be cheaper
                return best
    return None


def _without(running, device_ids):
    pods = tuple(pod for pod in running.pods if not set(pod.device_ids) & device_ids)
    return replace(running, pods=pods)
