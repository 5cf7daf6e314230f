"""Gang placement over the topology: all pods of a gang or none.

- required level: every pod inside one domain of that level; among domains that hold the gang, the
  tightest one (least matching capacity left after placing) so large domains stay whole; ties by name.
- preferred level: the tightest single domain of that level if one holds the gang, else one of the next
  coarser level, ..., else the whole scope (spread).
- inside the chosen domain nodes are filled fullest-first (fewest free devices first), which packs small
  pods onto already busy nodes; nodes with devices only this request may use (its team's reservation,
  tolerated taints) come first, nodes it could only borrow reserved devices on come last.
- several pod sets: the one with the largest pods is placed first (it is the hardest to fit); the
  min_count pods of every set are placed before any optional extra pod. This greedy order is exact for
  one pod set; for several, when it finds no placement in a domain, the exact search of
  `gang_search` decides (gangs up to its documented size), and its pods are kept.
Placement only plans: nothing in the capacity state changes until the cycle commits the plan.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.scheduler import gang_search
from broker.scheduler.capacity import ROOT, Slot, View


class PodDemand(NamedTuple):
    """One pod set as placement sees it: `min_count` pods must fit, up to `count` are placed.
    A tuple, because demands are hashed into every memo key of the cycle."""

    name: str
    count: int
    min_count: int
    per_pod: int
    match_attribute: str | None = None
    # A several-request claim (broker.scheduler.claims.Claim), None for one request of one class: then
    # per_pod is the fewest devices a pod can take (its firstAvailable ways may differ in count).
    claim: tuple | None = None


class PlannedPod(NamedTuple):
    """Tuples, not frozen dataclasses: a large cycle makes tens of thousands and they are never changed."""

    pod_set: str
    index: int
    node: int
    slots: tuple[Slot, ...]


class GangPlan(NamedTuple):
    class_index: int
    scope: tuple
    pods: tuple[PlannedPod, ...]

    def slots(self):
        for pod in self.pods:
            yield from pod.slots


def minimum_devices(demands: tuple[PodDemand, ...]) -> int:
    return sum(demand.min_count * demand.per_pod for demand in demands)


def place_gang(
    view: View, demands: tuple[PodDemand, ...], required: int | None, preferred: int | None
) -> GangPlan | None:
    """A plan for the whole gang on `view`, or None. Levels are indices into the topology levels."""
    needed = minimum_devices(demands)
    if view.total() < needed:
        return None
    for scope in candidate_scopes(view, required, needed):
        pods = _place_within(view, scope, demands, preferred, needed)
        if pods is not None:
            return GangPlan(view.class_index, scope, pods)
    return None


def candidate_scopes(view: View, required: int | None, needed: int) -> list[tuple]:
    """Domains of the required level with room for `needed` devices, tightest first."""
    if required is None:
        return [ROOT]
    return domains_with_room(view, required, needed, ROOT)


def domains_with_room(view: View, level_index: int, needed: int, within: tuple) -> list[tuple]:
    depth = len(within)
    # The common failure, mostly answered from the last maximum found: a view without extra devices
    # sees at most what the state has free (excluded nodes only take away).
    if not view.extra_count and not view.state.has_room_for(view.class_index, level_index, needed):
        return []
    counts = view.level_counts(level_index)
    if not view.plain and max(counts, default=0) < needed:
        return []
    # Domains with count >= needed, by (count, key): filtered and sorted by position (a level can have
    # thousands of domains, and a tuple key costs a hash each time it is looked up), in key order first,
    # then stably by count.
    state = view.state
    keys = state.domain_keys[level_index]
    fitting = [position for position, count in enumerate(counts) if count >= needed]
    if depth:
        fitting = [position for position in fitting if keys[position][:depth] == within]
    fitting.sort(key=state.domain_key_rank[level_index].__getitem__)
    fitting.sort(key=counts.__getitem__)
    return list(map(keys.__getitem__, fitting))


def place_within_scope(view: View, scope: tuple, demands, preferred: int | None) -> GangPlan | None:
    """A plan for the gang inside one given domain (ROOT = the whole cluster), or None."""
    needed = minimum_devices(demands)
    if view.domain_count(scope) < needed:
        return None
    pods = _place_within(view, scope, demands, preferred, needed)
    return None if pods is None else GangPlan(view.class_index, scope, pods)


def _place_within(view, scope, demands, preferred, needed):
    if preferred is not None and preferred >= len(scope):
        for level_index in range(preferred, len(scope) - 1, -1):
            for domain in domains_with_room(view, level_index, needed, scope):
                pods = pack(view, domain, demands)
                if pods is not None:
                    return pods
    return pack(view, scope, demands)


def pack(view: View, scope: tuple, demands: tuple[PodDemand, ...]) -> tuple[PlannedPod, ...] | None:
    """Place the gang inside one scope fullest-first; None when its min_count pods do not all fit."""
    if len(demands) == 1 and not demands[0].match_attribute and scope == ROOT and not view.extra_by_node:
        demand = demands[0]
        if pods_fitting_in_scope(view, ROOT, demand.per_pod) < demand.min_count:
            return None
    ordered = sorted(demands, key=lambda demand: (-demand.per_pod, demand.name))
    packer = _Packer(view, scope)
    for demand in ordered:
        if not packer.place(demand, demand.min_count):
            if len(demands) == 1:
                return None  # one pod set: fullest-first is exact
            packer = _searched(view, scope, demands)
            if packer is None:
                return None
            break
    for demand in ordered:
        if demand.count > demand.min_count:
            packer.place(demand, demand.count - demand.min_count, required=False)
    return tuple(packer.pods)


def _searched(view: View, scope: tuple, demands: tuple[PodDemand, ...]) -> _Packer | None:
    """A packer holding the min_count pods the exact search placed in `scope`, or None. Devices that
    consume shared counters (DRA partitions) keep the packer's answer: the search counts devices only."""
    if getattr(view.state, "counted", False):
        return None
    node_slots = search_nodes(view, scope, demands)
    order = {node: (view.node_rank(node), len(slots), node) for node, slots in node_slots.items()}
    found = gang_search.search(demands, node_slots, order)
    if found is None:
        return None
    packer = _Packer(view, scope)
    for node in sorted(found, key=order.__getitem__):
        for demand_index, slots in found[node]:
            packer._record(demands[demand_index], node, slots)
    return packer


