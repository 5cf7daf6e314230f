"""What every device of each class is doing once a cycle's decisions apply: the counts finance bills.

`capacity_by_class(snapshot, result)` describes the cluster AFTER `result`: admissions hold the devices
they were given, victims being evicted still hold theirs (they leave later), everything else is as the
snapshot says. Every device is counted once, under one class, so overlapping classes bill nothing twice:
a held device under the class its holder was admitted with; a free device under its *home* class, the
most specific class selecting it (the one selecting the fewest devices, then by name). A device no class
selects is not counted (it has no price). Each class's parts sum to its total:

  busy             held by running or just-admitted work (including evicting victims);
  unhealthy        free, but it takes no new work: not healthy, tainted NoSchedule/NoExecute, or on a
                   cordoned node;
  reserved_unused  free and healthy, held by an active reservation its owner does not use. Reservations
                   are materialised exactly as the scheduler does it (capacity.CapacityState): by name,
                   the owner's own running devices first, then free devices in node/device order, then
                   devices other teams hold with preemptible work;
  stranded         free, healthy, unreserved, wanted by pending work, and unusable by it because of its
                   shape: the cost of fragmentation. Pending work here is every workload still pending
                   after the cycle that only capacity holds back: not InvalidRequest (it can never run on
                   this cluster as built), NotEntitled, AwaitingApproval or QuotaExceeded (policy holds
                   them, whatever the shape of the free devices), so what they cannot use is not
                   fragmentation. A class is *wanted* when it is in the
                   fallback list of such a workload; its *smallest request* is the smallest per-pod
                   device count among them. A device is stranded when some pending workload wants one of
                   its classes and, for every wanted class, its node has fewer free healthy unreserved
                   devices of that class than the class's smallest request (with disjoint classes: the
                   node has fewer free devices of the device's class than the smallest request for it).
                   A device no pending workload wants is idle, not stranded: it waits for demand, not for
                   a shape. Topology and gang shape count too (issue 27): work bound to one domain of a
                   level can use a node only if the node's domain there has as many free devices of the
                   class as the gang needs (or the whole cluster has fewer: then it waits for capacity,
                   not for a shape); a device that only such work wants, in domains too small for it,
                   is stranded (`strands_by_shape`). Simplification: match_attribute, tolerated taints
                   and a team's own reservations are not considered;
  idle             the rest: free, healthy, unreserved and usable (or not wanted at all).

Partitionable devices (DRA counter sets) are billed by what they use of the hardware: a held partition
is one device of its class (whose price is the partition's share of the GPU); of the free devices of
one counter set only the largest that still fits its counters is billed (the whole device when nothing
of it is used), and the free ones that no longer fit are not billed at all. So a GPU cut into seven
slices bills one device when idle, not eight, and never more than its partitions in use plus one.

Shared devices (DRA allowMultipleAllocations, consumable capacity) are billed by what each allocation
takes of them (`device_share`): an allocation's share is the largest fraction among the device's
capacities it consumes (the capacity that dominates: 20 of 80 GiB of memory and 1 of 2 encoders is 1/2),
at most the whole device, rounded down to a millionth of a device (SHARE_SCALE, the unit finance bills
shares in). A device several allocations share is counted once, as busy, like a held device; what its
shares leave of it (`SharedParts`: one device minus their sum) is its free remainder, which the free
rules place: unhealthy when the device takes no new work; stranded when pending time-sliced work wants
one of its classes and none of their pods' amounts fit what its capacities have left; else idle. (A
reservation holds whole devices: a remainder is never reserved.) Shares dominated by different
capacities may sum past one device (60% of the memory and 10% of the compute beside 10% of the memory
and 80% of the compute: 0.6 + 0.8): the device is then billed that sum, the excess counted as `over`,
so the capacity billed always equals what its allocations are billed plus its free parts.

Pure and cheap: one pass over the devices with classes cached per distinct description; reservations
(when any is active) materialised as the core's CapacityState does it, without building one: a scan in
the core's device order that stops once each reservation is full.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from itertools import chain, compress
from operator import attrgetter, not_

from broker.scheduler.capacity import NODE_LEVEL, _device_key, natural_key
from broker.scheduler.quota import Consumption
from broker.scheduler.selectors import ClassMatcher
from broker.scheduler.snapshot import NO_SCHEDULE_EFFECTS, CycleResult, Snapshot, held_outside

INVALID = "InvalidRequest"
# Pending for a reason no shape of free capacity would change: such work creates no demand.
HELD_BY_POLICY = frozenset({INVALID, "NotEntitled", "AwaitingApproval", "QuotaExceeded"})
# Shares of shared devices are counted in millionths of a device: exact integers for the ledger and
# its stored rollups, and far finer than any price (a millionth of an 80 GB GPU is 80 KB).
SHARE_SCALE = 1_000_000


def device_share(capacity: Mapping[str, float], consumed) -> Fraction:
    """What one allocation of a shared device counts for: the largest fraction among the device's
    `capacity` ({name: number}) that `consumed` ({name: amount} or its pairs) takes, at most 1, rounded
    down to a millionth (SHARE_SCALE). Amounts of capacities the device does not publish count for
    nothing; an allocation taking none it publishes holds the whole device (as quota counts it)."""
    pairs = consumed.items() if isinstance(consumed, Mapping) else consumed
    fractions = [Fraction(amount) / Fraction(capacity[name]) for name, amount in pairs if capacity.get(name)]
    if not fractions:
        return Fraction(1)
    dominant = min(Fraction(1), max(max(fractions), Fraction(0)))
    return Fraction(int(dominant * SHARE_SCALE), SHARE_SCALE)


def share_millionths(capacity: Mapping[str, float], consumed) -> int:
    """`device_share` as the whole millionths of the device it is (it is rounded down to one)."""
    return int(device_share(capacity, consumed) * SHARE_SCALE)


@dataclass(frozen=True)
class ClassCapacity:
    """One device class after a cycle; busy + unhealthy + reserved_unused + stranded + idle == total."""

    device_class: str
    total: int = 0
    busy: int = 0
    unhealthy: int = 0
    reserved_unused: int = 0
    reserved_unused_by_team: dict = field(default_factory=dict)
    stranded: int = 0
    idle: int = 0
    # The devices several allocations share, each counted once in `busy`: {category: Fraction of a
    # device} with "over" (what their shares bill beyond one device each) and their free remainders
    # ("unhealthy", "stranded", "idle"; already part of no whole count). Empty without such devices.
    shared: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SharedParts:
    """One shared device after a cycle: its billing class, the shares its allocations take, and what its
    capacities have left ({name: amount})."""

    device_class: str
    used: Fraction
    left: dict


def capacity_by_class(
    snapshot: Snapshot, result: CycleResult, matcher: ClassMatcher | None = None
) -> tuple[ClassCapacity, ...]:
    """One ClassCapacity per device class of the snapshot, by class name."""
    matcher = matcher or ClassMatcher(snapshot.device_classes)
    names = tuple(sorted(device_class.name for device_class in snapshot.device_classes))
    held, busy_by_holder = _held_after(snapshot, result)
    cordoned = frozenset(node.name for node in snapshot.nodes if not node.schedulable)

    # 1. Classes of every device (the matcher caches them per description and compares each device with
    #    the previous one first), how many devices each class selects, and which devices are free.
    devices = snapshot.devices
    if snapshot.counter_sets:
        unbilled = unbilled_partitions(snapshot, held)
        if unbilled:
            devices = [device for device in devices if device.id not in unbilled]
    if any(map(_held_outside, devices)):
        # Allocated by another scheduler: not the broker's to bill, neither to a team nor as idle.
        devices = [device for device in devices if not _held_outside(device)]
    kinds = list(map(matcher.classes_of, devices))
    per_kind = Counter(kinds)
    is_free = list(map(not_, map(held.__contains__, map(attrgetter("id"), devices))))
    free = list(compress(devices, is_free))
    free_kinds = list(compress(kinds, is_free))
    if len(devices) - len(free) == len(held) == sum(busy_by_holder.values()):
        busy_of = busy_by_holder  # every held id is a device of the snapshot, held once (the usual case)
    else:
        busy_of = _held_classes(snapshot, result, devices, is_free)
    busy = {name: busy_of.get(name, 0) for name in names}
    selected = dict.fromkeys(names, 0)
    for classes, count in per_kind.items():
        for name in classes:
            selected[name] += count
    home = {classes: min(classes, key=lambda name: (selected[name], name)) for classes in per_kind if classes}

    # 2. What each free device does, first match wins: unhealthy, reserved, else it joins its
    #    (node, classes) group. Most free devices are plain: count them all, then take the few others out.
    # `kinds` follows `devices`, which leaves out unbilled partitions: reserved_owners walks them all.
    owners = reserved_owners(snapshot, matcher, names, kinds if devices is snapshot.devices else None)
    free_nodes = list(map(attrgetter("node"), free))
    groups = Counter(zip(free_nodes, free_kinds, strict=True))
    unhealthy = dict.fromkeys(names, 0)
    reserved = dict.fromkeys(names, 0)
    by_team: dict[str, dict[str, int]] = {name: {} for name in names}
    others = map(
        any,
        zip(
            map(not_, map(attrgetter("healthy"), free)),
            map(attrgetter("taints"), free),
            map(cordoned.__contains__, free_nodes),
            map(owners.__contains__, map(attrgetter("id"), free)),
            strict=True,
        ),
    )
    for device, classes in compress(zip(free, free_kinds, strict=True), others):
        if not classes:
            continue
        name = home[classes]
        if not device.healthy or device.node in cordoned or _blocking(device.taints):
            unhealthy[name] += 1
        elif device.id in owners:
            owner = owners[device.id]
            reserved[name] += 1
            by_team[name][owner] = by_team[name].get(owner, 0) + 1
        else:
            continue  # a taint that keeps no work off (PreferNoSchedule): plain
        groups[(device.node, classes)] -= 1

    # 3. Stranded: wanted by pending work, but no wanted shape can use the node's free devices.
    plain, gangs = demand_shapes(snapshot, result)
    node_free: dict[str, dict[str, int]] = {}
    if plain or gangs:
        for (node, classes), count in groups.items():
            counts = node_free.setdefault(node, {})
            for name in classes:
                counts[name] = counts.get(name, 0) + count
    domain_free, class_free = ({}, {})
    if gangs:
        node_domains = {node.name: node.domains for node in snapshot.nodes}
        levels = tuple(snapshot.levels)
        domain_free, class_free = domain_totals(
            node_free, lambda node: {**domain_paths(node_domains.get(node), levels), NODE_LEVEL: (node,)}
        )
    stranded = dict.fromkeys(names, 0)
    idle = dict.fromkeys(names, 0)
    for (node, classes), count in groups.items():
        if not classes:
            continue  # no class selects these devices: they are not billed
        if (plain or gangs) and strands_by_shape(
            classes, node_free[node], plain, gangs, domain_free.get(node, {}), class_free
        ):
            stranded[home[classes]] += count
        else:
            idle[home[classes]] += count

    # 4. The devices several allocations share: what their shares leave, and where it goes.
    shared = shared_remainders(snapshot, result, matcher, cordoned, set(names)) if snapshot.devices else {}

    out = []
    for name in names:
        row = ClassCapacity(
            device_class=name,
            busy=busy[name],
            unhealthy=unhealthy[name],
            reserved_unused=reserved[name],
            reserved_unused_by_team=dict(sorted(by_team[name].items())),
            stranded=stranded[name],
            idle=idle[name],
            shared=shared.get(name, {}),
        )
        out.append(replace(row, total=row.busy + row.unhealthy + row.reserved_unused + row.stranded + row.idle))
    return tuple(out)


def shared_parts(snapshot: Snapshot, result: CycleResult) -> dict[str, SharedParts]:
    """{device id: SharedParts} of the devices held by shares once `result` applies (running work and
    admissions whose pods consume amounts of them). The class is the one the device is counted under
    as busy: its last holder's (admissions last)."""
    capacities = Consumption.of_snapshot(snapshot).capacities
    if not capacities:
        return {}
    out: dict[str, SharedParts] = {}

    def take(pods, device_class):
        for pod in pods:
            if not pod.consumed:
                continue
            for device_id in pod.device_ids:
                capacity = capacities.get(device_id)
                if capacity is None:
                    continue
                known = out.get(device_id)
                left = dict(capacity) if known is None else known.left
                for name, amount in pod.consumed:
                    left[name] = left.get(name, 0) - amount
                used = device_share(capacity, pod.consumed) + (known.used if known else 0)
                out[device_id] = SharedParts(device_class, used, left)

    for workload in snapshot.running:
        take(workload.pods, workload.device_class)
    for admission in result.admissions:
        take(admission.pods, admission.device_class)
    return out


