"""Free-device bookkeeping for one cycle, and the per-request views placement looks through.

Most devices are "plain": healthy, untainted, on a schedulable node, reserved for nobody. Their free
counts are aggregated per device class, per node and per topology domain, and nodes are bucketed by free
count, so the common request (a few devices anywhere) is answered without touching every node.
The rest (unhealthy, tainted, cordoned, reserved) are few; a view adds the ones a request may use.
Counterfactual questions ("would it fit if ... were healthy?") are views with more extras.
"""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Mapping
from copy import copy
from itertools import compress, groupby, islice, repeat
from operator import attrgetter, is_not
from types import MappingProxyType

from broker.scheduler.selectors import ClassMatcher
from broker.scheduler.snapshot import NO_SCHEDULE_EFFECTS, Snapshot, Toleration, held_outside

ROOT = ()  # the whole cluster, as a domain key
NODE_LEVEL = "node"  # the implicit finest topology level

PLAIN, RESERVED, TAINTED, BLOCKED = range(4)

# The holder of a free device that no longer fits its counter sets (DRA consumesCounters): another
# device consuming the same counters was allocated. It leaves the free aggregates as a held one does
# and comes back when the counters it needs are given back.
COUNTERS = "counters:"

# Ranks order nodes and the devices of one node: a request first uses what only it may use (its team's
# reservation, taints it tolerates), keeping plain devices for everyone, and borrows other teams'
# reserved devices last (those are the ones it will be preempted from).
RANK_OWN_RESERVED, RANK_TOLERATED, RANK_PLAIN, RANK_BORROWED = range(4)


_DIGIT_RUNS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """n2 < n10, so device and node order reads as people expect."""
    return tuple([int(part) if part.isdigit() else part for part in _DIGIT_RUNS.split(text)])


def _device_key(device_id: str) -> tuple:
    _, _, tail = device_id.rpartition("/")
    return (0, int(tail), device_id) if tail.isdigit() else (1, 0, natural_key(device_id))


def _id_order(device) -> tuple:
    return _device_key(device.id)


def _changed_positions(old: tuple, new: tuple) -> list[int]:
    """Positions where two equally long tuples hold different objects (identity, at C speed)."""
    return list(compress(range(len(new)), map(is_not, old, new)))


class Slot:
    """One device's state during a cycle."""

    __slots__ = ("order", "id", "node", "classes", "attributes", "category", "owner", "taints", "holder", "consumes")

    def __init__(self, order, device_id, node, classes, attributes, category, taints):
        self.order = order
        self.id = device_id
        self.node = node
        self.classes = classes
        self.attributes = attributes
        self.category = category
        self.owner: str | None = None
        self.taints = taints
        self.holder: str | None = None
        # ((counter position, amount), ...) for a device consuming shared counters, else None.
        self.consumes: tuple | None = None


