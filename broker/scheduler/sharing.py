"""Devices shared by capacity (DRA consumable capacity): a device that allows several allocations
(Device.allow_multiple_allocations, DRA allowMultipleAllocations) gives each allocation an amount of
its capacities (GPU memory for time-slicing, a NIC's bandwidth), and the amounts given never sum past
a capacity.

The resource class's `sharing` rule decides who shares:
- TimeSliced: a request with capacity amounts (PodSet.capacity, DRA ExactDeviceRequest.capacity) takes
  them from shared devices, a device idle or already shared by other such allocations; several pods,
  of one gang or of several, may share one device while its capacity lasts. Without amounts it takes
  devices whole, as the others do.
- Exclusive and Partitioned: devices are held alone: a shared device some allocation uses is not free
  for them, and one they take is shared by nobody. (A Partitioned class shares a GPU through its
  partitions, DRA counter sets, which are devices of their own: broker.scheduler.capacity.)

Running work holds its share as RunningPod.consumed (the amounts on each of its devices); a running pod
without amounts holds its devices alone. Placement packs: devices already shared first, then the one
with the least left that holds the pod's amounts, fullest nodes first, so idle devices stay whole for
exclusive work. A shared admission takes idle devices out of the free pool (held by it) and leaves
shared ones where they are; only the ledger here knows what is left on them.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.scheduler.capacity import PLAIN, ROOT
from broker.scheduler.placement import GangPlan, PlannedPod

SHARING_MODES = ("Exclusive", "TimeSliced", "Partitioned")


class Ledger:
    """Capacity left on every device that allows several allocations, for one cycle."""

    def __init__(self, snapshot, state):
        self.state = state
        self.capacity = {
            device.id: dict(device.capacity) for device in snapshot.devices if device.allow_multiple_allocations
        }
        self.left: dict[str, dict | None] = {device_id: dict(amounts) for device_id, amounts in self.capacity.items()}
        self.shared: set[str] = set()  # held by sharers only: free for more sharers
        for workload in snapshot.running:
            for pod in workload.pods:
                for device_id in pod.device_ids:
                    self._take(device_id, dict(pod.consumed) if pod.consumed else None)

    def _take(self, device_id: str, amounts: dict | None) -> None:
        left = self.left.get(device_id)
        if left is None:
            return
        if amounts is None:  # held alone
            self.left[device_id] = None
            self.shared.discard(device_id)
            return
        for name, amount in amounts.items():
            left[name] = left.get(name, 0) - amount
        self.shared.add(device_id)

    def fits(self, device_id: str, amounts: dict, taking: dict) -> bool:
        left = self.left.get(device_id)
        if left is None:
            return False
        spent = taking.get(device_id, {})
        return all(name in left and left[name] - spent.get(name, 0) >= amount for name, amount in amounts.items())

    def commit(self, slots, amounts: dict) -> list:
        """Record a shared admission's amounts; the slots it takes out of the free pool (the idle ones)."""
        idle = [slot for slot in {id(slot): slot for slot in slots}.values() if slot.id not in self.shared]
        for slot in slots:
            self._take(slot.id, amounts)
        return idle

    def free_amounts(self, device_id: str) -> dict | None:
        return self.left.get(device_id)

    def without(self, workloads) -> Ledger:
        """This ledger as it would be once `workloads` left (a preemption search's victims): what they
        hold of shared devices given back, a device one of them held alone whole again. A copy."""
        trial = Ledger.__new__(Ledger)
        trial.state, trial.capacity = self.state, self.capacity
        trial.left, trial.shared = dict(self.left), set(self.shared)
        for workload in workloads:
            for pod in workload.pods:
                for device_id in pod.device_ids:
                    if device_id not in trial.capacity:
                        continue
                    left = trial.left[device_id]
                    if not pod.consumed or left is None:
                        trial.left[device_id] = dict(trial.capacity[device_id])
                        continue
                    left = trial.left[device_id] = dict(left)
                    for name, amount in pod.consumed:
                        left[name] = left.get(name, 0) + amount
        return trial


def usable(slot, class_index: int, ledger: Ledger, access, leaving=frozenset()) -> bool:
    """Whether a time-sliced request may put an allocation on `slot`; `leaving`: ids of holders to take
    for gone (with a ledger `without` them)."""
    if class_index not in slot.classes or slot.id not in ledger.capacity:
        return False
    if slot.id in ledger.shared:
        return ledger.left[slot.id] is not None
    if slot.holder is not None and slot.holder not in leaving:
        return False
    return slot.category == PLAIN or access.rank(slot) is not None


