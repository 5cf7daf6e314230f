"""The demo inventories, read from the real machine lists in settings.TRACES_DIR (no database here).

Neither trace says where a machine sits, so the topology is derived by one deterministic rule:

1. Machines are grouped by type (devices per node and device attributes); types are ordered by
   devices per node, largest first, then by model name.
2. Inside a type, machines are sorted by their number (m2 before m10) and cut into racks of
   NODES_PER_RACK. A rack never mixes types, so a rack-local gang sees uniform devices.
3. The racks of one type are cut into blocks of RACKS_PER_BLOCK; blocks never mix types either.
4. Blocks go round-robin into ZONES zones, in block order.

Philly's machine list gives only the GPU memory, not the model, so its devices are named by memory
(`gpu-12gb`, `gpu-24gb`) rather than by a guessed model. Alibaba's node list names real models; memory
is set only where the model states it (A10: 24 GB, A100/A800-80GB and H800: 80 GB).
"""

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

NODES_PER_RACK = 8
RACKS_PER_BLOCK = 8
ZONES = ("zone-a", "zone-b")
DRIVER = "gpu.example.com"
NIC_DRIVER = "nic.example.com"
STORAGE_DRIVER = "storage.example.com"
INVENTORIES = ("philly", "alibaba-2026")

# Memory in GB where the model name states it; the two anonymised series stay without one.
ALIBABA_MEMORY = {"A10": 24, "A100-SXM4-80GB": 80, "A800-SXM4-80GB": 80, "H800": 80}


@dataclass(frozen=True)
class Machine:
    name: str
    devices: int
    attributes: dict = field(hash=False)

    @property
    def type_key(self):
        return (-self.devices, str(self.attributes.get("model", "")))


@dataclass(frozen=True)
class PlacedMachine:
    machine: Machine
    zone: str
    block: str
    rack: str


@dataclass(frozen=True)
class DeviceClassSpec:
    name: str
    selector: str
    price_per_hour: str
    description: str


def traces_dir():
    return Path(settings.TRACES_DIR)


def natural_key(name):
    """m2 sorts before m10; names without a number sort by text."""
    digits = re.findall(r"\d+", name)
    return (int(digits[-1]) if digits else -1, name)


def philly_machines(path=None):
    path = path or traces_dir() / "philly" / "cluster_machine_list.csv"
    machines = []
    with open(path, newline="") as handle:
        rows = csv.reader(handle)
        next(rows)
        for row in rows:
            if not row or not row[0].strip():
                continue
            name, gpus, memory = (cell.strip() for cell in row[:3])
            memory_gb = int(memory.upper().removesuffix("GB"))
            attributes = {"model": f"gpu-{memory_gb}gb", "memory": memory_gb}
            machines.append(Machine(name=name, devices=int(gpus), attributes=attributes))
    return machines


def alibaba_machines(path=None):
    path = path or traces_dir() / "alibaba-2026-spot-gpu" / "node_info_df.csv"
    machines = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            model = row["gpu_model"].strip()
            attributes = {"model": model, "cpus": int(row["cpu_num"])}
            if model in ALIBABA_MEMORY:
                attributes["memory"] = ALIBABA_MEMORY[model]
            name = f"ali-{int(row['node_name']):04d}"
            machines.append(Machine(name=name, devices=int(row["gpu_capacity_num"]), attributes=attributes))
    return machines


def machines_for(inventory):
    if inventory == "philly":
        return philly_machines()
    if inventory == "alibaba-2026":
        return alibaba_machines()
    raise ValueError(f"Unknown inventory '{inventory}'; choose one of {', '.join(INVENTORIES)}.")


def place(machines):
    """Racks, blocks and zones for every machine, by the rule in the module docstring."""
    by_type = {}
    for machine in machines:
        by_type.setdefault(machine.type_key, []).append(machine)
    racks = []
    blocks = []
    for key in sorted(by_type):
        members = sorted(by_type[key], key=lambda m: natural_key(m.name))
        type_racks = [members[i : i + NODES_PER_RACK] for i in range(0, len(members), NODES_PER_RACK)]
        for start in range(0, len(type_racks), RACKS_PER_BLOCK):
            blocks.append(len(racks) + len(type_racks[start : start + RACKS_PER_BLOCK]))
            racks.extend(type_racks[start : start + RACKS_PER_BLOCK])
    rack_width = len(str(len(racks)))
    block_width = len(str(len(blocks)))
    placed = []
    rack_index = 0
    for block_index, end in enumerate(blocks):
        block = f"block-{block_index + 1:0{block_width}d}"
        zone = ZONES[block_index % len(ZONES)]
        while rack_index < end:
            rack = f"rack-{rack_index + 1:0{rack_width}d}"
            placed.extend(PlacedMachine(m, zone, block, rack) for m in racks[rack_index])
            rack_index += 1
    return placed