def search_nodes(view: View, scope: tuple, demands: tuple[PodDemand, ...]) -> dict[int, list[Slot]]:
    """Nodes of `scope` with room for the gang's smallest pod, with their free usable slots. Without a
    matchAttribute nodes of one free count are alike to the search, so only as many of each count as the
    gang has pods are kept (no placement uses more), which bounds the work on a large scope."""
    smallest = min(demand.per_pod for demand in demands)
    pods = sum(demand.min_count for demand in demands)
    alike = not any(demand.match_attribute for demand in demands)
    state = view.state
    if scope == ROOT:
        candidates = set(state.buckets[view.class_index].nodes_with_at_least(smallest))
        candidates.update(view.extra_by_node)
        candidates = sorted(candidates)
    else:
        candidates = state.nodes_of(scope)
    kept: dict[int, int] = {}
    node_slots = {}
    for node in candidates:
        count = view.node_count(node)
        if count < smallest:
            continue
        if alike:
            if kept.get(count, 0) >= pods:
                continue
            kept[count] = kept.get(count, 0) + 1
        node_slots[node] = view.node_slots(node)
    return node_slots


class _Packer:
    def __init__(self, view: View, scope: tuple):
        self.view = view
        self.scope = scope
        self.taken: set[int] = set()
        self.used: dict[int, int] = {}
        self.next_index: dict[str, int] = {}
        self.pods: list[PlannedPod] = []
        # Shared counters this plan took so far (counter position -> amount), less what the view's
        # extras give back; None on a cluster where no device consumes counters.
        self.spent: dict | None = None
        if view.state.counted:
            self.spent = {counter: -amount for counter, amount in view.counter_credit.items()}

    def place(self, demand: PodDemand, pods_wanted: int, required: bool = True) -> bool:
        if pods_wanted <= 0:
            return True
        placed = 0
        for node in self._nodes_fullest_first(demand.per_pod):
            slots = [slot for slot in self.view.node_slots(node) if id(slot) not in self.taken]
            while placed < pods_wanted:
                if self.spent is None:
                    chosen = _choose_devices(slots, demand)
                else:
                    chosen = choose_counted(slots, demand, self.view.state, self.spent)
                if chosen is None:
                    break
                self._record(demand, node, chosen)
                chosen_ids = {id(slot) for slot in chosen}
                slots = [slot for slot in slots if id(slot) not in chosen_ids]
                placed += 1
            if placed >= pods_wanted:
                return True
        return not required

    def _record(self, demand, node, chosen):
        index = self.next_index.get(demand.name, 0)
        self.next_index[demand.name] = index + 1
        self.pods.append(PlannedPod(demand.name, index, node, tuple(chosen)))
        self.taken.update(id(slot) for slot in chosen)
        self.used[node] = self.used.get(node, 0) + len(chosen)
        if self.spent is not None:
            spend(self.spent, chosen)

    def _nodes_fullest_first(self, per_pod: int):
        view = self.view
        state = view.state
        if self.scope == ROOT and not view.extra_by_node and not self.used:
            # Node free counts are already bucketed and sorted: stream instead of sorting every node.
            excluded = view.excluded
            for node in state.buckets[view.class_index].nodes_with_at_least(per_pod):
                if node not in excluded:
                    yield node
            return
        if self.scope == ROOT:
            widest_extra = max((len(extra) for extra in view.extra_by_node.values()), default=0)
            candidates = set(state.buckets[view.class_index].nodes_with_at_least(max(1, per_pod - widest_extra)))
            candidates.update(view.extra_by_node)
        else:
            candidates = state.nodes_of(self.scope)
        counted = []
        for node in candidates:
            count = view.node_count(node) - self.used.get(node, 0)
            if count >= per_pod:
                counted.append((view.node_rank(node), count, node))
        counted.sort()
        for _, _, node in counted:
            yield node