class NodeBuckets:
    """Node indices grouped by free count, each group sorted, for fullest-first scans."""

    def __init__(self, counts: list[int]):
        self.members: dict[int, list[int]] = {}
        for node, count in enumerate(counts):
            if count > 0:
                self.members.setdefault(count, []).append(node)
        self.values = sorted(self.members)

    def move(self, node: int, old: int, new: int) -> None:
        if old > 0:
            group = self.members[old]
            del group[bisect_left(group, node)]
            if not group:
                del self.members[old]
                self.values.remove(old)
        if new > 0:
            group = self.members.get(new)
            if group is None:
                self.members[new] = [node]
                insort(self.values, new)
            else:
                insort(group, node)

    def nodes_with_at_least(self, minimum: int):
        for value in self.values[bisect_left(self.values, minimum) :]:
            yield from self.members[value]

    def pods_that_fit(self, per_pod: int) -> int:
        return sum(len(self.members[value]) * (value // per_pod) for value in self.values if value >= per_pod)


class InventoryIndex:
    """What the cycle derives from the inventory alone (topology, nodes, devices, device classes): node
    order and domains, devices in placement order with their classes and base category.

    It does not depend on work, quota or time, and the inventory changes far less often than cycles run,
    so the last index is kept and reused for a snapshot that carries the very same node and device tuples
    (the loader hands them out unchanged while the inventory stands) and equal levels and classes.
    Immutable once built; each cycle makes its own mutable device records from it."""

    # One reference, read and replaced whole (atomic under the GIL): threads deciding at once at worst
    # each build an index of their own.
    _last: InventoryIndex | None = None

    @classmethod
    def of(cls, snapshot: Snapshot, matcher: ClassMatcher, class_names: tuple[str, ...]) -> InventoryIndex:
        last = cls._last
        if last is not None:
            if last.serves(snapshot, class_names):
                return last
            index = last.patched(snapshot, matcher, class_names)
            if index is not None:
                cls._last = index
                return index
        index = cls(snapshot, matcher, class_names)
        cls._last = index
        return index

    def serves(self, snapshot: Snapshot, class_names: tuple[str, ...]) -> bool:
        return (
            self._nodes is snapshot.nodes
            and self._devices is snapshot.devices
            and self._levels == tuple(snapshot.levels)
            and self._device_classes == snapshot.device_classes
            and self.class_names == class_names
            and (self._counter_sets is snapshot.counter_sets or self._counter_sets == snapshot.counter_sets)
        )

    def __init__(self, snapshot: Snapshot, matcher: ClassMatcher, class_names: tuple[str, ...]):
        # Held, not copied: identity is the cache key, and holding them keeps that identity unique.
        self._nodes = snapshot.nodes
        self._devices = snapshot.devices
        self._levels = tuple(snapshot.levels)
        self._device_classes = snapshot.device_classes
        self._counter_sets = snapshot.counter_sets
        levels = tuple(snapshot.levels)
        self.levels = levels if NODE_LEVEL in levels else levels + (NODE_LEVEL,)
        self.class_names = class_names
        self.class_index = {name: index for index, name in enumerate(class_names)}
        self._index_nodes(snapshot)
        self._index_devices(snapshot, matcher)
        self._index_counters(snapshot)
        self.class_alias = self._class_aliases()
        self.class_devices = self._class_devices()
        self._as_built: CapacityState | None = None
        self.node_domain_maps: list[Mapping[str, str] | None] = [None] * len(self.node_names)  # see node_domain
        # The device records of the last cycle that finished on this index, to be rebased onto the next
        # snapshot instead of built anew. A list, because pop() and append() are atomic under the GIL:
        # a decide() running meanwhile (nested or in another thread) finds it empty and builds its own.
        self._spare: list[CapacityState] = []

    def patched(self, snapshot: Snapshot, matcher: ClassMatcher, class_names: tuple[str, ...]) -> InventoryIndex | None:
        """A new index for `snapshot`, equal to a new build, made from this one when the inventory differs
        only in what devices and nodes say of themselves (health, taints, attributes, cordons, labels):
        the same devices on the same nodes, in the same order, every unchanged record the very same
        object (as the loader hands them out after such a change). None when more changed. A device
        going unhealthy then costs a pass over the tuples and the changed devices, not indexing 100k
        devices again, and the last cycle's device records (the spare) move over, corrected."""
        old_devices, new_devices = self._devices, snapshot.devices
        if (
            len(new_devices) != len(old_devices)
            or len(snapshot.nodes) != len(self._nodes)
            or self._levels != tuple(snapshot.levels)
            or self._device_classes != snapshot.device_classes
            or self.class_names != class_names
            or not (self._counter_sets is snapshot.counter_sets or self._counter_sets == snapshot.counter_sets)
        ):
            return None
        cordons_changed = []
        for position in _changed_positions(self._nodes, snapshot.nodes):
            old, new = self._nodes[position], snapshot.nodes[position]
            if old.name != new.name or old.domains != new.domains:
                return None
            if old.schedulable != new.schedulable:
                cordons_changed.append(new)
        changed = []
        for position in _changed_positions(old_devices, new_devices):
            old, new = old_devices[position], new_devices[position]
            if old.id != new.id or old.node != new.node or old.consumes_counters != new.consumes_counters:
                return None
            changed.append(new)
        order_of = self._order_of()  # made before the copy, so that the copy shares it
        index = copy(self)  # shares every part no change reaches
        index._nodes, index._devices, index._spare = snapshot.nodes, new_devices, []
        index._counter_sets = snapshot.counter_sets
        if cordons_changed:
            index.node_schedulable = list(self.node_schedulable)
            for node in cordons_changed:
                index.node_schedulable[self.node_index[node.name]] = node.schedulable
            names = {node.name for node in cordons_changed}
            changed += [device for device in new_devices if device.node in names]  # their category may change
        rows = index.device_rows = list(self.device_rows)
        reclassed = False
        for device in changed:
            order = order_of[device.id]
            row = rows[order] = index._device_row(order, device, matcher)
            before = self.device_rows[order]
            reclassed = reclassed or row[3] is not before[3] or row[4] != before[4]
        if reclassed:
            if index.device_consumes:
                index.class_counted = frozenset(
                    index.class_names[class_index]
                    for order in index.device_consumes
                    for class_index in index.device_rows[order][3]
                )
            index.class_alias = index._class_aliases()
            index.class_devices = index._class_devices()
            index._as_built = None  # made of the devices' classes and attributes
        index._adopt_spare(self, [order_of[device.id] for device in changed])
        return index

    def node_domain(self, node: int) -> Mapping[str, str]:
        """The node's domain on every level but its own, read-only: made once per node and inventory, and
        shared by every admission placed on that node alone."""
        shared = self.node_domain_maps[node]
        if shared is None:
            levels = {}
            for level, keys in zip(self.levels, self.node_domains, strict=True):
                if level == NODE_LEVEL:
                    break
                levels[level] = keys[node][-1]
            shared = self.node_domain_maps[node] = MappingProxyType(levels)
        return shared

    def _order_of(self) -> dict[str, int]:
        """Device id -> its position in placement order; made once and shared by the patched indexes of
        one inventory (their devices and order are the same)."""
        if self._device_order is None:
            self._device_order = {device_id: order for order, device_id in enumerate(self.device_ids)}
        return self._device_order

    def _adopt_spare(self, previous: InventoryIndex, orders: list[int]) -> None:
        """`previous`'s spare device records, with the devices at `orders` made as this index says: a
        rebase then corrects holders and reservations as after any cycle."""
        state = previous.take_spare()
        if state is None:
            return
        rows = self.device_rows
        slots = state.slots
        for order in orders:
            slot, row = slots[order], rows[order]
            slot.classes, slot.attributes, slot.category, slot.taints = row[3], row[4], row[5], row[6]
        for name in CapacityState.SHARED:
            setattr(state, name, getattr(self, name))
        self.keep_spare(state)

    def take_spare(self) -> CapacityState | None:
        try:
            state = self._spare.pop()
        except IndexError:
            return None
        state.index = self
        return state

    def keep_spare(self, state: CapacityState) -> None:
        if not self._spare:
            # Kept without its reference back: no cycle, so a replaced index and its spare are freed by
            # reference counting even after gc.freeze() (see the runner).
            state.index = None
            self._spare.append(state)

    def as_built(self) -> CapacityState:
        """The cluster with every device healthy, free and unreserved; made on first use, then kept.
        Nothing may change it (its device records are its own, not any cycle's)."""
        if self._as_built is None:
            self._as_built = CapacityState.built_from(self)
        return self._as_built

    def _index_nodes(self, snapshot: Snapshot) -> None:
        known = {node.name: node for node in snapshot.nodes}
        names = set(known) | {device.node for device in snapshot.devices}
        self.node_names = sorted(names, key=natural_key)
        self.node_index = {name: index for index, name in enumerate(self.node_names)}
        self.node_schedulable = [known[name].schedulable if name in known else True for name in self.node_names]
        # Domains are keyed by their path from the coarsest level, so equal rack names under different
        # blocks stay different racks.
        self.node_domains: list[list[tuple]] = [[] for _ in self.levels]
        for name in self.node_names:
            domains = known[name].domains if name in known else {}
            path = ()
            for level, keys in zip(self.levels, self.node_domains, strict=True):
                path = path + (str(domains.get(level, name if level == NODE_LEVEL else "-")),)
                keys.append(path)
        self.domain_nodes: list[dict[tuple, list[int]]] = []
        for keys in self.node_domains:
            members: dict[tuple, list[int]] = {}
            for node, key in enumerate(keys):
                members.setdefault(key, []).append(node)
            self.domain_nodes.append(members)
        # Domains by position too, per level: free counts are kept in lists (no tuple key to hash on each
        # device taken) and read by key through these.
        self.domain_keys: list[list[tuple]] = [list(members) for members in self.domain_nodes]
        self.domain_position: list[dict[tuple, int]] = [
            {key: position for position, key in enumerate(keys)} for keys in self.domain_keys
        ]
        self.node_domain_positions: list[list[int]] = [
            list(map(position.__getitem__, keys))
            for position, keys in zip(self.domain_position, self.node_domains, strict=True)
        ]
        # Per level and position: the domain key's place in sorted order, to sort positions as their keys.
        self.domain_key_rank: list[list[int]] = []
        for keys in self.domain_keys:
            rank = [0] * len(keys)
            for place, position in enumerate(sorted(range(len(keys)), key=keys.__getitem__)):
                rank[position] = place
            self.domain_key_rank.append(rank)

    def _index_devices(self, snapshot: Snapshot, matcher: ClassMatcher) -> None:
        """`device_rows`: per device in placement order, the arguments of its Slot."""
        # One tuple per set of classes, shared by every device of it (and by patched indexes): slots
        # compare their classes by identity.
        class_sets: dict[frozenset, tuple[int, ...]] = {}
        self._class_sets = class_sets
        self._device_order: dict[str, int] | None = None
        node_index = self.node_index
        schedulable = self.node_schedulable
        classes_of = matcher.classes_of
        rows = []
        # Sorted by (node index, device key), node by node: a stable sort of each node's few devices gives
        # the same order as one sort of all of them on key pairs, for a third less.
        by_node: list[list] = [[] for _ in self.node_names]
        for device in snapshot.devices:
            by_node[node_index[device.node]].append(device)
        devices = []
        for group in by_node:
            if len(group) > 1:
                group.sort(key=_id_order)
            devices.extend(group)
        for order, device in enumerate(devices):
            names = classes_of(device)
            indices = class_sets.get(names)
            if indices is None:
                indices = tuple(sorted(self.class_index[name] for name in names if name in self.class_index))
                class_sets[names] = indices
            node = node_index[device.node]
            blocking = (
                tuple(taint for taint in device.taints if taint.effect in NO_SCHEDULE_EFFECTS) if device.taints else ()
            )
            if not device.healthy or not schedulable[node]:
                category = BLOCKED
            elif blocking:
                category = TAINTED
            else:
                category = PLAIN
            rows.append((order, device.id, node, indices, device.attributes, category, blocking))
        self.device_rows = rows
        self.device_ids = [row[1] for row in rows]

    def _index_counters(self, snapshot: Snapshot) -> None:
        """Shared counters by position: `counter_capacity[position]` is a counter's value,
        `counter_consumers[position]` (order, amount) of the devices consuming it, `device_consumes` each
        consuming device's ((position, amount), ...) by order. A device naming a counter set or counter
        its node does not publish consumes an impossible counter (value -1): it is never allocatable."""
        self.counter_capacity: list = []
        self.counter_consumers: list[list[tuple]] = []
        self.counter_most: list = []  # per counter, the most any device consumes of it
        self.device_consumes: dict[int, tuple] = {}
        self.class_counted: frozenset = frozenset()
        if not snapshot.counter_sets and not any(device.consumes_counters for device in snapshot.devices):
            return
        position: dict[tuple, int] = {}
        for counter_set in snapshot.counter_sets:
            for counter, value in counter_set.counters.items():
                position[(counter_set.node, counter_set.name, counter)] = len(self.counter_capacity)
                self.counter_capacity.append(value)
                self.counter_consumers.append([])
        node_names = self.node_names
        counted_classes: set[int] = set()
        consuming = {device.id: device.consumes_counters for device in snapshot.devices if device.consumes_counters}
        for order, row in enumerate(self.device_rows):
            consumes = consuming.get(row[1])
            if not consumes:
                continue
            pairs = []
            for set_name, counters in consumes.items():
                for counter, amount in counters.items():
                    key = (node_names[row[2]], set_name, counter)
                    where = position.get(key)
                    if where is None:
                        where = position[key] = len(self.counter_capacity)
                        self.counter_capacity.append(-1)
                        self.counter_consumers.append([])
                    self.counter_consumers[where].append((order, amount))
                    pairs.append((where, amount))
            self.device_consumes[order] = tuple(pairs)
            counted_classes.update(row[3])

        self.class_counted = frozenset(self.class_names[index] for index in counted_classes)
        self.counter_most = [max((amount for _, amount in pairs), default=0) for pairs in self.counter_consumers]

    def _device_row(self, order: int, device, matcher: ClassMatcher) -> tuple:
        """One device's row as `_index_devices` makes it (that loop is inlined for 100k devices)."""
        names = matcher.classes_of(device)
        indices = self._class_sets.get(names)
        if indices is None:
            indices = tuple(sorted(self.class_index[name] for name in names if name in self.class_index))
            self._class_sets = {**self._class_sets, names: indices}  # shared with older indexes: not changed
        node = self.node_index[device.node]
        blocking = (
            tuple(taint for taint in device.taints if taint.effect in NO_SCHEDULE_EFFECTS) if device.taints else ()
        )
        if not device.healthy or not self.node_schedulable[node]:
            category = BLOCKED
        elif blocking:
            category = TAINTED
        else:
            category = PLAIN
        return (order, device.id, node, indices, device.attributes, category, blocking)

    def _class_devices(self) -> list[int]:
        """How many devices each class selects, whatever their state."""
        counts = [0] * len(self.class_names)
        for classes, count in Counter(row[3] for row in self.device_rows).items():
            for class_index in classes:
                counts[class_index] += count
        return counts

    def _class_aliases(self) -> list[int]:
        """For each class, the first class made of exactly the same devices (itself when there is none).
        Such classes always have equal free counts, so they share one set of aggregates (one update)."""
        distinct = {row[3] for row in self.device_rows}
        first_with: dict[frozenset, int] = {}
        return [
            first_with.setdefault(frozenset(classes for classes in distinct if class_index in classes), class_index)
            for class_index in range(len(self.class_names))
        ]


class CapacityState:
    """Devices, topology and free counts of one snapshot; mutated as the cycle admits work.

    `CapacityState.as_built(state)` is the same cluster with every device healthy, free and unreserved.
    """

    SHARED = ("levels", "class_names", "class_index", "node_names", "node_index", "node_schedulable", "node_domains",
              "domain_nodes", "domain_keys", "domain_position", "node_domain_positions", "domain_key_rank",
              "class_alias", "class_devices", "counter_capacity", "counter_consumers", "counter_most",
              "class_counted")  # fmt: skip

    @classmethod
    def as_built(cls, other: CapacityState) -> CapacityState:
        """The same cluster with every device healthy, free and unreserved ("can it ever run here?").
        Read-only: it depends on the inventory alone, so its index keeps one for every cycle."""
        return other.index.as_built()

    @classmethod
    def built_from(cls, index: InventoryIndex) -> CapacityState:
        """The as-built state of `index`'s cluster (see InventoryIndex.as_built)."""
        state = cls.__new__(cls)
        state._adopt(index)
        for slot in state.slots:
            # What the devices say of their health and taints is not part of it, so an index patched
            # for such a change (InventoryIndex.patched) keeps the same as-built state.
            slot.category, slot.taints = PLAIN, ()
        state._aggregate(as_built=True)
        return state

    def __init__(self, snapshot: Snapshot, matcher: ClassMatcher, class_names: tuple[str, ...]):
        self.index = InventoryIndex.of(snapshot, matcher, class_names)
        self._adopt(self.index)
        self._hold_running(snapshot)
        self._reserve(snapshot)
        self._aggregate()

    @classmethod
    def for_cycle(cls, snapshot: Snapshot, matcher: ClassMatcher, class_names: tuple[str, ...]) -> CapacityState:
        """The state of `snapshot`, equal to `CapacityState(snapshot, ...)`: the last finished cycle's
        device records rebased when its index serves this snapshot too (a cycle changes few holders, and
        100k device records cost more to make than to correct), else built. Every change to a holder is
        journaled until `retire`, so the next rebase can undo them."""
        state = InventoryIndex.of(snapshot, matcher, class_names).take_spare()
        if state is None or not state._rebase(snapshot):
            state = cls(snapshot, matcher, class_names)
        state._journal = []
        return state

    def retire(self) -> None:
        """The cycle is over and nothing reads this state any more: its index may hand it to the next one."""
        if self._journal is not None and self._running is not None:
            self.index.keep_spare(self)

    def _rebase(self, snapshot: Snapshot) -> bool:
        """Make this retired state equal to a new one built for `snapshot` (same index): undo the last
        cycle's holds and releases and its reservations, swap the holders of running work that changed
        (records the loader reuses are the same objects), reserve and aggregate again. False, with the
        state left unusable, when two running workloads claim one device (a built state lets the later
        claim win; a rebased one cannot know the order it would have seen)."""
        for slot, holder in reversed(self._journal):
            slot.holder = holder
        self._journal = None
        for slot in self._blocked:  # counted again below, once the running work is in place
            if slot.holder == COUNTERS:
                slot.holder = None
        rows = self.index.device_rows
        for slot in self._reserved:
            slot.owner = None
            slot.category = rows[slot.order][5]
        before = self._running
        self._running = None
        now = {}
        arrived = []  # new records, or new records of known ids
        for workload in snapshot.running:  # one pass, each record read once (the reads are cache misses)
            now[workload.id] = workload
            if before.get(workload.id) is not workload:
                arrived.append(workload)
        if len(now) != len(snapshot.running):
            return False
        slot_by_id = self.slot_by_id
        if arrived or len(before) != len(now):
            left = [before[workload_id] for workload_id in before.keys() - now.keys()]
            left += [before[workload.id] for workload in arrived if workload.id in before]
            for workload in left:
                workload_id = workload.id
                for pod in workload.pods:
                    for device_id in pod.device_ids:
                        slot = slot_by_id.get(device_id)
                        if slot is not None and slot.holder == workload_id:
                            slot.holder = None
        for workload in arrived:
            workload_id = workload.id
            for pod in workload.pods:
                for device_id in pod.device_ids:
                    slot = slot_by_id.get(device_id)
                    if slot is not None:
                        if slot.holder is not None:
                            return False
                        slot.holder = workload_id
        self._running = now
        self._count_counters()
        self._reserve(snapshot)
        self._aggregate()
        return True

    # --- building ---

    def _adopt(self, index: InventoryIndex) -> None:
        """The index's shared, unchanging parts, and device records of this state's own. (The as-built
        state the index keeps gets no reference back to it: no reference cycle to outlive them.)"""
        for name in self.SHARED:
            setattr(self, name, getattr(index, name))
        self.slots: list[Slot] = [Slot(*row) for row in index.device_rows]
        self.slot_by_id: dict[str, Slot] = dict(zip(index.device_ids, self.slots, strict=True))
        self.counted: list[Slot] = []  # the slots consuming shared counters, in order
        self._blocked: list[Slot] = []  # those _count_counters held by COUNTERS
        if index.device_consumes:
            slots = self.slots
            for order, consumes in index.device_consumes.items():
                slots[order].consumes = consumes
                self.counted.append(slots[order])
        # What is left of each shared counter (see InventoryIndex._index_counters) once held devices took theirs.
        self.counter_left: list = list(index.counter_capacity)
        self._journal: list[tuple[Slot, str | None]] | None = None  # see for_cycle
        self._running: dict | None = None  # the running work held, by id; None: not rebasable
        self._reserved: list[Slot] = []
        self._reserved_by: dict[str, list[Slot]] = {}
        self._node_starts: list[int] | None = None  # see node_devices
        # Bumped by every hold, release and end of a reservation: what was read of free devices at one
        # count still holds while it stays (Cycle.extras_for).
        self.changes = 0

    def node_devices(self, node: int) -> list[Slot]:
        """Every device of `node` whatever its state (a claim taking all of a kind must know the busy
        and broken ones too); the slots lie node by node, so a node's are one run of them."""
        starts = self._node_starts
        if starts is None:
            nodes = [slot.node for slot in self.slots]
            starts = self._node_starts = [bisect_left(nodes, index) for index in range(len(self.node_names) + 1)]
        return self.slots[starts[node] : starts[node + 1]]

    def _hold_running(self, snapshot: Snapshot) -> None:
        slot_by_id = self.slot_by_id
        claimed_twice = False
        for workload in snapshot.running:
            holder = workload.id
            for pod in workload.pods:
                for device_id in pod.device_ids:
                    slot = slot_by_id.get(device_id)
                    if slot is not None:
                        claimed_twice = claimed_twice or slot.holder is not None
                        slot.holder = holder
        if not claimed_twice:
            running = {workload.id: workload for workload in snapshot.running}
            self._running = running if len(running) == len(snapshot.running) else None
        self._count_counters()

    def _count_counters(self) -> None:
        """What held devices leave of the shared counters, and every free device that no longer fits
        them held by COUNTERS (before the aggregates are made: they never count as free)."""
        if not self.counted:
            return
        capacity = self.counter_capacity
        left = self.counter_left = list(capacity)
        for slot in self.counted:
            if slot.holder is not None and slot.holder != COUNTERS:
                for counter, amount in slot.consumes:
                    left[counter] -= amount
        # Only the consumers of a counter something took, and those that never fit, can be out: most
        # partitionable devices are idle, and a pass over all of them cost 0.3 s at 200k.
        # A device fits while, on each counter it consumes, its amount is left: asked per counter.
        slots, consumers = self.slots, self.counter_consumers
        blocked = self._blocked = []
        for counter, most in enumerate(self.counter_most):
            remaining = left[counter]
            if remaining < most:
                for order, amount in consumers[counter]:
                    if amount > remaining:
                        slot = slots[order]
                        if slot.holder is None:
                            slot.holder = COUNTERS
                            blocked.append(slot)

    def fits_counters(self, slot: Slot, spent: dict | None = None) -> bool:
        """Whether `slot`'s counters are left for it (less `spent`: counter position -> amount a plan
        took already)."""
        left = self.counter_left
        if spent:
            return all(left[counter] - spent.get(counter, 0) >= amount for counter, amount in slot.consumes)
        return all(left[counter] >= amount for counter, amount in slot.consumes)

    def _reserve(self, snapshot: Snapshot) -> None:
        self._reserved = []
        self._reserved_by: dict[str, list[Slot]] = {}  # the devices of each open reservation, by name
        active = [r for r in snapshot.reservations if r.start <= snapshot.now < r.end]
        if not active:
            return  # the maps below would cost a pass over all running work for nothing
        team_of_queue = {queue.name: queue.team for queue in snapshot.queues}
        team_of_holder = {workload.id: team_of_queue.get(workload.queue) for workload in snapshot.running}
        preemptible = {workload.id for workload in snapshot.running if workload.preemptible}
        for reservation in sorted(active, key=lambda r: r.name):
            class_index = self.class_index.get(reservation.device_class)
            if class_index is None:
                continue
            in_domain = [
                slot
                for slot in self.slots
                if slot.owner is None
                and class_index in slot.classes
                and slot.category != BLOCKED
                and self._in_domain(slot.node, reservation.domain)
            ]

            # The owner's own running work counts first, then free devices, then devices other teams
            # hold with preemptible work (the owner may reclaim those).
            tiers = [
                (_reservation_tier(slot, reservation.team, team_of_holder, preemptible), slot) for slot in in_domain
            ]
            tiers.sort(key=lambda entry: (entry[0], entry[1].order))
            taken = self._reserved_by.setdefault(reservation.name, [])
            for _, slot in [entry for entry in tiers if entry[0] < 3][: reservation.count]:
                slot.owner = reservation.team
                if slot.category == PLAIN:
                    slot.category = RESERVED
                self._reserved.append(slot)
                taken.append(slot)

    def reserved_by(self, name: str) -> list[Slot]:
        """The devices the open reservation `name` holds (none when it is not open or took none)."""
        return self._reserved_by.get(name, [])

    def unreserve(self, slots: list[Slot]) -> None:
        """The reservation that held `slots` has ended (used only by the estimated-start simulation, after
        all decisions): they are nobody's any more, plain again unless unhealthy or tainted, and free ones
        count as free. A rebase restores them, as it restores every reservation."""
        self.changes += 1
        made_plain = set()
        freed: dict[int, list[Slot]] = {}
        for slot in slots:
            if slot.owner is None:
                continue
            slot.owner = None
            if slot.category == RESERVED:
                slot.category = PLAIN
                made_plain.add(id(slot))
                if slot.holder is None:
                    freed.setdefault(slot.node, []).append(slot)
        if made_plain:
            self.extras = [slot for slot in self.extras if id(slot) not in made_plain]
        for node, plain in freed.items():
            self.free_plain[node] = sorted(self.free_plain[node] + plain, key=lambda slot: slot.order)
            self._shift_slots(plain, node, 1)

    def _in_domain(self, node: int, domain: dict | None) -> bool:
        if not domain:
            return True
        for level_index, level in enumerate(self.levels):
            if level in domain and self.node_domains[level_index][node][-1] != str(domain[level]):
                return False
        return True

    def _distinct(self, classes: tuple[int, ...]) -> tuple[int, ...]:
        """The classes of `classes` whose aggregates are their own (one per group of aliases)."""
        distinct = self._distinct_cache.get(classes)
        if distinct is None:
            distinct = tuple(dict.fromkeys(self.class_alias[class_index] for class_index in classes))
            self._distinct_cache[classes] = distinct
        return distinct

    def _aggregate(self, as_built: bool = False) -> None:
        node_count = len(self.node_names)
        class_count = len(self.class_names)
        alias = self.class_alias
        self._distinct_cache: dict[tuple, tuple] = {}
        self.free_plain: list[list[Slot]] = [[] for _ in range(node_count)]
        self.extras: list[Slot] = []  # every non-plain device, free or held
        free_plain = self.free_plain
        if as_built:
            for node, group in groupby(self.slots, key=attrgetter("node")):
                free_plain[node].extend(group)
        else:
            extras = self.extras
            for slot in self.slots:
                if slot.category != PLAIN:
                    extras.append(slot)  # held ones too: views skip those with a holder
                elif slot.holder is None:
                    free_plain[slot.node].append(slot)
        own = [class_index for class_index in range(class_count) if alias[class_index] == class_index]
        node_free: list = [
            [0] * node_count if alias[class_index] == class_index else None for class_index in range(class_count)
        ]
        for node, free in enumerate(free_plain):
            if not free:
                continue
            classes = free[0].classes
            if all(slot.classes is classes for slot in free):  # a node of one kind of device
                for class_index in self._distinct(classes):
                    node_free[class_index][node] = len(free)
                continue
            for slot in free:
                for class_index in self._distinct(slot.classes):
                    node_free[class_index][node] += 1
        buckets: list = [
            NodeBuckets(node_free[class_index]) if class_index in own else None for class_index in range(class_count)
        ]
        for class_index in range(class_count):
            node_free[class_index] = node_free[alias[class_index]]
            buckets[class_index] = buckets[alias[class_index]]
        self.node_free: list[list[int]] = node_free
        self.buckets: list[NodeBuckets] = buckets
        # Free counts per domain are summed from node_free when first asked for, per class and level: most
        # admissions never ask (one pod goes by the buckets). From then on node changes are logged per
        # class, and a level's totals take in the entries logged since it last answered.
        level_count = len(self.levels)
        self._domain_totals: list = [[None] * level_count if alias[c] == c else None for c in range(class_count)]
        self._domain_read: list = [[(0, 0)] * level_count if alias[c] == c else None for c in range(class_count)]
        self._domain_log: list = [None] * class_count  # per class: (nodes of devices taken, of devices freed)
        self._domain_most: list = [[None] * level_count if alias[c] == c else None for c in range(class_count)]
        self._domain_dicts: list = [[None] * level_count if alias[c] == c else None for c in range(class_count)]
        self.total_free = [sum(counts) for counts in node_free]
        self.has_tainted = any(slot.taints for slot in self.extras)

    # --- changes during the cycle ---

    def hold(self, slots, holder: str) -> None:
        """Give `slots` to `holder`; plain ones leave the aggregates."""
        self.changes += 1
        journal = self._journal
        if journal is not None:
            journal.extend([(slot, slot.holder) for slot in slots])
        if len(slots) == 1:
            # Most holds are one plain device taken from the front of its node's free list: nothing to
            # group by node or by class.
            slot = slots[0]
            slot.holder = holder
            if slot.category == PLAIN:
                node = slot.node
                free = self.free_plain[node]
                if free and free[0] is slot:
                    self.free_plain[node] = free[1:]
                else:
                    self.free_plain[node] = [other for other in free if other is not slot]
                self._shift(slot.classes, node, -1)
            if slot.consumes is not None and holder != COUNTERS:
                self._consume(slots)
            return
        changed: dict[int, list[Slot]] = {}
        for slot in slots:
            slot.holder = holder
            if slot.category == PLAIN:
                taken = changed.get(slot.node)
                if taken is None:
                    changed[slot.node] = [slot]
                else:
                    taken.append(slot)
        free_plain = self.free_plain
        for node, taken in changed.items():
            free = free_plain[node]
            count = len(taken)
            if free[:count] == taken:  # the usual case: the node's first free devices, in order
                free_plain[node] = free[count:]
            else:
                taken_ids = {id(slot) for slot in taken}
                free_plain[node] = [slot for slot in free if id(slot) not in taken_ids]
            self._shift_slots(taken, node, -1)
        if self.counted and holder != COUNTERS:
            self._consume(slots)

    def _consume(self, slots) -> None:
        """Take the counters of the counted `slots` just held, and hold (by COUNTERS) every free device
        that no longer fits what is left."""
        left = self.counter_left
        touched = set()
        for slot in slots:
            if slot.consumes is not None:
                for counter, amount in slot.consumes:
                    left[counter] -= amount
                    touched.add(counter)
        if not touched:
            return
        all_slots, consumers = self.slots, self.counter_consumers
        blocked = {}
        for counter in touched:
            remaining = left[counter]
            for order, amount in consumers[counter]:
                if amount > remaining:
                    other = all_slots[order]
                    if other.holder is None:
                        blocked[order] = other
        if blocked:
            self.hold([blocked[order] for order in sorted(blocked)], COUNTERS)

    def _give_back(self, slots) -> list:
        """Return the counters of the counted `slots` about to be released; the devices held by COUNTERS
        that fit again, to be released with them."""
        left = self.counter_left
        touched = set()
        for slot in slots:
            if slot.consumes is not None and slot.holder is not None and slot.holder != COUNTERS:
                for counter, amount in slot.consumes:
                    left[counter] += amount
                    touched.add(counter)
        freed = {}
        all_slots = self.slots
        for counter in touched:
            for order, _ in self.counter_consumers[counter]:
                other = all_slots[order]
                if other.holder == COUNTERS and self.fits_counters(other):
                    freed[order] = other
        return [freed[order] for order in sorted(freed)]

    def release(self, slots) -> None:
        """Free `slots` again (used only by the estimated-start simulation, after all decisions)."""
        self.changes += 1
        if self.counted:
            slots = list(slots)
            slots += self._give_back(slots)
        changed: dict[int, list[Slot]] = {}
        journal = self._journal
        for slot in slots:
            if slot.holder is None:
                continue
            if journal is not None:
                journal.append((slot, slot.holder))
            slot.holder = None
            if slot.category == PLAIN:
                changed.setdefault(slot.node, []).append(slot)
        for node, freed in changed.items():
            self.free_plain[node] = sorted(self.free_plain[node] + freed, key=lambda slot: slot.order)
            self._shift_slots(freed, node, 1)

    def _shift_slots(self, slots: list[Slot], node: int, sign: int) -> None:
        """Count `slots` of `node` out of (sign -1) or into (sign 1) the free aggregates of their classes."""
        classes = slots[0].classes
        for slot in slots:
            if slot.classes is not classes:
                break
        else:
            self._shift(classes, node, sign * len(slots))
            return
        per_class: dict[int, int] = {}
        for slot in slots:
            for class_index in slot.classes:
                per_class[class_index] = per_class.get(class_index, 0) + 1
        by_count: dict[int, list[int]] = {}  # aliases have equal counts, so they land in one group
        for class_index in sorted(per_class):
            by_count.setdefault(per_class[class_index], []).append(class_index)
        for count, group in by_count.items():
            self._shift(tuple(group), node, sign * count)

    def _shift(self, classes: tuple[int, ...], node: int, delta: int) -> None:
        total_free = self.total_free
        for class_index in classes:
            total_free[class_index] += delta
        distinct = self._distinct_cache.get(classes) or self._distinct(classes)
        for class_index in distinct:
            counts = self.node_free[class_index]
            old = counts[node]
            new = counts[node] = old + delta
            log = self._domain_log[class_index]
            if log is not None:
                if delta == -1:
                    log[0].append(node)
                elif delta < 0:
                    log[0].extend(repeat(node, -delta))
                else:
                    log[1].extend(repeat(node, delta))
            self.buckets[class_index].move(node, old, new)

    def domain_free_counts(self, class_index: int, level_index: int) -> list[int]:
        """Free devices of the class per domain of the level, up to date, in the order of
        `domain_keys[level_index]`; the state's own list: read it, never change it."""
        own = self.class_alias[class_index]
        counts = self._domain_totals[own][level_index]
        log = self._domain_log[own]
        if counts is None:
            counts = [0] * len(self.domain_keys[level_index])
            for position, count in zip(self.node_domain_positions[level_index], self.node_free[own], strict=True):
                if count:
                    counts[position] += count
            self._domain_totals[own][level_index] = counts
            if log is None:
                log = self._domain_log[own] = ([], [])
        else:
            taken, freed = log
            read_taken, read_freed = self._domain_read[own][level_index]
            if read_taken == len(taken) and read_freed == len(freed):
                return counts
            # The log holds a node once per device taken (or freed); positions, not keys: no tuple to hash.
            positions = self.node_domain_positions[level_index]
            for node in islice(taken, read_taken, None):
                counts[positions[node]] -= 1
            for node in islice(freed, read_freed, None):
                counts[positions[node]] += 1
        self._domain_read[own][level_index] = (len(log[0]), len(log[1]))
        return counts

    def domain_totals(self, class_index: int, level_index: int) -> dict[tuple, int]:
        """`domain_free_counts` by domain key, made again only after a change; the state's own dict: read
        it, never change it."""
        counts = self.domain_free_counts(class_index, level_index)
        own = self.class_alias[class_index]
        taken, freed = self._domain_log[own]
        stamp = (len(taken), len(freed))
        known = self._domain_dicts[own][level_index]
        if known is not None and known[0] == stamp:
            return known[1]
        totals = dict(zip(self.domain_keys[level_index], counts, strict=True))
        self._domain_dicts[own][level_index] = (stamp, totals)
        return totals

    def domain_total(self, class_index: int, scope: tuple) -> int:
        """Free devices of the class in one domain (not ROOT)."""
        level_index = len(scope) - 1
        return self.domain_free_counts(class_index, level_index)[self.domain_position[level_index][scope]]

    def most_free_in_a_domain(self, class_index: int, level_index: int) -> int:
        """The largest of `domain_free_counts(class_index, level_index)`. Between frees it can only fall, so
        the last maximum found stands as a bound: a request larger than it fails without a pass over the
        level (on a long queue most placements tried on a required level fail)."""
        bound = self._most_bound(class_index, level_index)
        return bound if bound is not None else self._most_now(class_index, level_index)

    def has_room_for(self, class_index: int, level_index: int, needed: int) -> bool:
        """Whether some domain of the level has `needed` free devices of the class."""
        bound = self._most_bound(class_index, level_index)
        if bound is not None and bound < needed:
            return False
        return self._most_now(class_index, level_index) >= needed  # the maximum, made exact once

    def _most_bound(self, class_index: int, level_index: int) -> int | None:
        """The last maximum found, while nothing was freed since (None when something was, or none yet)."""
        own = self.class_alias[class_index]
        known = self._domain_most[own][level_index]
        log = self._domain_log[own]
        return known[0] if known is not None and log is not None and known[1] == len(log[1]) else None

    def _most_now(self, class_index: int, level_index: int) -> int:
        most = max(self.domain_free_counts(class_index, level_index), default=0)
        own = self.class_alias[class_index]
        self._domain_most[own][level_index] = (most, len(self._domain_log[own][1]))
        return most

    @property
    def domain_free(self) -> list[list[dict[tuple, int]]]:
        """Every class's `domain_totals` on every level (for comparing whole states)."""
        return [
            [self.domain_totals(class_index, level_index) for level_index in range(len(self.levels))]
            for class_index in range(len(self.class_names))
        ]

    # --- questions ---

    def level_index(self, level: str | None) -> int | None:
        if level is None:
            return None
        return self.levels.index(level) if level in self.levels else None

    def domain_of(self, node: int, level_index: int) -> tuple:
        return self.node_domains[level_index][node]

    def nodes_of(self, scope: tuple) -> list[int]:
        if scope == ROOT:
            return list(range(len(self.node_names)))
        return self.domain_nodes[len(scope) - 1][scope]


def _reservation_tier(slot: Slot, team: str, team_of_holder: dict, preemptible: set) -> int:
    if slot.holder is None:
        return 1
    if team_of_holder.get(slot.holder) == team:
        return 0
    return 2 if slot.holder in preemptible else 3


class Access:
    """Who is asking: decides which non-plain devices a request may use and in what preference."""

    __slots__ = ("team", "preemptible", "tolerations", "healed", "unreserved", "key")

    def __init__(self, team, preemptible=False, tolerations=(), healed=False, unreserved=False):
        self.team = team
        self.preemptible = bool(preemptible)
        self.tolerations = tuple(tolerations)
        self.healed = healed
        self.unreserved = unreserved
        self.key = (team, self.preemptible, self.tolerations, healed, unreserved)

    def rank(self, slot: Slot) -> int | None:
        """Preference rank of a non-plain free device, or None when this request may not use it."""
        if slot.taints and held_outside(slot.taints):
            return None  # another scheduler's: no request, nor a counterfactual healing, may use it
        if slot.category == BLOCKED and not self.healed:
            return None
        tolerated_rank = RANK_PLAIN
        if slot.taints and not self.healed:
            if not all(_tolerates(self.tolerations, taint) for taint in slot.taints):
                return None
            tolerated_rank = RANK_TOLERATED
        if slot.owner is None or self.unreserved:
            return tolerated_rank
        if slot.owner == self.team:
            return RANK_OWN_RESERVED
        return RANK_BORROWED if self.preemptible else None

    def uses_extras(self, state: CapacityState, reserved_teams: frozenset) -> bool:
        """Whether any non-plain device could matter; if not, the fast aggregated path answers alone."""
        if not state.extras:
            return False
        if self.healed:
            return True
        if reserved_teams and (self.unreserved or self.preemptible or self.team in reserved_teams):
            return True
        return bool(self.tolerations) and state.has_tainted


def _tolerates(tolerations: tuple[Toleration, ...], taint) -> bool:
    return any(
        toleration.key == taint.key
        and (toleration.value is None or toleration.value == taint.value)
        and (toleration.effect is None or toleration.effect == taint.effect)
        for toleration in tolerations
    )


class View:
    """Free devices of one class as one request sees them.

    extra: additional free slots (with rank) beyond the plain ones: reserved/tainted devices the request
    may use, devices of would-be preemption victims, or counterfactually healed devices.
    excluded: nodes the request may not use (capacity held for the head of the line).
    """

    def __init__(self, state: CapacityState, class_index: int, extra=(), excluded=frozenset()):
        self.state = state
        self.class_index = class_index
        self.excluded = excluded
        self.extra_by_node: dict[int, list[tuple[int, Slot]]] = {}
        self.extra_count = 0
        self.plain = not excluded
        self._domain_cache: dict[int, list[int]] = {}  # a non-plain view's own counts per level, by position
        self._domain_dicts: dict[int, dict[tuple, int]] = {}  # the same by key, made when asked
        # Counters that the held devices among the extras (a victim's, one about to end) would give back:
        # counter position -> amount, for placement's counter checks.
        self.counter_credit: dict[int, float] = {}
        self.extend(extra)

    def extend(self, extra) -> None:
        """Add extra slots, e.g. those the next expected end releases; cached domain counts follow them
        rather than being recounted from scratch."""
        class_index, excluded, by_node = self.class_index, self.excluded, self.extra_by_node
        added = []
        for rank, slot in extra:
            if slot.consumes is not None and slot.holder is not None and slot.holder != COUNTERS:
                # Given back whatever its class: a victim's partition frees the whole device too.
                credit = self.counter_credit
                for counter, amount in slot.consumes:
                    credit[counter] = credit.get(counter, 0) + amount
            if class_index in slot.classes and slot.node not in excluded:
                by_node.setdefault(slot.node, []).append((rank, slot))
                added.append(slot.node)
        if not added:
            return
        self.plain = False
        self.extra_count += len(added)
        self._domain_dicts.clear()
        for level_index, counts in self._domain_cache.items():
            positions = self.state.node_domain_positions[level_index]
            for node in added:
                counts[positions[node]] += 1

    def node_count(self, node: int) -> int:
        if node in self.excluded:
            return 0
        extra = self.extra_by_node.get(node)
        return self.state.node_free[self.class_index][node] + (len(extra) if extra else 0)

    def node_counts(self, nodes: list[int]) -> list[int]:
        """`node_count` of each of `nodes`, in order: read off the state's per-node list in one pass, then
        the view's few extras and exclusions put right (the node level of a large cluster asks for
        every node, and a call per node cost more than the rest of an explanation's numbers)."""
        free = self.state.node_free[self.class_index]
        counts = list(map(free.__getitem__, nodes))
        if self.extra_by_node or self.excluded:
            position = {node: at for at, node in enumerate(nodes)}
            for node, extra in self.extra_by_node.items():
                at = position.get(node)
                if at is not None:
                    counts[at] += len(extra)
            for node in self.excluded:
                at = position.get(node)
                if at is not None:
                    counts[at] = 0
        return counts

    def total(self) -> int:
        total = self.state.total_free[self.class_index] + self.extra_count
        for node in self.excluded:
            total -= self.state.node_free[self.class_index][node]
        return total

    def level_counts(self, level_index: int) -> list[int]:
        """Free devices per domain of the level as this view sees them, in the order of the state's
        `domain_keys[level_index]`: read them, never change them."""
        if self.plain:  # the state's own, as they are now
            return self.state.domain_free_counts(self.class_index, level_index)
        counts = self._domain_cache.get(level_index)
        if counts is None:
            state = self.state
            counts = list(state.domain_free_counts(self.class_index, level_index))
            positions = state.node_domain_positions[level_index]
            node_free = state.node_free[self.class_index]
            for node in self.excluded:
                counts[positions[node]] -= node_free[node]
            for node, slots in self.extra_by_node.items():
                counts[positions[node]] += len(slots)
            self._domain_cache[level_index] = counts
        return counts

    def domain_counts(self, level_index: int) -> dict[tuple, int]:
        """`level_counts` by domain key: read them, never change them."""
        if self.plain:
            return self.state.domain_totals(self.class_index, level_index)
        counts = self._domain_dicts.get(level_index)
        if counts is None:
            keys = self.state.domain_keys[level_index]
            counts = self._domain_dicts[level_index] = dict(zip(keys, self.level_counts(level_index), strict=True))
        return counts

    def domain_count(self, scope: tuple) -> int:
        if scope == ROOT:
            return self.total()
        if self.plain:
            return self.state.domain_total(self.class_index, scope)
        level_index = len(scope) - 1
        return self.level_counts(level_index)[self.state.domain_position[level_index][scope]]

    def node_rank(self, node: int) -> int:
        """The best rank among the node's devices: nodes with own-reserved devices come first, nodes
        with only borrowed ones last."""
        extra = self.extra_by_node.get(node)
        if not extra:
            return RANK_PLAIN
        best = min(rank for rank, _ in extra)
        if best == RANK_BORROWED and self.state.node_free[self.class_index][node]:
            return RANK_PLAIN
        return best

    def node_slots(self, node: int) -> list[Slot]:
        """Free usable slots on `node`, in the order they should be taken."""
        if node in self.excluded:
            return []
        class_index = self.class_index
        ranked = [(RANK_PLAIN, slot.order, slot) for slot in self.state.free_plain[node] if class_index in slot.classes]
        extra = self.extra_by_node.get(node)
        if extra:
            ranked.extend((rank, slot.order, slot) for rank, slot in extra)
            ranked.sort(key=lambda entry: (entry[0], entry[1]))
        return [entry[2] for entry in ranked]