def device_classes_for(inventory):
    """Device classes with DRA-style CEL selectors; prices are illustrative list prices per GPU-hour."""
    return whole_gpu_classes(inventory) + partition_and_nic_classes() + [scratch_class()]


def whole_gpu_classes(inventory):
    attr = f'device.attributes["{DRIVER}"]'
    if inventory == "philly":
        return [
            DeviceClassSpec("gpu-12gb", f"{attr}.memory == 12", "0.90", "Philly GPUs with 12 GB (2 per machine)."),
            DeviceClassSpec("gpu-24gb", f"{attr}.memory >= 24", "1.80", "Philly GPUs with 24 GB (8 per machine)."),
        ]
    return [
        DeviceClassSpec("a10", f'{attr}.model == "A10"', "1.10", "NVIDIA A10, 24 GB."),
        DeviceClassSpec("a100-80gb", f'{attr}.model == "A100-SXM4-80GB"', "3.70", "NVIDIA A100 SXM4 80 GB."),
        DeviceClassSpec("a800-80gb", f'{attr}.model == "A800-SXM4-80GB"', "3.40", "NVIDIA A800 SXM4 80 GB."),
        DeviceClassSpec("h800", f'{attr}.model == "H800"', "4.80", "NVIDIA H800 80 GB."),
        DeviceClassSpec("gpu-series-1", f'{attr}.model == "GPU-series-1"', "1.00", "Anonymised series 1."),
        DeviceClassSpec("gpu-series-2", f'{attr}.model == "GPU-series-2"', "2.50", "Anonymised series 2."),
    ]


# A few nodes of the partitionable type (see partitioned_and_networked) publish each GPU whole and as
# MIG-style partitions, in the way an A30 cuts into four compute slices: the whole device and every
# profile consume the GPU's counter set, so a whole GPU excludes its partitions and vice versa, and
# partitions of both profiles pack onto one GPU. (profile, compute slices, partitions per GPU)
PARTITION_PROFILES = (("1g", 1, 4), ("2g", 2, 2))
SLICES_PER_GPU = 4
PARTITIONED_NODES = 4
# Nodes of one rack get two RDMA NICs, each under the PCIe root of four GPUs, so a claim can ask for
# GPUs beside their NIC (DRA matchAttribute); the rack is their network island.
NETWORKED_NODES = 8
GPUS_PER_PCIE_ROOT = 4


def partition_and_nic_classes():
    gpu = f'device.attributes["{DRIVER}"]'
    nic = f'device.attributes["{NIC_DRIVER}"]'
    return [
        DeviceClassSpec(
            f"mig-{profile}",
            f'{gpu}.profile == "{profile}"',
            price,
            f"A {slices}/{SLICES_PER_GPU} partition of a GPU ({profile} profile): its compute slices and "
            "memory, billed as that share of the GPU.",
        )
        for (profile, slices, _), price in zip(PARTITION_PROFILES, ("0.45", "0.90"), strict=True)
    ] + [
        DeviceClassSpec(
            "rdma-nic",
            f'device.driver == "{NIC_DRIVER}" && {nic}.kind == "rdma"',
            "0.20",
            "An RDMA network interface; ask for it beside GPUs under the same PCIe root.",
        )
    ]


def scratch_class():
    storage = f'device.attributes["{STORAGE_DRIVER}"]'
    return DeviceClassSpec(
        "rack-scratch",
        f'device.driver == "{STORAGE_DRIVER}" && {storage}.kind == "scratch"',
        "0.30",
        "A rack's network-attached scratch volume, reachable from every node of its rack: claim it once for "
        "a whole gang (a group claim), whose pods then stay in that rack.",
    )


def scratch_of(rack):
    """[(name, attributes)] of the scratch volume the networked rack publishes: `reach: rack` makes it
    reachable from every node of the rack (a ResourceSlice for the rack's nodeSelector), not only from
    the node that carries it in the inventory."""
    return [("scratch-0", {"kind": "scratch", "reach": "rack", "networkIsland": rack, "sizeGi": 4096})]


def partitionable_type(placed):
    """The machine type whose nodes are partitioned or networked: the first type (most devices per
    node) whose devices state their memory, as a partition profile is a share of it."""
    for p in placed:
        if "memory" in p.machine.attributes and p.machine.devices >= 2 * GPUS_PER_PCIE_ROOT:
            return p.machine.type_key
    return None


