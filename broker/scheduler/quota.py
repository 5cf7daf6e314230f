"""Nominal quota, cohorts and borrowing with Kueue's semantics (pkg/cache resource_node.go).

Every queue with a quota dict and every cohort is a node of a tree per device class:
- subtree quota of a node = its nominal + what each child puts into it (child subtree quota minus the
  part the child keeps for itself, its "guaranteed" quota = subtree quota - lending_limit);
- usage seen by a cohort = the children's usage above their guaranteed quota;
- available(queue) = its unused guaranteed quota + what its parent can give, capped by borrowing_limit;
- potential(queue) = the same with no usage anywhere: the most it can ever get.
Queues with `quota=None` are unlimited and take no part in the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress, count
from operator import is_not

from broker.scheduler.snapshot import Cohort, Queue


@dataclass(frozen=True)
class QuotaCheck:
    """The quota numbers for one request, as Kueue reports them."""

    queue: str
    device_class: str
    used: int
    nominal: int | None
    borrowable: int
    available: int | None
    maximum: int | None
    requested: int

    @property
    def fits(self) -> bool:
        return self.available is None or self.requested <= self.available

    @property
    def ever_fits(self) -> bool:
        return self.maximum is None or self.requested <= self.maximum

    @property
    def more_needed(self) -> int:
        return 0 if self.available is None else max(0, self.requested - self.available)

    def message(self) -> str:
        if self.nominal is None:
            return f"queue {self.queue} has unlimited {self.device_class} quota"
        head = (
            f"queue {self.queue} uses {amount(self.used)} of {amount(self.nominal)} {self.device_class} "
            f"(+{amount(self.borrowable)} borrowable); needs {amount(self.requested)}"
        )
        if not self.ever_fits:
            return f"{head}: more than the most it can ever get, {amount(self.maximum)}"
        if not self.fits:
            return f"{head}: {amount(self.more_needed)} more needed"
        return f"{head}: fits"

    def details(self) -> dict:
        return {
            "queue": self.queue,
            "device_class": self.device_class,
            "used": self.used,
            "nominal": self.nominal,
            "borrowable": self.borrowable,
            "available": self.available,
            "maximum": self.maximum,
            "requested": self.requested,
            "more_needed": self.more_needed,
        }


# Charges are sums of fractions (seven 1/7 partitions make 0.9999999999999998): compared with this slack.
EPSILON = 1e-9


def amount(value) -> str:
    """A quota amount as messages say it: devices, and partitions or shares of them to two decimals."""
    rounded = round(value, 2)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:g}"


# The constants of a class a node names nowhere in its subtree: no quota, nothing guaranteed, no limit.
_NO_CONSTANTS = (0, 0, None)


class _QuotaNode:
    __slots__ = (
        "name", "parent", "children", "nominal", "borrowing_limit", "lending_limit", "usage",
        "root", "path", "constants", "available",
    )  # fmt: skip

    def __init__(self, name, nominal, borrowing_limit, lending_limit):
        self.name = name
        self.parent: _QuotaNode | None = None
        self.children: list[_QuotaNode] = []
        self.nominal: dict = nominal
        self.borrowing_limit: dict | None = borrowing_limit
        self.lending_limit: dict | None = lending_limit
        self.usage: dict = {}
        # Set once the tree is built (QuotaTree._freeze): the tree never changes shape during a cycle.
        self.root: _QuotaNode = self
        self.path: tuple = (self,)  # root first, this node last
        self.constants: dict = {}  # class -> (guaranteed quota, subtree quota, borrowing limit or None)
        # On a root only: class -> {node of this tree: available}, dropped when usage in the tree changes.
        self.available: dict = {}


class QuotaTree:
    """Quota state for one cycle; usage changes as workloads are admitted."""

    def __init__(self, queues: tuple[Queue, ...], cohorts: tuple[Cohort, ...]):
        self._queues = {queue.name: queue for queue in queues}
        self._cohort_nodes = {
            cohort.name: _QuotaNode(
                "cohort:" + cohort.name,
                dict(cohort.quota or {}),
                cohort.borrowing_limit,
                cohort.lending_limit,
            )
            for cohort in cohorts
        }
        for cohort in cohorts:
            if cohort.parent:
                self._attach(self._cohort_nodes[cohort.name], self._cohort_node(cohort.parent))
        self._queue_nodes: dict[str, _QuotaNode] = {}
        for queue in sorted(queues, key=lambda queue: queue.name):
            if queue.quota is None:
                continue
            node = _QuotaNode(queue.name, dict(queue.quota), queue.borrowing_limit, queue.lending_limit)
            self._queue_nodes[queue.name] = node
            if queue.cohort:
                self._attach(node, self._cohort_node(queue.cohort))
        self._subtree_cache: dict = {}
        self._freeze()

    def _freeze(self) -> None:
        # Roots, paths and per-class constants are fixed for the cycle: worked out once here, not looked up
        # again on each quota question (there is about one per admission).
        nodes = [*self._cohort_nodes.values(), *self._queue_nodes.values()]
        classes = set()
        for node in nodes:
            classes.update(node.nominal)
            classes.update(node.borrowing_limit or ())
            classes.update(node.lending_limit or ())
        for node in nodes:
            path = [node]
            while path[-1].parent is not None:
                path.append(path[-1].parent)
            node.path = tuple(reversed(path))
            node.root = path[-1]
            node.constants = {
                device_class: (
                    self._guaranteed(node, device_class),
                    self._subtree_quota(node, device_class),
                    (node.borrowing_limit or {}).get(device_class),
                )
                for device_class in classes
            }

    def _cohort_node(self, name: str) -> _QuotaNode:
        # A cohort named only by its members exists implicitly with no quota of its own, as in Kueue.
        if name not in self._cohort_nodes:
            self._cohort_nodes[name] = _QuotaNode("cohort:" + name, {}, None, None)
        return self._cohort_nodes[name]

    @staticmethod
    def _attach(child: _QuotaNode, parent: _QuotaNode) -> None:
        ancestor = parent
        while ancestor is not None:
            if ancestor is child:
                return  # a cycle in cohort parents: keep the child a root rather than loop forever
            ancestor = ancestor.parent
        child.parent = parent
        parent.children.append(child)

    # --- usage ---

    def is_limited(self, queue: str) -> bool:
        return queue in self._queue_nodes

    def add_usage(self, queue: str, device_class: str, amount: int) -> None:
        node = self._queue_nodes.get(queue)
        if node is None:
            return
        # A cohort's usage (its children's usage above their guaranteed quota) is kept up to date here,
        # walking up only as far as a child's contribution changes, instead of being recomputed per query.
        old = node.usage.get(device_class, 0)
        new = old + amount
        node.usage[device_class] = new
        # What is available depends on usage in the node's own tree and class only: other trees and
        # classes keep their answers (fair share alternates between queues of different cohorts).
        node.root.available.pop(device_class, None)
        # Conditionals rather than max(0, ...) on the paths taken once or more per admission: the same values,
        # without a builtin call each.
        while node.parent is not None and old != new:
            guaranteed = node.constants.get(device_class, _NO_CONSTANTS)[0]
            above_new = new - guaranteed
            above_old = old - guaranteed
            contributed = (above_new if above_new > 0 else 0) - (above_old if above_old > 0 else 0)
            node = node.parent
            old = node.usage.get(device_class, 0)
            new = old + contributed
            node.usage[device_class] = new

    def usage(self, queue: str, device_class: str) -> int:
        node = self._queue_nodes.get(queue)
        return 0 if node is None else node.usage.get(device_class, 0)

    def nominal(self, queue: str, device_class: str) -> int | None:
        node = self._queue_nodes.get(queue)
        return None if node is None else node.nominal.get(device_class, 0)

    def usage_by_class(self, queue: str) -> dict:
        node = self._queue_nodes.get(queue)
        return {} if node is None else dict(node.usage)

    # --- Kueue's arithmetic, per device class ---

    def _subtree_quota(self, node: _QuotaNode, device_class: str) -> int:
        key = (id(node), device_class)
        cached = self._subtree_cache.get(key)
        if cached is None:
            cached = node.nominal.get(device_class, 0) + sum(
                self._subtree_quota(child, device_class) - self._guaranteed(child, device_class)
                for child in node.children
            )
            self._subtree_cache[key] = cached
        return cached

    def _guaranteed(self, node: _QuotaNode, device_class: str) -> int:
        limit = (node.lending_limit or {}).get(device_class)
        if limit is None:
            return 0
        return max(0, self._subtree_quota(node, device_class) - limit)

    def _available(self, node: _QuotaNode, device_class: str) -> int:
        # Kept until usage changes in the node's tree: explanations ask many times on an unchanging state.
        known = node.root.available.get(device_class)
        if known is None:
            known = node.root.available[device_class] = {}
        else:
            cached = known.get(node)
            if cached is not None:
                return cached
        # Top-down along the path: a node's answer needs its parent's, and every answer on the way is kept
        # (an ancestor of a known node is known too, as answers are only ever filled in along whole paths).
        available = 0
        for step in node.path:
            cached = known.get(step)
            if cached is not None:
                available = cached
                continue
            guaranteed, subtree, limit = step.constants.get(device_class, _NO_CONSTANTS)
            usage = step.usage.get(device_class, 0)
            if step.parent is None:
                available = subtree - usage
            else:
                unused = guaranteed - usage  # of its guaranteed quota; when negative, borrowed from the parent
                if limit is not None:
                    cap = subtree - guaranteed + (unused if unused < 0 else 0) + limit
                    if cap < available:
                        available = cap
                available += unused if unused > 0 else 0
            known[step] = available
        return available

    def _potential(self, node: _QuotaNode, device_class: str) -> int:
        key = ("potential", id(node), device_class)
        cached = self._subtree_cache.get(key)
        if cached is None:
            cached = self._compute_potential(node, device_class)
            self._subtree_cache[key] = cached
        return cached

    def _compute_potential(self, node: _QuotaNode, device_class: str) -> int:
        if node.parent is None:
            return self._subtree_quota(node, device_class)
        potential = self._guaranteed(node, device_class) + self._potential(node.parent, device_class)
        limit = (node.borrowing_limit or {}).get(device_class)
        if limit is not None:
            potential = min(potential, self._subtree_quota(node, device_class) + limit)
        return potential

    # --- questions the cycle asks ---

    def check(self, queue: str, device_class: str, requested: int, released: dict | None = None) -> QuotaCheck:
        """Quota numbers for `requested` devices; `released` (queue -> devices of this class) is usage
        that would be given back first, e.g. by preemption victims."""
        node = self._queue_nodes.get(queue)
        if node is None:
            return QuotaCheck(queue, device_class, 0, None, 0, None, None, requested)
        if released:
            for name, amount in released.items():
                self.add_usage(name, device_class, -amount)
        try:
            used = node.usage.get(device_class, 0)
            nominal = node.nominal.get(device_class, 0)
            available = max(0, self._available(node, device_class))
            maximum = self._potential(node, device_class)
        finally:
            if released:
                for name, amount in released.items():
                    self.add_usage(name, device_class, amount)
        borrowable = max(0, available - max(0, nominal - used))
        return QuotaCheck(queue, device_class, used, nominal, borrowable, available, maximum, requested)

    def available(self, queue: str, device_class: str) -> int | None:
        """What `check(...).available` says, without building the check: None for an unlimited queue."""
        node = self._queue_nodes.get(queue)
        if node is None:
            return None
        available = self._available(node, device_class)
        return available if available > 0 else 0

    def fits(self, queue: str, device_class: str, requested: int) -> bool:
        """`check(queue, device_class, requested).fits`, without building the check."""
        node = self._queue_nodes.get(queue)
        if node is None:
            return True
        available = self._available(node, device_class)
        return requested <= (available if available > 0 else 0)

    def is_borrowing(self, queue: str, device_class: str) -> bool:
        node = self._queue_nodes.get(queue)
        return node is not None and node.usage.get(device_class, 0) > node.nominal.get(device_class, 0)

    def cohort_root(self, queue: str) -> str | None:
        """Name of the root of the queue's cohort tree (queues under one root may borrow from each other)."""
        node = self._queue_nodes.get(queue)
        if node is None or node.parent is None:
            return None
        return node.root.name