def _choose_devices(slots: list[Slot], demand: PodDemand) -> list[Slot] | None:
    per_pod = demand.per_pod
    if len(slots) < per_pod:
        return None
    if not demand.match_attribute:
        return slots[:per_pod]
    groups: dict[str, list[Slot]] = {}
    for slot in slots:
        if demand.match_attribute in slot.attributes:
            groups.setdefault(str(slot.attributes[demand.match_attribute]), []).append(slot)
    # The smallest group that holds the pod, like fullest-first for nodes.
    fitting = sorted((len(group), value) for value, group in groups.items() if len(group) >= per_pod)
    if not fitting:
        return None
    return groups[fitting[0][1]][:per_pod]


def spend(spent: dict, slots) -> None:
    for slot in slots:
        if slot.consumes is not None:
            for counter, amount in slot.consumes:
                spent[counter] = spent.get(counter, 0) + amount


def choose_counted(slots: list[Slot], demand: PodDemand, state, spent: dict) -> list[Slot] | None:
    """`_choose_devices` where devices consume shared counters: each device taken only while its
    counters are left after what the plan (and this pod) took. Devices of counter sets already in use
    go first, so partitions pack onto a device that is cut already and whole devices stay whole."""
    per_pod = demand.per_pod
    if len(slots) < per_pod:
        return None
    if demand.match_attribute:
        groups: dict[str, list[Slot]] = {}
        for slot in slots:
            if demand.match_attribute in slot.attributes:
                groups.setdefault(str(slot.attributes[demand.match_attribute]), []).append(slot)
        candidates = [groups[value] for _, value in sorted((len(group), value) for value, group in groups.items())]
    else:
        candidates = [slots]
    left, capacity = state.counter_left, state.counter_capacity
    for group in candidates:
        if len(group) < per_pod:
            continue
        # Untouched sets last, told by each device's first counter (a cheap key: it is asked per slot).
        ordered = sorted(
            group,
            key=lambda slot: slot.consumes is not None
            and left[slot.consumes[0][0]] - spent.get(slot.consumes[0][0], 0) >= capacity[slot.consumes[0][0]],
        )
        taking = dict(spent)
        chosen = []
        for slot in ordered:
            if slot.consumes is not None:
                if not state.fits_counters(slot, taking):
                    continue
                for counter, amount in slot.consumes:
                    taking[counter] = taking.get(counter, 0) + amount
            chosen.append(slot)
            if len(chosen) == per_pod:
                return chosen
    return None


def pods_fitting_in_scope(view: View, scope: tuple, per_pod: int) -> int:
    """How many pods of `per_pod` devices fit in a scope (one pod set, no matchAttribute)."""
    state = view.state
    counts = state.node_free[view.class_index]
    if scope == ROOT and not view.extra_by_node:
        fitting = state.buckets[view.class_index].pods_that_fit(per_pod)
        return fitting - sum(counts[node] // per_pod for node in view.excluded)
    nodes = state.nodes_of(scope) if scope != ROOT else range(len(state.node_names))
    return sum(view.node_count(node) // per_pod for node in nodes)