def partitioned_and_networked(placed):
    """({machine names partitioned}, {machine names with NICs}): in the last two racks of the
    partitionable type, away from its first rack (the demo reservation's) and from the last node of
    the list, which is drained for maintenance."""
    key = partitionable_type(placed)
    racks = {}
    for p in placed:
        if p.machine.type_key == key:
            racks.setdefault(p.rack, []).append(p.machine.name)
    names = sorted(racks)
    if len(names) < 3:
        return set(), set()
    last_node = max((p.machine.name for p in placed), key=str)
    partitioned = [name for name in racks[names[-1]] if name != last_node][:PARTITIONED_NODES]
    networked = [name for name in racks[names[-2]] if name != last_node][:NETWORKED_NODES]
    return set(partitioned), set(networked)


def partitions_of(machine, index):
    """[(name, attributes, consumes)] of GPU `index` of a partitioned machine."""
    memory = machine.attributes["memory"]
    counter_set = f"gpu-{index}"
    found = []
    for profile, slices, per_gpu in PARTITION_PROFILES:
        share = memory // per_gpu
        for number in range(per_gpu):
            attributes = {
                "profile": profile,
                "profileName": f"{profile}.{share}gb",
                "parentModel": machine.attributes["model"],
                "parentIndex": index,
                "slices": slices,
            }
            consumes = {counter_set: {"memory": f"{share}Gi", "slices": slices}}
            found.append((f"{index}-{profile}-{number}", attributes, consumes))
    return found


def gpu_counter_sets(machine):
    return {
        f"gpu-{index}": {"memory": f"{machine.attributes['memory']}Gi", "slices": SLICES_PER_GPU}
        for index in range(machine.devices)
    }


def whole_gpu_consumes(machine, index):
    return {f"gpu-{index}": {"memory": f"{machine.attributes['memory']}Gi", "slices": SLICES_PER_GPU}}


def pcie_root(index):
    return f"pci-{index // GPUS_PER_PCIE_ROOT}"