class Consumption:
    """What holding each device counts for in quota, by what it consumes of the hardware (issue 26;
    finance bills the same shares, broker.costs):

    - a whole device: 1;
    - a partition (a device consuming a counter set, DRA consumesCounters): its share of the physical
      device, the largest fraction of any counter of the set it takes (a 1g.10gb slice of an 80 GB GPU
      whose set publishes 80Gi of memory and 7 compute units: max(10/80, 1/7) = 1/7);
    - a share of a device several allocations may share (time-sliced, DRA consumedCapacity): the
      largest fraction of any of the device's capacities it takes, times the device's own share.

    Made from the snapshot's devices once per inventory (`of_snapshot` keeps the last), so a cycle
    of whole devices pays one look at an empty dict per charge. `before`: the last one made, whose
    answers hold for the device records the new inventory kept (the loader keeps the records of
    devices that did not change, in place: a health change swaps one)."""

    def __init__(self, devices, counter_sets, before: Consumption | None = None):
        self._values = {(counter_set.node, counter_set.name): counter_set.counters for counter_set in counter_sets}
        self._devices, self._counter_sets = devices, counter_sets
        self.shares: dict[str, float] = {}  # device id -> its share of a physical device, when not 1
        self.capacities: dict[str, dict] = {}  # device id -> capacity, of devices several may share
        # id(running record) -> (record, its charges): the loader keeps the records of work that did not
        # change from one cycle to the next, and so does this, for the current ones (of_every_running).
        self._running: dict[int, tuple] = {}
        kept = ()
        if before is not None and (before._counter_sets is counter_sets or before._counter_sets == counter_sets):
            kept = before._devices
        if len(kept) != len(devices):
            for device in devices:
                self._count(device)
            # The least any device's allocation counts for (shares of shared devices aside: their
            # requests' charges are checked on their plans).
            self.smallest = min(self.shares.values(), default=1.0)
            return
        changed = list(compress(count(), map(is_not, devices, kept)))
        self.shares, self.capacities = dict(before.shares), dict(before.capacities)
        for position in changed:
            self.shares.pop(kept[position].id, None)
            self.capacities.pop(kept[position].id, None)
        for position in changed:
            self._count(devices[position])
        self.smallest = min(self.shares.values(), default=1.0)
        # Charges are made of the shares and capacities alone: where the changed devices' are as they
        # were, so are every running record's.
        if all(self._counts_as(before, kept[position], devices[position]) for position in changed):
            self._running = before._running

    def _counts_as(self, before: Consumption, old, device) -> bool:
        return (
            old.id == device.id
            and before.shares.get(old.id) == self.shares.get(device.id)
            and before.capacities.get(old.id) == self.capacities.get(device.id)
        )

    def _count(self, device) -> None:
        if device.consumes_counters:
            share = partition_share(device.node, device.consumes_counters, self._values)
            if share != 1:
                self.shares[device.id] = share
        if device.allow_multiple_allocations:
            self.capacities[device.id] = dict(device.capacity)

    _last: tuple | None = None

    @classmethod
    def of_snapshot(cls, snapshot) -> Consumption:
        last = cls._last
        if last is not None and last[0] is snapshot.devices and last[1] is snapshot.counter_sets:
            return last[2]
        made = cls(snapshot.devices, snapshot.counter_sets, before=last[2] if last is not None else None)
        cls._last = (snapshot.devices, snapshot.counter_sets, made)
        return made

    @property
    def whole(self) -> bool:
        """Every device counts 1 (no partitions, no shared devices): charges are device counts."""
        return not self.shares and not self.capacities

    def of(self, device_id: str, consumed=()) -> float:
        share = self.shares.get(device_id, 1)
        if consumed:
            capacity = self.capacities.get(device_id) or {}
            fractions = [amount / capacity[name] for name, amount in consumed if capacity.get(name)]
            if fractions:
                share *= min(1.0, max(fractions))
        return share

    def of_devices(self, device_ids, consumed=()) -> float:
        if self.whole:
            return len(device_ids)
        return sum(self.of(device_id, consumed) for device_id in device_ids)

    def of_every_running(self, running) -> list[tuple]:
        """[(workload, of_running(workload))] for every record of `running`, kept for the next cycle's
        same records (and for of_running meanwhile); those of records gone are dropped."""
        known, kept = self._running, {}
        for workload in running:
            entry = known.get(id(workload))
            if entry is None or entry[0] is not workload:
                entry = (workload, self._charges_of(workload))
            kept[id(workload)] = entry
        self._running = kept
        return list(kept.values())

    def of_running(self, workload) -> dict[str, float]:
        """{device class: what it counts for} of a running workload: its devices under the class each
        was allocated with (a several-request claim's under each request's class). Read, never change."""
        entry = self._running.get(id(workload))
        if entry is not None and entry[0] is workload:
            return entry[1]
        return self._charges_of(workload)

    def _charges_of(self, workload) -> dict[str, float]:
        classes = dict(workload.device_classes)
        if self.whole and not classes:
            return {workload.device_class: workload.device_count}
        charges: dict[str, float] = {}
        for pod in workload.pods:
            for device_id in pod.device_ids:
                device_class = classes.get(device_id, workload.device_class)
                charges[device_class] = charges.get(device_class, 0) + self.of(device_id, pod.consumed)
        return charges


def partition_share(node: str, consumes: dict, values: dict) -> float:
    """A device's share of its physical device: the largest fraction of a counter it consumes of its
    node's counter set (1 when it names none its node publishes)."""
    fractions = [
        amount / counters[counter]
        for set_name, taken in consumes.items()
        for counters in (values.get((node, set_name)) or {},)
        for counter, amount in taken.items()
        if counters.get(counter)
    ]
    return min(1.0, max(fractions)) if fractions else 1.0


def request_charges(pods, consumption: Consumption, default_class: str, consumed=()) -> dict[str, float]:
    """{device class: what it counts for} of an admission's planned pods: a several-request claim's
    pods (claims.ClaimPod) charge each request's devices to that request's class."""
    charges: dict[str, float] = {}
    for pod in pods:
        requests = getattr(pod, "requests", None)
        if requests:
            at = 0
            for _, device_class, count in requests:
                amount = consumption.of_devices([slot.id for slot in pod.slots[at : at + count]], consumed)
                charges[device_class] = charges.get(device_class, 0) + amount
                at += count
        else:
            amount = consumption.of_devices([slot.id for slot in pod.slots], consumed)
            charges[default_class] = charges.get(default_class, 0) + amount
    return charges