def shared_remainders(
    snapshot: Snapshot, result: CycleResult, matcher: ClassMatcher, cordoned: frozenset, names: set
) -> dict[str, dict[str, Fraction]]:
    """{class: {category: Fraction of a device}} of the shared devices (see the module docstring)."""
    parts = shared_parts(snapshot, result)
    if not parts:
        return {}
    by_id = {device.id: device for device in snapshot.devices if device.id in parts}
    wanted = shared_demand(snapshot, result) if any(p.used < 1 for p in parts.values()) else {}
    out: dict[str, dict[str, Fraction]] = {}
    for device_id, part in parts.items():
        device = by_id.get(device_id)
        if device is None or part.device_class not in names or _held_outside(device):
            continue
        if part.used > 1:
            category, amount = "over", part.used - 1
        elif part.used < 1:
            amount = 1 - part.used
            if not device.healthy or device.node in cordoned or _blocking(device.taints):
                category = "unhealthy"
            else:
                demands = [amounts for name in matcher.classes_of(device) for amounts in wanted.get(name, ())]
                fits = any(all(part.left.get(n, 0) >= a for n, a in amounts) for amounts in demands)
                category = "stranded" if demands and not fits else "idle"
        else:
            continue
        counts = out.setdefault(part.device_class, {})
        counts[category] = counts.get(category, 0) + amount
    return out


