"""Deterministic synthetic snapshots of any size, for benchmarks and tests.

`synthetic_snapshot(nodes=12_500, devices_per_node=8, pending=20_000, seed=1)` builds a zone > block >
rack cluster (8 nodes per rack, 16 racks per block, 4 zones' worth of blocks), mostly H100 with A100
racks, a sprinkle of unhealthy devices, tainted devices and cordoned nodes, 15 team queues in two
cohorts, running work filling `busy` of the devices, and pending gangs whose sizes follow the Philly
trace mix (mostly 1 device, some 2-8, rare 16-128) unless `sizes` gives the sizes to draw from.
The only chance involved is a `random.Random(seed)`: the same arguments give the same snapshot.
"""

from __future__ import annotations

import random
from dataclasses import replace

from broker.scheduler.snapshot import (
    DRIVER,
    Cohort,
    CounterSet,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
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
)

# Share of Philly jobs by GPU count (adaptdl's philly.csv: 93% use 1 GPU; the rest 2..128).
PHILLY_MIX = ((1, 0.80), (2, 0.07), (4, 0.06), (8, 0.05), (16, 0.012), (32, 0.005), (64, 0.002), (128, 0.001))
NODES_PER_RACK = 8
RACKS_PER_BLOCK = 16
TEAMS = tuple(f"vc{index:02d}" for index in range(15))


def synthetic_snapshot(
    nodes: int = 1_000,
    devices_per_node: int = 8,
    pending: int = 1_000,
    seed: int = 1,
    busy: float = 0.85,
    sizes: tuple[int, ...] | None = None,
    config: SchedulerConfig | None = None,
) -> Snapshot:
    chance = random.Random(seed)
    node_list, devices = _inventory(chance, nodes, devices_per_node)
    queues, cohorts = _queues(nodes * devices_per_node)
    running = _running(chance, node_list, devices_per_node, busy)
    draw = _size_drawer(chance, sizes)
    pod_sets: dict[int, PodSet] = {}  # one record per gang size, shared as the loader shares them
    pending_list = tuple(_pending(chance, index, draw(), pod_sets) for index in range(pending))
    return Snapshot(
        levels=("zone", "block", "rack"),
        nodes=tuple(node_list),
        devices=tuple(devices),
        device_classes=(
            DeviceClass("h100", match={"model": "H100"}, price_per_hour=4.0),
            DeviceClass("a100", match={"model": "A100"}, price_per_hour=2.0),
            DeviceClass("big-memory", selector=f'device.attributes["{DRIVER}"].memory >= 80', price_per_hour=3.5),
        ),
        cohorts=cohorts,
        queues=queues,
        resource_classes=(
            ResourceClass("batch", ("h100", "a100"), default_priority=1, preemptible=True),
            ResourceClass("training", ("h100",), topology_required="rack", default_priority=10),
        ),
        running=tuple(running),
        pending=pending_list,
        now=100_000.0,
        config=config or SchedulerConfig(),
    )


def _inventory(chance: random.Random, count: int, per_node: int):
    nodes, devices = [], []
    width = max(5, len(str(count)))
    for index in range(count):
        rack = index // NODES_PER_RACK
        block = rack // RACKS_PER_BLOCK
        name = f"n{index:0{width}d}"
        model, memory = ("A100", 40) if rack % 4 == 3 else ("H100", 80)
        nodes.append(
            Node(
                name,
                {"zone": f"z{block % 4}", "block": f"b{block:04d}", "rack": f"r{rack:05d}"},
                schedulable=chance.random() >= 0.002,
            )
        )
        attributes = {"model": model, "memory": memory, "island": "0"}
        for device_index in range(per_node):
            tainted = chance.random() < 0.001
            devices.append(
                Device(
                    f"{name}/{device_index}",
                    name,
                    attributes=attributes if device_index < per_node // 2 else {**attributes, "island": "1"},
                    healthy=chance.random() >= 0.005,
                    taints=(Taint("maintenance", "true", "NoSchedule"),) if tainted else (),
                )
            )
    return nodes, devices


