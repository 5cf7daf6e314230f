"""Capacity accounting after a cycle: every device once, under one class, in exactly one state."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.accounting import ClassCapacity, capacity_by_class, strands, strands_by_shape
from broker.scheduler.capacity import CapacityState
from broker.scheduler.cycle import decide
from broker.scheduler.selectors import ClassMatcher
from broker.scheduler.snapshot import (
    NO_SCHEDULE_EFFECTS,
    Admission,
    CycleResult,
    Device,
    DeviceClass,
    Node,
    PendingDecision,
    PendingWorkload,
    PodPlacement,
    PodSet,
    Preemption,
    Queue,
    Reservation,
    ResourceClass,
    RunningPod,
    RunningWorkload,
    SchedulerConfig,
    Snapshot,
    Taint,
)
from tests.scheduler.strategies import CLASSES, LEVELS, QUIET, inventories, pending_work, running_work

H100 = DeviceClass("h100", match={"model": "H100"})
GPU = DeviceClass("gpu", selector='device.attributes["gpu.example.com"].model != ""')  # every device
PARTS = ("busy", "unhealthy", "reserved_unused", "stranded", "idle")


def devices(node, count, model="H100", **extra):
    return [Device(f"{node}/{index}", node, attributes={"model": model}, **extra) for index in range(count)]


def scene(pending=True):
    """n1, n2 (rack r1), n3 cordoned, n4 (rack r2): 4 H100 each but n3 (2); n5: 2 A100.
    Before the cycle: run-a (team1) holds n1/0-1, victim (team1) holds n4/0; n2/3 unhealthy, n1/3 tainted
    PreferNoSchedule (harmless). A team2 reservation of 1 h100. The cycle admits p1 on n2/0 and evicts
    the victim for p2 (3 per pod, still pending); p3 (1 per pod) is InvalidRequest."""
    inventory = (
        devices("n1", 3)
        + [Device("n1/3", "n1", attributes={"model": "H100"}, taints=(Taint("soft", effect="PreferNoSchedule"),))]
        + devices("n2", 3)
        + [Device("n2/3", "n2", attributes={"model": "H100"}, healthy=False)]
        + devices("n3", 2)
        + devices("n4", 4)
        + devices("n5", 2, model="A100")
    )
    nodes = (
        Node("n1", {"rack": "r1"}),
        Node("n2", {"rack": "r1"}),
        Node("n3", {"rack": "r2"}, schedulable=False),
        Node("n4", {"rack": "r2"}),
        Node("n5", {"rack": "r2"}),
    )
    waiting = (
        PendingWorkload("p1", "q1", (PodSet(devices_per_pod=1),), resource_class="open"),
        PendingWorkload("p2", "q1", (PodSet(devices_per_pod=3),), resource_class="open"),
        PendingWorkload("p3", "q2", (PodSet(devices_per_pod=1, device_classes=("h100",)),)),
    )
    snapshot = Snapshot(
        levels=("rack",),
        nodes=nodes,
        devices=tuple(inventory),
        device_classes=(H100, GPU),
        queues=(Queue("q1", "team1"), Queue("q2", "team2")),
        resource_classes=(ResourceClass("open", ("h100",)),),
        reservations=(Reservation("hold", "team2", "h100", 1),),
        running=(
            RunningWorkload("run-a", "q1", (RunningPod("main", 0, "n1", ("n1/0", "n1/1")),), "h100", preemptible=False),
            RunningWorkload("victim", "q1", (RunningPod("main", 0, "n4", ("n4/0",)),), "h100", preemptible=False),
        ),
        pending=waiting if pending else (),
    )
    result = CycleResult(
        admissions=(Admission("p1", "h100", (PodPlacement("main", 0, "n2", ("n2/0",)),)),),
        preemptions=(Preemption("victim", "p2", "WithinQueue", "for p2"),),
        pending=(PendingDecision("p2", "TopologyFragmented"), PendingDecision("p3", "InvalidRequest")),
    )
    return snapshot, result


def test_it_counts_the_state_after_the_cycles_decisions():
    snapshot, result = scene()
    gpu, h100 = capacity_by_class(snapshot, result)
    # Busy: run-a's 2, the evicting victim's 1 (it still holds it), p1's admission on n2/0.
    # Unhealthy: n2/3 and the cordoned n3's 2. Reserved: the first free device in order, n1/2, for team2.
    # Free and plain: n1/3 (alone on n1), n2/1-2 (2 on n2), n4/1-3 (3 on n4). p2 waits for pods of 3; p3 is
    # invalid and wants nothing: n1's and n2's are stranded, n4's idle.
    assert h100 == ClassCapacity(
        "h100",
        total=14,
        busy=4,
        unhealthy=3,
        reserved_unused=1,
        reserved_unused_by_team={"team2": 1},
        stranded=3,
        idle=3,
    )
    # gpu selects every device, h100 fewer: H100s are billed under h100, the A100s under gpu, idle (no
    # pending work wants gpu).
    assert gpu == ClassCapacity("gpu", total=2, idle=2)


def test_it_calls_nothing_stranded_when_nothing_waits():
    snapshot, result = scene(pending=False)
    result = replace(result, pending=())
    _, h100 = capacity_by_class(snapshot, result)
    assert (h100.stranded, h100.idle) == (0, 6)


def test_it_takes_no_demand_from_work_that_policy_holds_back():
    snapshot, result = scene()
    for reason in ("NotEntitled", "AwaitingApproval", "QuotaExceeded"):
        held = replace(result, pending=(PendingDecision("p2", reason), PendingDecision("p3", "InvalidRequest")))
        _, h100 = capacity_by_class(snapshot, held)
        assert h100.stranded == 0, reason


def test_it_strands_a_device_only_when_every_wanted_class_is_short_on_its_node():
    assert strands({"h100"}, {"h100": 2}, {"h100": 3})
    assert not strands({"h100"}, {"h100": 3}, {"h100": 3})
    assert not strands({"h100", "gpu"}, {"h100": 2, "gpu": 2}, {"h100": 3, "gpu": 1})
    assert not strands({"h100"}, {"h100": 1}, {"a100": 4})  # nobody wants h100: idle


# --- against a brute force --------------------------------------------------------------------------------


@st.composite
def accounting_cases(draw):
    nodes, inventory = draw(inventories())
    overlapping = draw(st.booleans())
    classes = CLASSES + ((GPU,) if overlapping else ())
    reservations = tuple(
        Reservation(
            f"res{index}",
            draw(st.sampled_from(("team1", "team2"))),
            draw(st.sampled_from(("h100", "a100"))),
            draw(st.integers(1, 4)),
            domain=draw(st.sampled_from((None, {"rack": "r0"}, {"block": "b0"}))),
            start=draw(st.sampled_from((0.0, 50.0))),
        )
        for index in range(draw(st.integers(0, 2)))
    )
    running = draw(running_work(inventory))
    running = tuple(replace(workload, preemptible=draw(st.booleans())) for workload in running)
    config = draw(st.sampled_from((QUIET, SchedulerConfig(rerun_verification_limit=10))))
    snapshot = Snapshot(
        levels=LEVELS,
        nodes=nodes,
        devices=inventory,
        device_classes=classes,
        queues=(Queue("q1", "team1", within_queue="LowerPriority"), Queue("q2", "team2")),
        resource_classes=(
            ResourceClass("open", ("h100", "a100")),
            ResourceClass("closed", ("h100", "a100"), teams=("team2",)),
            ResourceClass("approval", ("h100", "a100"), approval_required=True),
        ),
        reservations=reservations,
        running=running,
        pending=draw(pending_work(with_classes=draw(st.booleans()))),
        now=10.0,
        config=config,
    )
    return snapshot


def brute_force(snapshot, result):
    """Each device on its own, by the definitions, with the core's reservations over the whole cluster."""
    matcher = ClassMatcher(snapshot.device_classes)
    names = tuple(sorted(device_class.name for device_class in snapshot.device_classes))
    classes = {device.id: matcher.classes_of(device) for device in snapshot.devices}
    selected = {name: sum(name in found for found in classes.values()) for name in names}
    holder_class = {}
    for workload in snapshot.running:
        for pod in workload.pods:
            for device_id in pod.device_ids:
                holder_class[device_id] = workload.device_class
    for admission in result.admissions:
        for pod in admission.pods:
            for device_id in pod.device_ids:
                holder_class[device_id] = admission.device_class
    state = CapacityState(snapshot, matcher, names)
    owner = {slot.id: slot.owner for slot in state.slots if slot.owner is not None and slot.holder is None}
    schedulable = {node.name: node.schedulable for node in snapshot.nodes}

    def unusable(device):
        blocking = [taint for taint in device.taints if taint.effect in NO_SCHEDULE_EFFECTS]
        return not device.healthy or not schedulable.get(device.node, True) or bool(blocking)

    def plain_free(device):
        return device.id not in holder_class and not unusable(device) and device.id not in owner

    gone = {a.workload_id for a in result.admissions} | {
        d.workload_id
        for d in result.pending
        if d.reason in ("InvalidRequest", "NotEntitled", "AwaitingApproval", "QuotaExceeded")
    }
    offered = {rc.name: rc for rc in snapshot.resource_classes}
    shapes = []  # (classes wanted, smallest pod, required level or None, devices its gang needs)
    for workload in snapshot.pending:
        if workload.id in gone:
            continue
        declared = [pod_set.device_classes for pod_set in workload.pod_sets if pod_set.device_classes]
        rc = offered.get(workload.resource_class)
        wanted = declared[0] if declared else (rc.device_classes if rc else ())
        per_pod = min(pod_set.devices_per_pod for pod_set in workload.pod_sets)
        level = workload.topology_required
        if level is None:
            level = rc.topology_required if rc else None
        needed = sum(pod_set.gang_size * pod_set.devices_per_pod for pod_set in workload.pod_sets)
        shapes.append((tuple(wanted), per_pod, level or None, needed))
    demand = {name for wanted, _, _, _ in shapes for name in wanted}
    levels = tuple(snapshot.levels)
    node_domains = {node.name: node.domains for node in snapshot.nodes}

    def path(node, level):
        if level == "node":
            return (node,)
        upto = levels[: levels.index(level) + 1] if level in levels else levels
        return tuple(str(node_domains.get(node, {}).get(name, "-")) for name in upto)

    def free_of(name, where=lambda device: True):
        return sum(1 for other in snapshot.devices if name in classes[other.id] and plain_free(other) and where(other))

    rows = {name: {part: 0 for part in PARTS} | {"by_team": {}} for name in names}
    for device in snapshot.devices:
        if device.id in holder_class:
            if holder_class[device.id] in rows:
                rows[holder_class[device.id]]["busy"] += 1
            continue
        if not classes[device.id]:
            continue
        row = rows[min(classes[device.id], key=lambda name: (selected[name], name))]
        if unusable(device):
            row["unhealthy"] += 1
        elif device.id in owner:
            row["reserved_unused"] += 1
            row["by_team"][owner[device.id]] = row["by_team"].get(owner[device.id], 0) + 1
        else:
            wanted = [name for name in classes[device.id] if name in demand]

            def usable(name, per_pod, level, needed, device=device):
                if free_of(name, lambda other: other.node == device.node) < per_pod:
                    return False
                if level is None or free_of(name) < needed:
                    return True
                here = path(device.node, level)
                return free_of(name, lambda other: path(other.node, level) == here) >= needed

            fits = any(
                usable(name, per_pod, level, needed)
                for want, per_pod, level, needed in shapes
                for name in wanted
                if name in want
            )
            short = wanted and not fits
            row["stranded" if short else "idle"] += 1
    return {
        name: ClassCapacity(
            name,
            total=sum(row[part] for part in PARTS),
            busy=row["busy"],
            unhealthy=row["unhealthy"],
            reserved_unused=row["reserved_unused"],
            reserved_unused_by_team=dict(sorted(row["by_team"].items())),
            stranded=row["stranded"],
            idle=row["idle"],
        )
        for name, row in rows.items()
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(accounting_cases())
def test_it_agrees_with_a_brute_force_and_the_parts_sum_to_the_total(snapshot):
    result = decide(snapshot)
    rows = capacity_by_class(snapshot, result)
    assert {row.device_class: row for row in rows} == brute_force(snapshot, result)
    for row in rows:
        assert sum(getattr(row, part) for part in PARTS) == row.total
        assert sum(row.reserved_unused_by_team.values()) == row.reserved_unused
    held = {device_id for w in snapshot.running for pod in w.pods for device_id in pod.device_ids}
    held |= {device_id for a in result.admissions for pod in a.pods for device_id in pod.device_ids}
    billed = sum(1 for device in snapshot.devices if device.id not in held) + len(held)
    assert sum(row.total for row in rows) == billed  # every device once (each one some class selects)


def rack_scene(required):
    """Two racks of two 4-device nodes, two devices busy on each node: 4 free per rack, 8 in all. One
    gang of 3 pods × 2 waits, bound to one rack or not."""
    from broker.scheduler.snapshot import DeviceClass, Node, PendingWorkload, PodSet, Queue, Snapshot

    nodes = tuple(Node(f"n{i}", {"rack": f"r{i // 2}"}) for i in range(4))
    devices = tuple(Device(f"n{i}/{d}", f"n{i}", attributes={"model": "H100"}) for i in range(4) for d in range(4))
    busy = tuple(RunningPod("main", i, f"n{i}", (f"n{i}/0", f"n{i}/1")) for i in range(4))
    gang = PendingWorkload(
        "gang", "q1", (PodSet("main", 3, 3, 2, ("h100",)),), topology_required=required, approved=True
    )
    snapshot = Snapshot(
        levels=("rack",),
        nodes=nodes,
        devices=devices,
        device_classes=(DeviceClass("h100", match={"model": "H100"}),),
        queues=(Queue("q1", "team1"),),
        running=(RunningWorkload("busy", "q1", busy, "h100"),),
        pending=(gang,),
    )
    return snapshot, CycleResult(pending=(PendingDecision("gang", "TopologyFragmented"),))


def test_it_strands_what_a_gang_bound_to_one_rack_cannot_use():
    """Issue 27: 8 devices free, 4 in each rack; a gang of 6 in one rack can use none of them (every
    node has room for a pod of 2, so per-pod fit alone called them idle). Without the rack it could."""
    (h100,) = capacity_by_class(*rack_scene("rack"))
    assert (h100.stranded, h100.idle) == (8, 0)
    (h100,) = capacity_by_class(*rack_scene(None))
    assert (h100.stranded, h100.idle) == (0, 8)


def test_it_strands_by_shape_only_where_no_wanted_shape_fits():
    gangs = {"h100": {("rack", 2, 6)}}
    assert strands_by_shape({"h100"}, {"h100": 2}, {}, gangs, {("h100", "rack"): 4}, {"h100": 8})
    assert not strands_by_shape({"h100"}, {"h100": 2}, {}, gangs, {("h100", "rack"): 6}, {"h100": 8})
    # The cluster has fewer than the gang needs: it waits for capacity, not for a shape.
    assert not strands_by_shape({"h100"}, {"h100": 2}, {}, gangs, {("h100", "rack"): 4}, {"h100": 5})
    # Other work with no required level fits the node: usable.
    assert not strands_by_shape({"h100"}, {"h100": 2}, {"h100": 1}, gangs, {("h100", "rack"): 4}, {"h100": 8})


def test_it_bills_a_partitionable_gpu_once_and_its_partitions_by_use():
    from broker.scheduler.scenario import load_scenario

    snapshot = load_scenario(
        """
device_classes:
  whole: {match: {profile: whole}}
  slice: {match: {profile: 1g}}
  half: {match: {profile: 4g}}
nodes:
  - name: n1
    devices: 2
    counters: {memory: 8}
    partitions:
      - {profile: 1g, count: 8, consumes: {memory: 1}}
      - {profile: 4g, count: 2, consumes: {memory: 4}}
queues: [{name: q}]
running:
  - {name: r, queue: q, device_class: slice, pods: [{node: n1, devices: ["1:1g#0", "1:1g#1"]}]}
"""
    )
    rows = {row.device_class: row for row in capacity_by_class(snapshot, CycleResult())}
    # n1/0 is idle whole (one device, not eleven); on n1/1 two slices are busy and of what fits the
    # rest (six slices, one 4g) only the largest, the 4g, is billed.
    assert (rows["whole"].total, rows["whole"].idle) == (1, 1)
    assert (rows["slice"].total, rows["slice"].busy) == (2, 2)
    assert (rows["half"].total, rows["half"].idle) == (1, 1)


def test_it_counts_a_reservation_beside_partitions_that_are_not_billed():
    from broker.scheduler.scenario import load_scenario

    snapshot = load_scenario(
        """
device_classes:
  whole: {match: {profile: whole}}
  slice: {match: {profile: 1g}}
nodes:
  - name: n1
    devices: 2
    counters: {memory: 8}
    partitions:
      - {profile: 1g, count: 8, consumes: {memory: 1}}
  - name: n2
    devices: 2
queues: [{name: q}]
reservations:
  - {name: hold, queue: q, device_class: whole, count: 1}
running:
  - {name: r, queue: q, device_class: slice, pods: [{node: n1, devices: ["1:1g#0"]}]}
"""
    )
    rows = {row.device_class: row for row in capacity_by_class(snapshot, CycleResult())}
    # The partitions of both GPUs of n1 that nobody uses are left out of the bill; the hold still
    # takes one whole device.
    assert rows["whole"].reserved_unused == 1
    assert rows["slice"].busy == 1