def shared_demand(snapshot: Snapshot, result: CycleResult) -> dict[str, list]:
    """{class: [the (capacity, amount) pairs of a pod]} of pending time-sliced work that capacity holds
    back (as for `demand_shapes`): what could use a shared device's remainder."""
    skip = {admission.workload_id for admission in result.admissions}
    skip.update(decision.workload_id for decision in result.pending if decision.reason in HELD_BY_POLICY)
    offered = {rc.name: rc.device_classes for rc in snapshot.resource_classes}
    out: dict[str, list] = {}
    for workload in snapshot.pending:
        if workload.id in skip:
            continue
        declared = [pod_set.device_classes for pod_set in workload.pod_sets]
        classes = workload_classes(declared, offered.get(workload.resource_class, ()))
        for pod_set in workload.pod_sets:
            if pod_set.capacity:
                for name in classes:
                    if pod_set.capacity not in out.setdefault(name, []):
                        out[name].append(pod_set.capacity)
    return out


def unbilled_partitions(snapshot: Snapshot, held: set) -> set[str]:
    """Ids of the free devices consuming shared counters that are not billed: those that no longer fit
    what held devices leave of their counters, and all but the largest (by share of its set, then id) of
    those that fit, per counter set."""
    values = {
        (counter_set.node, counter_set.name, counter): value
        for counter_set in snapshot.counter_sets
        for counter, value in counter_set.counters.items()
    }
    left = dict(values)
    consuming = [device for device in snapshot.devices if device.consumes_counters]
    for device in consuming:
        if device.id in held:
            for set_name, counters in device.consumes_counters.items():
                for counter, amount in counters.items():
                    key = (device.node, set_name, counter)
                    left[key] = left.get(key, 0) - amount
    unbilled = set()
    largest: dict[tuple, tuple] = {}  # (node, first counter set) -> (share, device id) of the one billed
    for device in consuming:
        if device.id in held:
            continue
        keys = [
            ((device.node, set_name, counter), amount)
            for set_name, counters in device.consumes_counters.items()
            for counter, amount in counters.items()
        ]
        if any(left.get(key, 0) < amount for key, amount in keys):
            unbilled.add(device.id)
            continue
        share = max((amount / values[key] if values.get(key) else 1.0 for key, amount in keys), default=0.0)
        family = (device.node, next(iter(device.consumes_counters)))
        known = largest.get(family)
        mine = (share, _device_key(device.id))
        if known is None:
            largest[family] = (mine, device.id)
        elif (-mine[0], mine[1]) < (-known[0][0], known[0][1]):
            unbilled.add(known[1])
            largest[family] = (mine, device.id)
        else:
            unbilled.add(device.id)
    return unbilled