def _queues(devices: int):
    share = max(1, devices // len(TEAMS))
    queues = tuple(
        Queue(
            name=team,
            team=team,
            cohort="research" if index < 8 else "production",
            quota={"h100": share, "a100": share // 3} if index % 5 else None,
            weight=1.0 + (index % 3),
            within_queue="LowerPriority" if index % 2 else "Never",
            reclaim_within_cohort="Any" if index % 3 == 0 else "Never",
        )
        for index, team in enumerate(TEAMS)
    )
    return queues, (Cohort("research"), Cohort("production"))


def _running(chance: random.Random, nodes, per_node: int, busy: float):
    running = []
    for node in nodes:
        used = 0
        while used < per_node and chance.random() < busy:
            width = min(per_node - used, chance.choice((1, 1, 1, 2, 4, 8)))
            ids = tuple(f"{node.name}/{index}" for index in range(used, used + width))
            used += width
            team = TEAMS[len(running) % len(TEAMS)]
            running.append(
                RunningWorkload(
                    id=f"run-{len(running):06d}",
                    queue=team,
                    pods=(RunningPod("main", 0, node.name, ids),),
                    device_class="a100" if int(node.domains["rack"][1:]) % 4 == 3 else "h100",
                    priority=chance.choice((0, 1, 5, 10)),
                    preemptible=chance.random() < 0.5,
                    started=float(chance.randrange(0, 100_000)),
                    expected_end=100_000.0 + chance.randrange(60, 86_400) if chance.random() < 0.7 else None,
                )
            )
    return running


def _size_drawer(chance: random.Random, sizes):
    if sizes:
        pool = tuple(sizes)
        return lambda: chance.choice(pool)
    values = [size for size, _ in PHILLY_MIX]
    weights = [weight for _, weight in PHILLY_MIX]
    return lambda: chance.choices(values, weights)[0]


def _pending(chance: random.Random, index: int, size: int, pod_sets: dict[int, PodSet]) -> PendingWorkload:
    team = TEAMS[chance.randrange(len(TEAMS))]
    if size <= 8:
        pod_set = PodSet("main", 1, None, size)
        resource_class, required = "batch", None
    else:
        pod_set = PodSet("workers", size // 8, None, 8)
        resource_class, required = "training", ("rack" if size <= 64 else "block")
    pod_set = pod_sets.setdefault(size, pod_set)
    return PendingWorkload(
        id=f"job-{index:06d}",
        queue=team,
        pod_sets=(pod_set,),
        resource_class=resource_class,
        topology_required=required,
        priority=chance.choice((0, 1, 5, 10)),
        submitted=float(chance.randrange(0, 100_000)),
        expected_duration=float(chance.randrange(60, 86_400)) if chance.random() < 0.7 else None,
    )


PARTITION_PROFILE = "1g"


def partitioned_snapshot(snapshot: Snapshot, every: int = 4, parts: int = 7, share: float = 0.3, seed: int = 1):
    """`snapshot` with the GPUs of every `every`-th node cut into `parts` partitions (DRA counter sets: a
    GPU's set holds `parts` slices; the whole consumes all of them, each partition one), running work
    left as it is, and about `share` of the one-device gangs asking for a partition instead (class
    "mig-1g"). Issue 26's bench case: at 12,500 nodes, 100k GPUs and 175k partitions."""
    chance = random.Random(seed)
    cut = {node.name for position, node in enumerate(snapshot.nodes) if position % every == 0}
    devices, counter_sets = [], []
    for device in snapshot.devices:
        if device.node not in cut:
            devices.append(device)
            continue
        set_name = "gpu-" + device.id.rpartition("/")[2]
        counter_sets.append(CounterSet(set_name, device.node, {"slices": parts}))
        devices.append(replace(device, consumes_counters={set_name: {"slices": parts}}))
        attributes = {**device.attributes, "model": device.attributes["model"] + "-" + PARTITION_PROFILE}
        for part in range(parts):
            devices.append(
                replace(
                    device,
                    id=f"{device.id}:{PARTITION_PROFILE}#{part}",
                    attributes=attributes,
                    consumes_counters={set_name: {"slices": 1}},
                )
            )
    slice_class = DeviceClass(
        "mig-1g",
        selector=f'device.attributes["{DRIVER}"].model in ["H100-{PARTITION_PROFILE}", "A100-{PARTITION_PROFILE}"]',
        price_per_hour=0.6,
    )
    one_slice = PodSet("main", 1, None, 1, ("mig-1g",))
    pending = tuple(
        replace(workload, pod_sets=(one_slice,), resource_class=None, topology_required=None)
        if workload.pod_sets[0].devices_per_pod == 1 and workload.pod_sets[0].count == 1 and chance.random() < share
        else workload
        for workload in snapshot.pending
    )
    queues = tuple(
        replace(queue, quota={**queue.quota, "mig-1g": 7 * queue.quota.get("h100", 0)}) if queue.quota else queue
        for queue in snapshot.queues
    )
    return replace(
        snapshot,
        devices=tuple(devices),
        counter_sets=tuple(counter_sets),
        device_classes=(*snapshot.device_classes, slice_class),
        queues=queues,
        pending=pending,
    )


def claims_snapshot(snapshot: Snapshot, share: float = 0.3, seed: int = 1) -> Snapshot:
    """`snapshot` with one NIC per 2 GPUs on every node (its island's: "<node>/nic-<k>", class "nic") and
    about `share` of the gangs of 2, 4 or 8 devices per pod claiming them with several requests (DRA
    DeviceClaim): `gpu`, 1 x H100 per device or else as many A100 (firstAvailable), and `nic`, one per
    2 GPUs, under the GPUs' island (matchAttribute) when they fit in one. Issue 26's bench case on top
    of `partitioned_snapshot`: at 12,500 nodes, 275k GPUs and partitions and 50k NICs."""
    chance = random.Random(seed)
    per_node: dict[str, int] = {}
    for device in snapshot.devices:
        if device.id.rpartition("/")[2].isdigit():
            per_node[device.node] = per_node.get(device.node, 0) + 1
    nics = []
    for node, gpus in per_node.items():
        for index in range(gpus // 2):
            island = "0" if index < gpus // 4 else "1"
            nics.append(Device(f"{node}/nic-{index}", node, attributes={"kind": "nic", "island": island}))
    claims: dict[int, PodSet] = {}

    def claimed(pod_set: PodSet) -> PodSet:
        per_pod = pod_set.devices_per_pod
        known = claims.get(per_pod)
        if known is None:
            ways = (DeviceSubRequest("h100", "h100", per_pod), DeviceSubRequest("a100", "a100", per_pod))
            requests = (
                DeviceRequest("gpu", first_available=ways),
                DeviceRequest("nic", DeviceSubRequest("nic", "nic", per_pod // 2)),
            )
            constraints = (DeviceConstraint("island"),) if per_pod <= 4 else ()
            known = claims[per_pod] = PodSet("main", 1, None, 1, (), None, (), requests, constraints)
        return replace(known, name=pod_set.name, count=pod_set.count, min_count=pod_set.min_count)

    pending = tuple(
        replace(
            workload,
            pod_sets=tuple(claimed(pod_set) for pod_set in workload.pod_sets),
            resource_class=None,
            topology_required=None,
        )  # fmt: skip
        if all(pod_set.devices_per_pod in (2, 4, 8) for pod_set in workload.pod_sets) and chance.random() < share
        else workload
        for workload in snapshot.pending
    )
    return replace(
        snapshot,
        devices=snapshot.devices + tuple(nics),
        device_classes=(*snapshot.device_classes, DeviceClass("nic", match={"kind": "nic"}, price_per_hour=0.1)),
        # A claim's NICs count under their own class (broker.scheduler.quota): a limited queue gets one
        # NIC of quota per H100 of it, more than its claims can take (one NIC per 2 GPUs).
        queues=tuple(
            replace(queue, quota={**queue.quota, "nic": queue.quota.get("h100", 0)}) if queue.quota else queue
            for queue in snapshot.queues
        ),
        pending=pending,
    )