def place_shared(
    state, ledger: Ledger, class_index: int, demands, amounts: dict, access, required, excluded, leaving=frozenset()
):
    """A plan for a time-sliced gang (every pod's devices on one node, the min_count pods of each pod set,
    all of them inside one domain of the `required` level index), or None. `leaving`: ids of workloads
    whose devices count as free (a preemption search's, with the ledger `without` them)."""
    slots_by_node: dict[int, list] = {}
    for slot in state.slots:
        if slot.node not in excluded and usable(slot, class_index, ledger, access, leaving):
            slots_by_node.setdefault(slot.node, []).append(slot)
    if required is None:
        scopes = [ROOT]
    else:
        scopes = sorted(state.domain_keys[required])
    for scope in scopes:
        nodes = [node for node in slots_by_node if scope == ROOT or state.domain_of(node, len(scope) - 1) == scope]
        pods = _pack(ledger, slots_by_node, nodes, demands, amounts)
        if pods is not None:
            return GangPlan(class_index, scope, tuple(pods))
    return None


def _pack(ledger: Ledger, slots_by_node: dict, nodes: list, demands, amounts: dict) -> list | None:
    taking: dict[str, dict] = {}

    def room(slot) -> float:
        left = ledger.left[slot.id]
        spent = taking.get(slot.id, {})
        return sum(left[name] - spent.get(name, 0) for name in amounts)

    def order(node):  # nodes with shared devices first, then the fullest (fewest usable devices)
        slots = slots_by_node[node]
        return (-sum(slot.id in ledger.shared or slot.id in taking for slot in slots), len(slots), node)

    pods = []
    for demand in sorted(demands, key=lambda demand: (-demand.per_pod, demand.name)):
        index = 0
        for wanted, required in ((demand.min_count, True), (demand.count - demand.min_count, False)):
            placed = 0
            for node in sorted(nodes, key=order):
                while placed < wanted:
                    fitting = [slot for slot in slots_by_node[node] if ledger.fits(slot.id, amounts, taking)]
                    if len(fitting) < demand.per_pod:
                        break
                    # Shared ones first, then the least room that holds it: idle devices stay whole.
                    fitting.sort(
                        key=lambda slot: (
                            slot.id not in ledger.shared and slot.id not in taking,
                            room(slot),
                            slot.order,
                        )
                    )
                    chosen = fitting[: demand.per_pod]
                    for slot in chosen:
                        spent = taking.setdefault(slot.id, {})
                        for name, amount in amounts.items():
                            spent[name] = spent.get(name, 0) + amount
                    pods.append(PlannedPod(demand.name, index, node, tuple(chosen)))
                    index += 1
                    placed += 1
                if placed >= wanted:
                    break
            if required and placed < wanted:
                return None
    return pods


class Room(NamedTuple):
    """What the shared devices of one class have left for a time-sliced request's amounts."""

    fitting: int  # devices with the request's amounts left
    best: str | None  # the device with the most left (by the first amount's capacity), when none fits
    left: dict  # what that device has left


def room_for(state, ledger: Ledger, class_index: int, amounts: dict, access) -> Room:
    fitting, best, best_left = 0, None, {}
    first = sorted(amounts)[0]
    for slot in state.slots:
        if not usable(slot, class_index, ledger, access):
            continue
        if ledger.fits(slot.id, amounts, {}):
            fitting += 1
            continue
        left = ledger.left[slot.id] or {}
        if best is None or left.get(first, 0) > best_left.get(first, 0):
            best, best_left = slot.id, left
    return Room(fitting, best, best_left)


def why_not(demands, classes, rooms, amounts: dict, needed: int, required: str | None) -> tuple[str, str]:
    """(reason code, message) of a time-sliced request that does not fit now, naming the request (its
    pod set, as DRA names a claim's request) and what the shared devices have left, e.g. "request main:
    no shared gpu has 30 memory left on any node (most left: 10 memory on n1/0)"."""
    demand = demands[0]
    request = demand.name
    wanted = " and ".join(f"{amount:g} {name}" for name, amount in sorted(amounts.items()))
    fitting = sum(room.fitting for room in rooms)
    kinds = " or ".join(classes)
    if fitting == 0:
        best = max(rooms, key=lambda room: (room.best is not None, sorted(room.left.items())))
        most = ""
        if best.best is not None:
            left = ", ".join(f"{amount:g} {name}" for name, amount in sorted(best.left.items()))
            most = f" (most left: {left} on {best.best})"
        return "InsufficientCapacity", f"request {request}: no shared {kinds} has {wanted} left on any node{most}"
    if fitting < needed:
        return (
            "InsufficientCapacity",
            f"request {request}: only {fitting} shared {kinds} have {wanted} left, {needed} needed",
        )
    where = f"one {required}" if required else "one node each pod"
    return (
        "TopologyFragmented",
        f"request {request}: {fitting} shared {kinds} have {wanted} left, but not as its pods need them on {where}",
    )