def strands(classes: Iterable[str], node_free: Mapping[str, int], demand: Mapping[str, int]) -> bool:
    """Whether a free device of `classes` is stranded on a node with `node_free` free devices per class:
    some pending work wants one of its classes, and for every wanted class the node has fewer free
    devices than the smallest per-pod request for it. Not wanted at all: idle, never stranded."""
    wanted = [name for name in classes if name in demand]
    return bool(wanted) and all(node_free.get(name, 0) < demand[name] for name in wanted)


def strands_by_shape(
    classes: Iterable[str],
    node_free: Mapping[str, int],
    plain: Mapping[str, int],
    gangs: Mapping[str, Iterable[tuple]],
    domain_free: Mapping[tuple, int],
    class_free: Mapping[str, int],
) -> bool:
    """`strands` with topology and gang shape (issue 27; the dashboard and finance both ask this).
    plain: class -> smallest per-pod request of pending work with no required level; gangs: class ->
    (level, per pod, devices needed) of pending work bound to one domain of `level`; domain_free:
    (class, level) -> free devices of the class in this node's domain of that level; class_free: class ->
    free devices of the class in the cluster. Stranded: wanted, and no wanted shape can use the node."""
    wanted = False
    for name in classes:
        here = node_free.get(name, 0)
        smallest = plain.get(name)
        if smallest is not None:
            wanted = True
            if here >= smallest:
                return False
        for level, per_pod, needed in gangs.get(name, ()):
            wanted = True
            if here >= per_pod and (domain_free.get((name, level), 0) >= needed or class_free.get(name, 0) < needed):
                return False
    return wanted