def nics_of(machine):
    """[(name, attributes)] of a networked machine: one NIC per PCIe root of its GPUs."""
    roots = range(machine.devices // GPUS_PER_PCIE_ROOT)
    return [(f"nic-{root}", {"kind": "rdma", "pcie_root": f"pci-{root}", "bandwidthGbps": 200}) for root in roots]


def partition_and_nic_capacity(placed):
    """{device class: devices} of the partitions and NICs, counted as quota counts them: a NIC per
    device, a partition by its share of its GPU (broker.scheduler.quota.Consumption), so each profile's
    class holds as many units as its partitioned GPUs."""
    partitioned, networked = partitioned_and_networked(placed)
    capacity = {}
    for p in placed:
        if p.machine.name in partitioned:
            for profile, slices, per_gpu in PARTITION_PROFILES:
                units = p.machine.devices * per_gpu * slices // SLICES_PER_GPU
                capacity[f"mig-{profile}"] = capacity.get(f"mig-{profile}", 0) + units
        if p.machine.name in networked:
            capacity["rdma-nic"] = capacity.get("rdma-nic", 0) + len(nics_of(p.machine))
    return capacity


def class_of(inventory, attributes):
    """The device class a device with these attributes falls in (the classes are disjoint)."""
    if inventory == "philly":
        return "gpu-12gb" if attributes.get("memory") == 12 else "gpu-24gb"
    model = attributes.get("model")
    return {
        "A10": "a10",
        "A100-SXM4-80GB": "a100-80gb",
        "A800-SXM4-80GB": "a800-80gb",
        "H800": "h800",
        "GPU-series-1": "gpu-series-1",
        "GPU-series-2": "gpu-series-2",
    }[model]


# Device classes of each menu entry, in fallback order (DRA firstAvailable), per inventory.
MENU = {
    "philly": {
        "small-inference": ["gpu-12gb", "gpu-24gb"],
        "batch-inference": ["gpu-12gb", "gpu-24gb"],
        "interactive-experiment": ["gpu-24gb", "gpu-12gb"],
        "distributed-training": ["gpu-24gb"],
        "large-reserved-training": ["gpu-24gb"],
        "gpu-slice": ["mig-1g", "mig-2g"],
        "networked-training": ["gpu-24gb", "rdma-nic"],
    },
    "alibaba-2026": {
        "small-inference": ["a10", "gpu-series-1"],
        "batch-inference": ["a10", "gpu-series-1", "gpu-series-2"],
        "interactive-experiment": ["a100-80gb", "a800-80gb"],
        "distributed-training": ["a100-80gb", "a800-80gb", "h800"],
        "large-reserved-training": ["h800", "a100-80gb"],
        "gpu-slice": ["mig-1g", "mig-2g"],
        "networked-training": ["a100-80gb", "rdma-nic"],
    },
}

PRIORITY_CLASSES = [
    ("production-inference", 1000, False, "Serving traffic; never preempted."),
    ("reserved-training", 900, False, "Approved large training runs; never preempted."),
    ("interactive", 500, True, "People waiting at a notebook."),
    ("training", 300, True, "Distributed training; preemptible by higher classes."),
    ("batch", 100, True, "Offline batch work; first to yield."),
]

RESOURCE_CLASSES = [
    {
        "name": "small-inference",
        "display_name": "Small inference",
        "description": "One or two devices for a serving replica; high priority, never preempted.",
        "priority_class": "production-inference",
        "preemptible": False,
        "preempts_across_queues": True,
        "max_devices": 2,
        "max_devices_per_pod": 2,
        "cost_label": "inference",
    },
    {
        "name": "batch-inference",
        "display_name": "Batch inference",
        "description": "Offline scoring; cheap, preemptible, kept rack-local where possible.",
        "priority_class": "batch",
        "topology_preferred": "rack",
        "max_devices": 16,
        "cost_label": "batch",
    },
    {
        "name": "interactive-experiment",
        "display_name": "Interactive experiment",
        "description": "A notebook or debugging session on up to one node, for up to 8 hours.",
        "priority_class": "interactive",
        "preempts_across_queues": True,
        "max_devices": 8,
        "max_devices_per_pod": 8,
        "max_duration_seconds": 8 * 3600,
        "cost_label": "research",
    },
    {
        "name": "distributed-training",
        "display_name": "Distributed training",
        "description": "A gang of pods inside one rack.",
        "priority_class": "training",
        "topology_required": "rack",
        "max_devices": 64,
        "cost_label": "training",
    },
    {
        "name": "large-reserved-training",
        "display_name": "Large reserved training",
        "description": "Large gangs inside one block; needs approval; never preempted.",
        "priority_class": "reserved-training",
        "topology_required": "block",
        "preemptible": False,
        "approval_required": True,
        "cost_label": "training",
    },
    {
        "name": "gpu-slice",
        "display_name": "GPU slice",
        "description": "A MIG-style partition of a GPU (1g or 2g profile) for a notebook or a small model.",
        "priority_class": "interactive",
        "sharing": "Partitioned",
        "preempts_across_queues": True,
        "max_devices": 4,
        "max_devices_per_pod": 1,
        "cost_label": "research",
    },
    {
        "name": "networked-training",
        "display_name": "Networked training",
        "description": "Pods that claim GPUs and an RDMA NIC under the same PCIe root (a claim with two requests).",
        "priority_class": "training",
        "topology_preferred": "rack",
        "max_devices": 40,
        "cost_label": "training",
    },
]

# Only the biggest virtual clusters may ask for block-sized reserved runs.
RESERVED_TRAINING_MIN_VC_NODES = 64


@dataclass(frozen=True)
class VirtualCluster:
    name: str
    nodes: int


def philly_virtual_clusters():
    """The Helios artifact's VC node quotas, plus every VC that appears only in philly.csv (no quota)."""
    base = traces_dir() / "philly"
    with open(base / "philly_vc_nodes_heliosartifact.csv", newline="") as handle:
        vcs = [VirtualCluster(row["vc"].strip(), int(row["node num"])) for row in csv.DictReader(handle)]
    known = {vc.name for vc in vcs}
    seen = set()
    with open(base / "philly.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            name = (row.get("cluster") or "").strip()
            if name and name not in known:
                seen.add(name)
    return vcs + [VirtualCluster(name, 0) for name in sorted(seen)]


def proportional_quotas(vcs, capacity):
    """{vc: {device class: devices}}: each class's devices shared in proportion to the VC's node quota,
    by largest remainder, so the quotas of a class add up exactly to its devices. The Helios node counts
    assume a uniform 8-GPU cluster, which this one is not; shares carry over, absolute counts do not."""
    total_nodes = sum(vc.nodes for vc in vcs)
    quotas = {vc.name: {} for vc in vcs}
    for device_class, devices in sorted(capacity.items()):
        exact = {vc.name: devices * vc.nodes / total_nodes if total_nodes else 0 for vc in vcs}
        floors = {name: int(value) for name, value in exact.items()}
        left = devices - sum(floors.values()) if total_nodes else 0
        by_remainder = sorted(exact, key=lambda name: (-(exact[name] - floors[name]), name))
        for name in by_remainder[:left]:
            floors[name] += 1
        for name, amount in floors.items():
            quotas[name][device_class] = amount
    return quotas