def add_gang(gangs: dict, classes: Iterable[str], level: str, per_pod: int, needed: int) -> None:
    """Record pending work bound to one domain of `level`, keeping per class only the shapes no other
    shape of the level makes easier (smaller pods and fewer devices)."""
    for name in classes:
        shapes = gangs.setdefault(name, set())
        if any(l == level and p <= per_pod and n <= needed for l, p, n in shapes):  # noqa: E741
            continue
        shapes.difference_update({s for s in shapes if s[0] == level and s[1] >= per_pod and s[2] >= needed})
        shapes.add((level, per_pod, needed))


def domain_paths(domains: Mapping | None, levels: tuple) -> dict[str, tuple]:
    """level -> the node's domain there as its path from the coarsest level (racks of one name in two
    blocks stay two racks)."""
    paths, path = {}, ()
    for level in levels:
        path = path + (str((domains or {}).get(level, "-")),)
        paths[level] = path
    return paths


def domain_totals(node_free: Mapping, paths_of) -> tuple[dict, dict]:
    """({node: {(class, level): free devices of the class in its domain of the level}}, {class: free in
    the cluster}) from each node's free devices per class; `paths_of(node)`: level -> domain path."""
    per_domain: dict[tuple, int] = {}
    class_free: dict[str, int] = {}
    paths = {node: paths_of(node) for node in node_free}
    for node, counts in node_free.items():
        for name, count in counts.items():
            class_free[name] = class_free.get(name, 0) + count
            for level, path in paths[node].items():
                per_domain[(name, level, path)] = per_domain.get((name, level, path), 0) + count
    out = {}
    for node, counts in node_free.items():
        out[node] = {
            (name, level): per_domain[(name, level, path)] for name in counts for level, path in paths[node].items()
        }
    return out, class_free


def add_demand(demand: dict, classes: Iterable[str], per_pod: int) -> None:
    """Record that pending work wants `classes` with pods of `per_pod` devices (smallest wins)."""
    if per_pod <= 0:
        return
    for name in classes:
        current = demand.get(name)
        if current is None or per_pod < current:
            demand[name] = per_pod


def workload_classes(declared: Iterable[tuple], offered: tuple) -> tuple:
    """A workload's fallback list as the core resolves it: the classes its pod sets declare (they all
    declare the same ones), else those its resource class offers."""
    for classes in declared:
        if classes:
            return tuple(classes)
    return tuple(offered)


def demand_shapes(snapshot: Snapshot, result: CycleResult) -> tuple[dict[str, int], dict[str, set]]:
    """(plain, gangs) of the workloads still pending after `result` that capacity holds back (see
    `strands_by_shape`): work with no required level by its smallest per-pod request, work bound to one
    domain by (level, smallest per-pod request, devices its gang needs)."""
    skip = {admission.workload_id for admission in result.admissions}
    skip.update(decision.workload_id for decision in result.pending if decision.reason in HELD_BY_POLICY)
    offered = {rc.name: rc for rc in snapshot.resource_classes}
    plain: dict[str, int] = {}
    gangs: dict[str, set] = {}
    seen = set()
    for workload in snapshot.pending:
        pod_sets = workload.pod_sets
        if not pod_sets or workload.id in skip:
            continue
        resource_class = offered.get(workload.resource_class)
        declared = (pod_set.device_classes for pod_set in pod_sets)
        classes = workload_classes(declared, resource_class.device_classes if resource_class else ())
        per_pod = min(pod_set.devices_per_pod for pod_set in pod_sets)
        level = workload.topology_required
        if level is None:
            level = resource_class.topology_required if resource_class else None
        needed = sum(pod_set.gang_size * pod_set.devices_per_pod for pod_set in pod_sets)
        shape = (classes, per_pod, level or None, needed if level else 0)
        if shape in seen:
            continue
        seen.add(shape)
        if level:
            add_gang(gangs, classes, level, per_pod, needed)
        else:
            add_demand(plain, classes, per_pod)
    return plain, gangs


def pending_demand(snapshot: Snapshot, result: CycleResult) -> dict[str, int]:
    """{device class: smallest per-pod request among workloads still pending after `result` that may use
    it}; admitted workloads and those held by policy (HELD_BY_POLICY) want nothing."""
    skip = {admission.workload_id for admission in result.admissions}
    skip.update(decision.workload_id for decision in result.pending if decision.reason in HELD_BY_POLICY)
    offered = {rc.name: rc.device_classes for rc in snapshot.resource_classes}
    wants = set()  # distinct (fallback list, smallest per-pod request): a few among thousands of workloads
    for workload in snapshot.pending:
        pod_sets = workload.pod_sets
        if not pod_sets or workload.id in skip:
            continue
        if len(pod_sets) == 1:
            classes, per_pod = pod_sets[0].device_classes, pod_sets[0].devices_per_pod
        else:
            classes = next((p.device_classes for p in pod_sets if p.device_classes), ())
            per_pod = min(pod_set.devices_per_pod for pod_set in pod_sets)
        wants.add((tuple(classes or offered.get(workload.resource_class, ())), per_pod))
    demand: dict[str, int] = {}
    for classes, per_pod in wants:
        add_demand(demand, classes, per_pod)
    return demand


def reserved_owners(
    snapshot: Snapshot, matcher: ClassMatcher, names: tuple[str, ...], kinds: list | None = None
) -> dict[str, str]:
    """{device id: reserving team} for the devices free before the cycle that active reservations hold,
    exactly as the core's CapacityState._reserve materialises them: reservations by name, each takes
    `count` devices of its class in its domain, healthy, on a schedulable node and not taken by an
    earlier reservation, preferring its own team's running devices, then free devices, then devices
    other teams hold with preemptible work, each tier in the core's device order (node by natural name,
    then device). Without building the state: the team's own devices come from its running work, and the
    scan over free devices stops as soon as the reservation is full. `kinds`: the classes of each
    snapshot device, in order, when the caller has them already."""
    active = [r for r in snapshot.reservations if r.start <= snapshot.now < r.end and r.device_class in names]
    if not active:
        return {}
    if kinds is None:
        kinds = list(map(matcher.classes_of, snapshot.devices))
    known = {node.name: node for node in snapshot.nodes}
    levels = tuple(snapshot.levels) if NODE_LEVEL in snapshot.levels else (*snapshot.levels, NODE_LEVEL)
    by_node: dict[str, list] = {}
    for device, classes in zip(snapshot.devices, kinds, strict=True):
        by_node.setdefault(device.node, []).append((device, classes))
    node_order = sorted(set(known) | set(by_node), key=natural_key)
    position = {name: index for index, name in enumerate(node_order)}

    def order(device) -> tuple:
        return (position[device.node], _device_key(device.id))

    def usable(device) -> bool:  # not BLOCKED in the core
        node = known.get(device.node)
        return device.healthy and (node is None or node.schedulable)

    def in_domain(node_name: str, domain) -> bool:
        if not domain:
            return True
        node = known.get(node_name)
        domains = node.domains if node is not None else {}
        for level in levels:
            if level in domain:
                value = domains.get(level, node_name if level == NODE_LEVEL else "-")
                if str(value) != str(domain[level]):
                    return False
        return True

    team_of_queue = {queue.name: queue.team for queue in snapshot.queues}
    holder: dict[str, object] = {}  # device id -> its running workload (the last one, as the core does)
    for workload in snapshot.running:
        for pod in workload.pods:
            holder.update(dict.fromkeys(pod.device_ids, workload))
    held_by_team: dict[str, list] = {}
    for device_id, workload in holder.items():
        held_by_team.setdefault(team_of_queue.get(workload.queue), []).append(device_id)
    devices_by_id = {device.id: (device, classes) for device, classes in zip(snapshot.devices, kinds, strict=True)}
    sorted_nodes: dict[str, list] = {}  # each node's devices in device order, sorted when first visited

    def scan():
        for name in node_order:
            members = sorted_nodes.get(name)
            if members is None:
                members = sorted(by_node.get(name, ()), key=lambda entry: _device_key(entry[0].id))
                sorted_nodes[name] = members
            yield from members

    taken: set[str] = set()
    owners: dict[str, str] = {}
    for reservation in sorted(active, key=lambda r: r.name):
        team, wanted, domain = reservation.team, reservation.device_class, reservation.domain

        def candidate(device, classes, wanted=wanted, domain=domain) -> bool:
            return device.id not in taken and wanted in classes and usable(device) and in_domain(device.node, domain)

        own = []
        for device_id in held_by_team.get(team, ()):
            if device_id in devices_by_id:
                device, classes = devices_by_id[device_id]
                if candidate(device, classes):
                    own.append(device)
        own.sort(key=order)
        chosen = own[: reservation.count]
        missing = reservation.count - len(chosen)
        if missing > 0:
            preemptible = []
            for device, classes in scan():
                held = holder.get(device.id)
                if held is not None and (team_of_queue.get(held.queue) == team or not held.preemptible):
                    continue
                if not candidate(device, classes):
                    continue
                if held is None:
                    chosen.append(device)
                    owners[device.id] = team
                    missing -= 1
                    if not missing:
                        break
                else:
                    preemptible.append(device)
            else:
                chosen.extend(preemptible[:missing])
        taken.update(device.id for device in chosen)
    return owners


def _held_after(snapshot: Snapshot, result: CycleResult) -> tuple[set, dict[str, int]]:
    """(ids of the devices held once the result applies, {class: devices its holders claim}). Victims
    being evicted keep theirs until they go."""
    running_pods = chain.from_iterable(map(attrgetter("pods"), snapshot.running))
    held = set(chain.from_iterable(map(attrgetter("device_ids"), running_pods)))
    busy: dict[str, int] = {}
    for workload in snapshot.running:
        pods = workload.pods
        count = len(pods[0].device_ids) if len(pods) == 1 else sum(len(pod.device_ids) for pod in pods)
        busy[workload.device_class] = busy.get(workload.device_class, 0) + count
    for admission in result.admissions:
        for pod in admission.pods:
            held.update(pod.device_ids)
            busy[admission.device_class] = busy.get(admission.device_class, 0) + len(pod.device_ids)
    return held, busy


def _held_classes(snapshot: Snapshot, result: CycleResult, devices, is_free) -> dict[str, int]:
    """{class: held devices} the slow, exact way, for a snapshot whose holders name unknown devices or
    one device twice: each existing device once, under its last holder's class (admissions last)."""
    holder_class: dict[str, str] = {}
    for workload in snapshot.running:
        for pod in workload.pods:
            holder_class.update(dict.fromkeys(pod.device_ids, workload.device_class))
    for admission in result.admissions:
        for pod in admission.pods:
            holder_class.update(dict.fromkeys(pod.device_ids, admission.device_class))
    return Counter(holder_class[device.id] for device, free in zip(devices, is_free, strict=True) if not free)


def _held_outside(device) -> bool:
    return bool(device.taints) and held_outside(device.taints)


def _blocking(taints) -> bool:
    return bool(taints) and any(taint.effect in NO_SCHEDULE_EFFECTS for taint in taints)
