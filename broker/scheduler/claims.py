"""Gangs whose pods claim devices with several requests (DRA resource.k8s.io/v1 DeviceClaim).

Each pod of such a pod set gets, on its one node, for every named request the devices of one of its ways
(`exactly` one, or the first that fits of `firstAvailable`, e.g. 1 x H100 or else 2 x A100), each of the
way's device class and selectors, no device twice, and every `matchAttribute` constraint holding across
the requests it names (8 GPUs and a NIC under one PCIe root). The single-request case never comes here:
placement's packer and the cycle's simple plan keep it.

- A pod's *choice* is a way per request and a value per constraint; its devices are then a bipartite
  matching of (request, unit) to the node's free devices the choice allows. Several pods on one node are
  matched jointly, so the choices are exact whatever devices the requests share (two requests of one
  class, selectors that overlap).
- Pods of one pod set are alike: their choices are tried as non-decreasing sequences (multisets), the
  preferred ways first, so a node takes the pods it can in the first order DRA would try them.
- Across nodes the search goes fullest first (in the whole cluster: the nodes that hold some pod set's
  first request, streamed from the free-count buckets of its class, fewest free first; in a domain:
  fewest free devices of the claim's classes first), choosing how many pods of each pod set a node
  takes, the most first; a failure is remembered by (node, pods still to place), and nodes that look
  alike to the claim (the same devices allowed per way, the same grouping by each constrained
  attribute) are one class kept to as many nodes as the gang has pods. A node is looked at only when
  the search reaches it, and only if its free counts can meet every request of some pod set.
- Devices consuming shared counters (DRA partitions) are checked after a node's matching: a matching that
  would exceed a counter is refused like any that does not fit.
Complete within STEP_BUDGET steps (gangs of tests/scheduler/test_claim_properties.py are compared with a
brute-force search); a search that spends it finds nothing, and the workload waits.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import merge
from itertools import product
from typing import NamedTuple

from broker.scheduler.capacity import ROOT
from broker.scheduler.placement import GangPlan
from broker.scheduler.selectors import SelectorCache
from broker.scheduler.snapshot import (
    ALL_DEVICES,
    ALLOCATION_MODES,
    DeviceConstraint,
    DeviceRequest,
    DeviceSubRequest,
)

STEP_BUDGET = 20_000


class Claim(NamedTuple):
    """One pod's claim (PodDemand.claim): hashable, as demands are memo keys."""

    requests: tuple[DeviceRequest, ...]
    constraints: tuple[DeviceConstraint, ...] = ()
    # The most devices an allocationMode All request may take (its resource class's max_devices): a node
    # with more of the kind cannot serve it, so All never takes more than the class allows.
    most: int | None = None

    def classes(self) -> tuple[str, ...]:
        """Every device class the claim can use, in the order it names them."""
        names: list[str] = []
        for request in self.requests:
            for way in request.alternatives:
                if way.device_class not in names:
                    names.append(way.device_class)
        return tuple(names)

    def fewest_devices(self) -> int:
        # A request of no way counts none: only a claim written past the API has one, and resolving it
        # (claim_problem) says it is invalid; what sizes a claim before that must not fail on it.
        return sum(min((way.count for way in request.alternatives), default=0) for request in self.requests)

    def asks_all(self) -> bool:
        """Whether a request may take every matching device (allocationMode All in any of its ways)."""
        return any(way.allocation_mode == ALL_DEVICES for request in self.requests for way in request.alternatives)

    def most_devices(self, all_bound: int) -> int:
        """The most devices the claim can take, an allocationMode All way counted as `all_bound` (the most
        one can match): what an approval threshold must judge, since an All way's count says nothing."""
        return sum(
            max(all_bound if way.allocation_mode == ALL_DEVICES else way.count for way in request.alternatives)
            for request in self.requests
        )


class ClaimPod(NamedTuple):
    """A PlannedPod (same first fields) whose slots serve several requests: `requests` holds
    (request label, device class, device count) in the order of `slots`."""

    pod_set: str
    index: int
    node: int
    slots: tuple
    requests: tuple


class OutOfSteps(Exception):
    """The search spent its budget."""


def claim_problem(claim: Claim, known_classes) -> str | None:
    """What can never be valid in a claim (unknown names, impossible counts), or None."""
    names = [request.name for request in claim.requests]
    if not names:
        return "claims no device request"
    if len(set(names)) != len(names):
        return "request names must be unique"
    for request in claim.requests:
        ways = request.alternatives
        if not ways or (request.exactly is not None and request.first_available):
            return f"request {request.name}: give one device class or a firstAvailable list"
        way_names = [way.name for way in ways]
        if len(set(way_names)) != len(way_names):
            return f"request {request.name}: firstAvailable names must be unique"
        for way in ways:
            if way.allocation_mode not in ALLOCATION_MODES:
                return f"request {request.name}: unknown allocationMode '{way.allocation_mode}'"
            if way.count < 1 or (way.takes_all and way.count != 1):
                return f"request {request.name}: count must be at least 1 (count {way.count})"
            if way.device_class not in known_classes:
                return f"request {request.name}: unknown device class '{way.device_class}'"
    for constraint in claim.constraints:
        if bool(constraint.match_attribute) == bool(constraint.distinct_attribute):
            return "a constraint needs one matchAttribute or one distinctAttribute"
        for name in constraint.requests:
            if name.split("/", 1)[0] not in names:
                return f"constraint on {constraint.attribute} names unknown request '{name}'"
    return None


class _Way(NamedTuple):
    label: str  # "<request>" or "<request>/<sub-request>" as DRA's allocation result names it
    class_index: int
    class_name: str
    count: int  # for allocationMode All, 1: the least it takes (a node says how many, _NodeInfo.all_counts)
    selectors: tuple
    takes_all: bool = False


class _Shape:
    """One pod set's claim against this cycle's class indices."""

    def __init__(self, position: int, demand, class_index: dict):
        self.position = position
        self.demand = demand
        claim: Claim = demand.claim
        self.ways: list[list[_Way]] = []
        for request in claim.requests:
            several = request.exactly is None
            self.ways.append(
                [
                    _Way(
                        f"{request.name}/{way.name}" if several else request.name,
                        class_index[way.device_class],
                        way.device_class,
                        way.count,
                        tuple(way.selectors),
                        way.takes_all,
                    )
                    for way in request.alternatives
                ]
            )
        self.takes_all = any(way.takes_all for ways in self.ways for way in ways)
        self.most = claim.most
        names = [request.name for request in claim.requests]

        def covered(constraint) -> tuple:
            named = {label.split("/", 1)[0] for label in constraint.requests}
            return tuple(position for position, name in enumerate(names) if not named or name in named)

        # (attribute, positions of the requests it covers): matchAttribute constraints, then
        # distinctAttribute ones (each covered device a value of its own, _distinct_owner).
        self.constraints = [(c.match_attribute, covered(c)) for c in claim.constraints if c.match_attribute]
        self.distinct = [(c.distinct_attribute, covered(c)) for c in claim.constraints if c.distinct_attribute]


class _NodeInfo:
    """A node's free devices as the claims see them: masks of the devices each way allows.

    `everything`: every device the node's pods reach whatever its state, given when a way takes all
    (allocationMode All): such a way's mask is every matching device when all of them are among the
    free usable `slots`, else nothing (a busy, broken or someone else's device of the kind makes it
    fail), and `all_counts` holds how many that is, by (shape, request, way)."""

    __slots__ = ("node", "slots", "way_masks", "value_masks", "distinct_values", "all_counts", "signature", "fits",
                 "counted", "choices")  # fmt: skip

    def __init__(self, node: int, slots: list, shapes: list[_Shape], selectors: SelectorCache, everything=None):
        self.node = node
        self.slots = slots
        self.fits: dict[tuple, list | None] = {}
        self.choices: dict[int, list] = {}
        self.counted = any(slot.consumes is not None for slot in slots)
        self.way_masks: list[list[list[int]]] = []
        self.value_masks: list[list[list[tuple[str, int]]]] = []
        self.distinct_values: list[list[tuple[int, list]]] = []
        self.all_counts: dict[tuple, int] = {}
        signature: list = []
        for shape_index, shape in enumerate(shapes):
            per_request = []
            for request, ways in enumerate(shape.ways):
                masks = []
                for position, way in enumerate(ways):
                    mask = 0
                    for bit, slot in enumerate(slots):
                        if way.class_index in slot.classes and (
                            not way.selectors or selectors.matches(way.selectors, slot.attributes)
                        ):
                            mask |= 1 << bit
                    if way.takes_all:
                        every = sum(
                            1
                            for slot in everything or ()
                            if way.class_index in slot.classes
                            and (not way.selectors or selectors.matches(way.selectors, slot.attributes))
                        )
                        if every == 0 or mask.bit_count() != every or (shape.most is not None and every > shape.most):
                            mask = 0
                        self.all_counts[(shape_index, request, position)] = max(every, 1)
                    masks.append(mask)
                per_request.append(masks)
            self.way_masks.append(per_request)
            per_constraint = [sorted(_by_value(slots, attribute).items()) for attribute, _ in shape.constraints]
            self.value_masks.append(per_constraint)
            # Per distinctAttribute constraint: (mask of the devices carrying it, value index by device bit).
            per_distinct = []
            for attribute, _ in shape.distinct:
                by_value = _by_value(slots, attribute)
                values: list = [None] * len(slots)
                carrying = 0
                for index, mask in enumerate(by_value.values()):
                    carrying |= mask
                    while mask:
                        low = mask & -mask
                        values[low.bit_length() - 1] = index
                        mask ^= low
                per_distinct.append((carrying, values))
            self.distinct_values.append(per_distinct)
            signature.append(
                (
                    tuple(map(tuple, per_request)),
                    tuple(tuple(m for _, m in v) for v in per_constraint),
                    tuple(tuple(values) for _, values in per_distinct),
                )
            )
        # Nodes alike to every pod set are interchangeable (a partition's counters make it its own).
        self.signature = None if self.counted else tuple(signature)

    def count(self, shape_index: int, request: int, way_index: int, way: _Way) -> int:
        """Devices the way takes on this node."""
        return self.all_counts[(shape_index, request, way_index)] if way.takes_all else way.count


def _by_value(slots: list, attribute: str) -> dict[str, int]:
    """Mask of the devices of each value of `attribute` (devices without it in none)."""
    by_value: dict[str, int] = {}
    for bit, slot in enumerate(slots):
        if attribute in slot.attributes:
            value = str(slot.attributes[attribute])
            by_value[value] = by_value.get(value, 0) | (1 << bit)
    return by_value


class Planner:
    """Places gangs with several-request claims on one cycle's free state."""

    def __init__(self, state, views: dict, demands: tuple, selectors: SelectorCache):
        self.state = state
        self.views = views  # class name -> View (this request's access and excluded nodes)
        self.demands = demands
        self.selectors = selectors
        class_index = state.class_index
        # The largest pods first: they are the hardest to fit (as placement's packer).
        ordered = sorted(range(len(demands)), key=lambda i: (-demands[i].per_pod, demands[i].name))
        self.shapes = [_Shape(i, demands[i], class_index) for i in ordered]
        self.takes_all = any(shape.takes_all for shape in self.shapes)
        self.steps = 0
        self._infos: dict[int, _NodeInfo] = {}
        # Shared counters taken already by devices outside this search (a gang's own, when a group
        # claim is matched after it): counter position -> amount.
        self.base_spent: dict = {}

    # --- entry points ---

    def place(
        self, required: int | None, preferred: int | None, primary_class: int, within: tuple = ROOT
    ) -> GangPlan | None:
        """A plan for the gang, or None; `within`: the domain (or node) its pods must stay in (where a
        group claim's devices are reachable, broker.scheduler.group_claims)."""
        wanted = tuple(shape.demand.min_count for shape in self.shapes)
        if not self._enough_in_total(wanted):
            return None
        try:
            for scope in self._scopes(required, within):
                for inner in self._preferred_within(scope, preferred):
                    found = self._place_in(inner, wanted)
                    if found is not None:
                        return GangPlan(primary_class, scope, self._optional(found, inner))
        except OutOfSteps:
            return None
        return None

    def fits_one_pod(self, shape_index: int, requests: int) -> bool:
        """Whether one pod of a pod set, its claim cut to its first `requests` requests (constraints
        cut to those), fits on some node: what `why_not` asks to name the request that cannot be met."""
        shape = self.shapes[shape_index]
        cut = _Shape(shape.position, shape.demand, self.state.class_index)
        cut.ways = shape.ways[:requests]
        cut.constraints = [(a, tuple(p for p in covered if p < requests)) for a, covered in shape.constraints]
        cut.distinct = [(a, tuple(p for p in covered if p < requests)) for a, covered in shape.distinct]
        planner = Planner(self.state, self.views, self.demands, self.selectors)
        planner.shapes = [cut]
        for node in self._nodes(ROOT):
            everything = self.state.node_devices(node) if self.takes_all else None
            info = _NodeInfo(node, self._node_slots(node), [cut], self.selectors, everything)
            if planner._fit(info, (1,)) is not None:
                return True
        return False

    # --- scopes and nodes ---

    def _enough_in_total(self, wanted: tuple) -> bool:
        """A cheap bound: requests with one way need that many devices of its class free at all."""
        need: dict[str, int] = {}
        for shape, pods in zip(self.shapes, wanted, strict=True):
            for ways in shape.ways:
                if len(ways) == 1:
                    need[ways[0].class_name] = need.get(ways[0].class_name, 0) + ways[0].count * pods
        return all(self.views[name].total() >= count for name, count in need.items())

    def _scopes(self, required: int | None, within: tuple = ROOT) -> list[tuple]:
        if required is None or len(within) > required:
            return [within]  # `within` lies inside one domain of the required level
        state = self.state
        rank, position = state.domain_key_rank[required], state.domain_position[required]
        depth = len(within)
        keys = [key for key in state.domain_keys[required] if key[:depth] == within]
        free = {key: self._free_in(key) for key in keys}
        return sorted((key for key in free if free[key]), key=lambda key: (free[key], rank[position[key]]))

    def _preferred_within(self, scope: tuple, preferred: int | None) -> list[tuple]:
        if preferred is None or preferred < len(scope):
            return [scope]
        state = self.state
        inner = [key for key in state.domain_keys[preferred] if key[: len(scope)] == scope]
        return sorted(inner, key=self._free_in) + [scope]

    def _free_in(self, scope: tuple) -> int:
        return sum(self.views[name].domain_count(scope) for name in self.views)

    def _nodes(self, scope: tuple):
        """Nodes of `scope` with a free device of the claim's classes, fullest first. In the whole
        cluster only nodes that hold some pod set's first request (the count of one of its ways) are
        candidates: a busy cluster has few, and the bucketed free counts name them; without extra
        devices they are streamed in the buckets' order (fewest free of that class first), less the
        nodes the views exclude, so a claim that fits early never looks at the rest."""
        state = self.state
        views = list(self.views.values())
        if scope == ROOT:
            firsts = [(self.views[way.class_name], way.count) for shape in self.shapes for way in shape.ways[0]]
            if all(not view.extra_by_node for view in views):
                stream = _unique(merge(*(_by_free(state.buckets[view.class_index], count) for view, count in firsts)))
                # Nodes held for the head of the line are left out as the views leave them out; ranking
                # every candidate instead cost a cycle with a protected gang ~1.5 s on 325k devices.
                held = [view.excluded for view in views]
                if not any(held):
                    return stream
                return (node for node in stream if not all(node in excluded for excluded in held))
            candidates: set[int] = set()
            for view, count in firsts:
                candidates.update(state.buckets[view.class_index].nodes_with_at_least(count))
                candidates.update(view.extra_by_node)
        else:
            candidates = set(state.nodes_of(scope))
        ranked = []
        for node in candidates:
            free = sum(view.node_count(node) for view in views)
            if free:
                ranked.append((min(view.node_rank(node) for view in views), free, node))
        ranked.sort()
        return [node for *_, node in ranked]

    def _could_host(self, node: int) -> bool:
        """A count check before a node's devices are looked at: some pod set's every request has, in
        one of its ways, that many free devices of the way's class on the node."""
        views = self.views
        counts: dict[str, int] = {}
        for shape in self.shapes:
            for ways in shape.ways:
                for way in ways:
                    free = counts.get(way.class_name)
                    if free is None:
                        free = counts[way.class_name] = views[way.class_name].node_count(node)
                    if free >= way.count:
                        break
                else:
                    break
            else:
                return True
        return False

    def _node_slots(self, node: int) -> list:
        seen: set[int] = set()
        slots = []
        for view in self.views.values():
            for slot in view.node_slots(node):
                if id(slot) not in seen:
                    seen.add(id(slot))
                    slots.append(slot)
        return slots

    def _info(self, node: int) -> _NodeInfo:
        info = self._infos.get(node)
        if info is None:
            everything = self.state.node_devices(node) if self.takes_all else None
            info = self._infos[node] = _NodeInfo(node, self._node_slots(node), self.shapes, self.selectors, everything)
        return info

    # --- the search across nodes ---

    def _place_in(self, scope: tuple, wanted: tuple) -> list | None:
        infos = _LazyInfos(self, self._nodes(scope), sum(wanted))
        self._failed: set = set()
        chosen: list = []
        if not self._across(infos, 0, wanted, chosen):
            return None
        return chosen

    def _across(self, infos: _LazyInfos, position: int, remaining: tuple, chosen: list) -> bool:
        """Pods for `remaining` on the nodes from `position` on. A node taking no pod is passed over in
        the loop, not by recursion: the depth stays at the gang's pod count on any number of nodes."""
        visited = []
        while any(remaining):
            info = infos.at(position)
            key = (position, remaining)
            if info is None or key in self._failed:
                break
            self._step()
            visited.append(key)
            for counts in self._fillings(info, remaining):
                pods = self._fit(info, counts)
                if pods is None:
                    continue
                chosen.append((info, pods))
                left = tuple(have - take for have, take in zip(remaining, counts, strict=True))
                if self._across(infos, position + 1, left, chosen):
                    return True
                chosen.pop()
            position += 1
        else:
            return True
        self._failed.update(visited)
        return False

    def _fillings(self, info: _NodeInfo, remaining: tuple) -> list[tuple]:
        """Pod counts per pod set the node might take, the most devices first (not the empty one: the
        caller passes the node over). Each pod set alone is bounded by how many of its pods it fits."""
        most = []
        for index, wanted in enumerate(remaining):
            alone = 0
            while alone < wanted:
                counts = tuple(alone + 1 if i == index else 0 for i in range(len(remaining)))
                if self._fit(info, counts) is None:
                    break
                alone += 1
            most.append(alone)
        fillings = [counts for counts in product(*(range(count, -1, -1) for count in most)) if any(counts)]
        sizes = [shape.demand.per_pod for shape in self.shapes]
        fillings.sort(key=lambda counts: -sum(c * s for c, s in zip(counts, sizes, strict=True)))
        return fillings

    # --- one node ---

    def _fit(self, info: _NodeInfo, counts: tuple) -> list | None:
        """[(shape index, choice, [slot bits per way unit])] for `counts` pods per pod set on the node,
        or None; memoised on the node."""
        if counts in info.fits:
            return info.fits[counts]
        self._step()
        pods = [index for index, count in enumerate(counts) for _ in range(count)]
        choices = [self._choices(info, index) for index in range(len(self.shapes))]
        found = None
        if all(choices[index] for index in set(pods)) and self._may_fit(pods, choices):
            found = self._pods_on_node(info, pods, choices)
        info.fits[counts] = found
        return found

    @staticmethod
    def _may_fit(pods: list[int], choices: list) -> bool:
        """A bound before the search: the pods' fewest devices fit among those any of them may take (so
        asking a full node for one more pod costs no search)."""
        needed, usable = 0, 0
        for index in set(pods):
            options = choices[index]
            needed += pods.count(index) * min(len(units) for _, units in options)
            for _, units in options:
                for unit in units:
                    usable |= unit
        return needed <= usable.bit_count()

    def _choices(self, info: _NodeInfo, shape_index: int) -> list[tuple]:
        """A pod's choices on the node that fit it alone, preferred first: (ways, units) with units the
        masks of the devices each unit may take, one unit per device."""
        known = info.choices.get(shape_index)
        if known is not None:
            return known
        shape = self.shapes[shape_index]
        way_masks = info.way_masks[shape_index]
        value_masks = info.value_masks[shape_index]
        distinct = list(zip(shape.distinct, info.distinct_values[shape_index], strict=True))
        options = []
        for ways in product(*(range(len(ways)) for ways in shape.ways)):
            for values in product(*(value_masks[c] or [("", 0)] for c in range(len(shape.constraints)))):
                units = []
                for request, way in enumerate(ways):
                    mask = way_masks[request][way]
                    for (_, covered), (_, value_mask) in zip(shape.constraints, values, strict=True):
                        if request in covered:
                            mask &= value_mask
                    for (_, covered), (carrying, _) in distinct:
                        if request in covered:
                            mask &= carrying
                    count = info.count(shape_index, request, way, shape.ways[request][way])
                    if mask.bit_count() < count:
                        break
                    units.extend([mask] * count)
                else:
                    if distinct:
                        fits = self._distinct_owner(info, [(shape_index, ways, units)]) is not None
                    else:
                        fits = _matching(units, []) is not None
                    if fits:
                        options.append((ways, units))
        info.choices[shape_index] = options
        return options

    def _unit_requests(self, info: _NodeInfo, shape_index: int, ways: tuple) -> list[int]:
        """The request each unit of a choice serves, in the order of its units."""
        shape = self.shapes[shape_index]
        requests = []
        for request, way in enumerate(ways):
            requests.extend([request] * info.count(shape_index, request, way, shape.ways[request][way]))
        return requests

    def _distinct_owner(self, info: _NodeInfo, pods: list) -> list | None:
        """An owner list (device bit -> unit) for the units of `pods` [(shape index, ways, units)] on the
        node, matched together, with every distinctAttribute constraint of each pod holding: the devices
        of its covered units carry values all different. A backtracking search (a bipartite matching
        cannot say "one device per value"), counted in the search's steps."""
        masks: list[int] = []
        tags: list[tuple] = []  # per unit: (pod, value index by bit) of each distinct constraint covering it
        for number, (shape_index, ways, units) in enumerate(pods):
            shape = self.shapes[shape_index]
            constraints = list(zip(shape.distinct, info.distinct_values[shape_index], strict=True))
            for mask, request in zip(units, self._unit_requests(info, shape_index, ways), strict=True):
                masks.append(mask)
                tags.append(
                    tuple(
                        ((number, position), values)
                        for position, ((_, covered), (_, values)) in enumerate(constraints)
                        if request in covered
                    )
                )
        if _matching(masks, []) is None:
            return None
        # A group needs as many values as it has units (8 GPUs under distinct roots of a node with 4 fail
        # here, before any search).
        needs: dict = {}  # group -> [its units, the union of their masks, value index by device bit]
        for mask, unit_tags in zip(masks, tags, strict=True):
            for group, values in unit_tags:
                need = needs.setdefault(group, [0, 0, values])
                need[0] += 1
                need[1] |= mask
        for units, union, values in needs.values():
            if len({values[bit] for bit in range(union.bit_length()) if union >> bit & 1}) < units:
                return None
        # The most constrained units first; alike units (same devices, same constraints) next to one
        # another, each taking a device after its predecessor's, as their order cannot matter.
        groups = [tuple(group for group, _ in unit_tags) for unit_tags in tags]
        order = sorted(range(len(masks)), key=lambda unit: (masks[unit].bit_count(), masks[unit], groups[unit]))
        owner: list = [None] * max(mask.bit_length() for mask in masks) if masks else []
        used: dict = {}

        def place(at: int, after: int) -> bool:
            if at == len(order):
                return True
            self._step()
            unit = order[at]
            mask = masks[unit]
            if at and masks[order[at - 1]] == mask and groups[order[at - 1]] == groups[unit]:
                mask &= ~((1 << (after + 1)) - 1)
            while mask:
                low = mask & -mask
                bit = low.bit_length() - 1
                mask ^= low
                if owner[bit] is not None:
                    continue
                taken = [(group, values[bit]) for group, values in tags[unit]]
                if any(used.get(key) for key in taken):
                    continue
                owner[bit] = unit
                for key in taken:
                    used[key] = True
                if place(at + 1, bit):
                    return True
                owner[bit] = None
                for key in taken:
                    used[key] = False
            return False

        return owner if place(0, -1) else None

    def _pods_on_node(self, info: _NodeInfo, pods: list[int], choices: list) -> list | None:
        """Choices for `pods` (shape indices, alike pods adjacent) matched jointly; alike pods take
        non-decreasing choices, as their order cannot matter."""
        picked: list[tuple[int, int]] = []
        distinct = any(self.shapes[index].distinct for index in set(pods))

        def assign(at: int, units: list, owner: list) -> list | None:
            if at == len(pods):
                if distinct:  # the matching so far ignored them: the pods' units again, with them
                    owner = self._distinct_owner(
                        info,
                        [(index, choices[index][choice][0], choices[index][choice][1]) for index, choice in picked],
                    )
                    if owner is None:
                        return None
                if info.counted and not self._counters_hold(info, owner):
                    return None
                return owner
            self._step()
            shape_index = pods[at]
            first = picked[-1][1] if picked and picked[-1][0] == shape_index else 0
            for choice_index in range(first, len(choices[shape_index])):
                _, pod_units = choices[shape_index][choice_index]
                matched = _matching(pod_units, owner, len(units), units)
                if matched is None:
                    continue
                picked.append((shape_index, choice_index))
                done = assign(at + 1, units + pod_units, matched)
                if done is not None:
                    return done
                picked.pop()
            return None

        owner = assign(0, [], [])
        if owner is None:
            return None
        # The device of each unit, unit by unit.
        device_of = {unit: bit for bit, unit in enumerate(owner) if unit is not None}
        placed, at = [], 0
        for shape_index, choice_index in picked:
            ways, units = choices[shape_index][choice_index]
            placed.append((shape_index, ways, [device_of[at + k] for k in range(len(units))]))
            at += len(units)
        return placed

    def _counters_hold(self, info: _NodeInfo, owner: list) -> bool:
        spent: dict = dict(self.base_spent)
        for bit, unit in enumerate(owner):
            if unit is None:
                continue
            slot = info.slots[bit]
            if slot.consumes is not None:
                if not self.state.fits_counters(slot, spent):
                    return False
                for counter, amount in slot.consumes:
                    spent[counter] = spent.get(counter, 0) + amount
        return True

    def _step(self) -> None:
        self.steps += 1
        if self.steps > STEP_BUDGET:
            raise OutOfSteps

    # --- the plan ---

    def _optional(self, found: list, scope: tuple) -> tuple:
        """ClaimPods for the required pods, then as many optional pods (above min_count) as fit on the
        devices left, node by node."""
        pods: list[ClaimPod] = []
        next_index = [0] * len(self.shapes)
        taken: dict[int, set] = {}
        for info, placed in found:
            for shape_index, ways, bits in placed:
                pods.append(self._pod(info, shape_index, ways, bits, next_index))
                taken.setdefault(info.node, set()).update(bits)
        extra = [shape.demand.count - shape.demand.min_count for shape in self.shapes]
        if not any(extra):
            return tuple(pods)
        for node in self._nodes(scope):
            if not any(extra):
                break
            info = self._info(node)
            used = taken.get(node, set())
            for shape_index, more in enumerate(extra):
                while more:
                    bits = self._one_more(info, shape_index, used)
                    if bits is None:
                        break
                    ways, chosen = bits
                    pods.append(self._pod(info, shape_index, ways, chosen, next_index))
                    used |= set(chosen)
                    more -= 1
                extra[shape_index] = more
            taken[node] = used
        return tuple(pods)

    def _one_more(self, info: _NodeInfo, shape_index: int, used: set):
        free = ~sum(1 << bit for bit in used)
        distinct = self.shapes[shape_index].distinct
        for ways, units in self._choices(info, shape_index):
            masked = [unit & free for unit in units]
            owner = self._distinct_owner(info, [(shape_index, ways, masked)]) if distinct else _matching(masked, [])
            if owner is None:
                continue
            chosen = [bit for unit in range(len(masked)) for bit, who in enumerate(owner) if who == unit]
            if info.counted:
                spent_owner = [None] * len(info.slots)
                for bit in list(used) + chosen:
                    spent_owner[bit] = 0
                if not self._counters_hold(info, spent_owner):
                    continue
            return ways, chosen
        return None

    def _pod(self, info: _NodeInfo, shape_index: int, ways: tuple, bits: list, next_index: list) -> ClaimPod:
        shape = self.shapes[shape_index]
        index = next_index[shape_index]
        next_index[shape_index] += 1
        labels = tuple(
            (
                shape.ways[request][way].label,
                shape.ways[request][way].class_name,
                info.count(shape_index, request, way, shape.ways[request][way]),
            )
            for request, way in enumerate(ways)
        )
        # Each request's devices in the node's order (the matching may hand them out in another).
        ordered, at = [], 0
        for _, _, count in labels:
            ordered.extend(sorted(bits[at : at + count]))
            at += count
        slots = tuple(info.slots[bit] for bit in ordered)
        return ClaimPod(shape.demand.name, index, info.node, slots, labels)


class _LazyInfos:
    """The scope's nodes as the search reaches them: each node's devices are looked at only then, and a
    node alike (its signature) to as many kept ones as the gang has pods is left out, as no placement
    uses more of them."""

    def __init__(self, planner: Planner, nodes: list[int], pods: int):
        self.planner = planner
        self.nodes = iter(nodes)
        self.pods = pods
        self.kept: list[_NodeInfo] = []
        self.alike: dict = {}

    def at(self, position: int) -> _NodeInfo | None:
        while len(self.kept) <= position:
            node = next(self.nodes, None)
            if node is None:
                return None
            if not self.planner._could_host(node):
                continue
            info = self.planner._info(node)
            if info.signature is not None:
                seen = self.alike.get(info.signature, 0)
                if seen >= self.pods:
                    continue
                self.alike[info.signature] = seen + 1
            self.kept.append(info)
        return self.kept[position]


def _by_free(buckets, at_least: int):
    """(free count, node) of the nodes with at least `at_least` free, fewest first (NodeBuckets order)."""
    values = buckets.values
    for value in values[bisect_left(values, at_least) :]:
        for node in buckets.members[value]:
            yield value, node


def _unique(pairs):
    seen: set[int] = set()
    for _, node in pairs:
        if node not in seen:
            seen.add(node)
            yield node


def _matching(units: list[int], owner: list, start: int = 0, earlier: list | None = None) -> list | None:
    """Devices for `units` (masks of the device bits each may take) beyond those matched already
    (`owner`: device bit -> unit or None, for the units before `start`), by augmenting paths; a new
    owner list, or None when some unit gets no device."""
    every = earlier + units if earlier else units
    owner = list(owner)
    width = max((unit.bit_length() for unit in every), default=0)
    if len(owner) < width:
        owner.extend([None] * (width - len(owner)))

    def augment(unit: int, seen: set) -> bool:
        mask = every[unit]
        # A free device first (the lowest: devices go in their order), then an augmenting path.
        free = mask
        while free:
            low = free & -free
            bit = low.bit_length() - 1
            free ^= low
            if owner[bit] is None:
                owner[bit] = unit
                return True
        while mask:
            low = mask & -mask
            bit = low.bit_length() - 1
            mask ^= low
            if bit in seen:
                continue
            seen.add(bit)
            if owner[bit] is None or augment(owner[bit], seen):
                owner[bit] = unit
                return True
        return False

    for unit in range(start, len(every)):
        if not augment(unit, set()):
            return None
    return owner


def slot_labels(pod: ClaimPod) -> tuple[tuple[str, tuple], ...]:
    """(request label, device ids) pairs of a planned pod, in the claim's order."""
    pairs, at = [], 0
    for label, _, count in pod.requests:
        pairs.append((label, tuple(slot.id for slot in pod.slots[at : at + count])))
        at += count
    return tuple(pairs)


def why_not(planner: Planner, required_level: str | None) -> str:
    """The first request that cannot be met on any node, said as DRA users write claims, e.g.
    "request nic: no 1 efa with the same pcieRoot as 8 h100 (request gpu) free on any node"."""
    try:
        return _why_not(planner, required_level)
    except OutOfSteps:
        return "no placement found for its claim's requests within the search budget"


def _why_not(planner: Planner, required_level: str | None) -> str:
    for shape_index, shape in enumerate(planner.shapes):
        requests = shape.demand.claim.requests
        for count in range(1, len(requests) + 1):
            if planner.fits_one_pod(shape_index, count):
                continue
            failing = requests[count - 1]
            wanted = _way_text(shape.ways[count - 1])
            if shape.most is not None and any(way.takes_all for way in shape.ways[count - 1]):
                wanted += f" (at most {shape.most}, as its resource class allows)"
            if count == 1:
                alone = [attribute for attribute, covered in shape.constraints if 0 in covered]
                wanted += "".join(f" with one {attribute}" for attribute in alone)
                apart = [attribute for attribute, covered in shape.distinct if 0 in covered]
                wanted += "".join(f" each of a distinct {attribute}" for attribute in apart)
                return f"pod set {shape.demand.name}: request {failing.name}: no node has {wanted} free"
            before = " and ".join(
                f"{_way_text(shape.ways[index])} (request {requests[index].name})" for index in range(count - 1)
            )
            shared, apart = _across(shape.constraints, count - 1), _across(shape.distinct, count - 1)
            relations = [f"with the same {' and '.join(shared)} as"] if shared else []
            relations += [f"with a {' and '.join(apart)} distinct from"] if apart else []
            beside = " and ".join(relations) if relations else "beside"
            where = f"pod set {shape.demand.name}: request {failing.name}"
            if any(way.takes_all for way in shape.ways[count - 1]):
                return f"{where}: no node has {wanted} free {beside} {before}"
            return f"{where}: no {wanted} {beside} {before} free on any node"
    pods = sum(shape.demand.min_count for shape in planner.shapes)
    where = f" in one {required_level}" if required_level else ""
    return f"one pod fits, but not all {pods} pods of the gang at once{where}"


def _across(constraints: list, last: int) -> list[str]:
    """The attributes of `constraints` that tie request `last` to some request before it."""
    return [
        attribute
        for attribute, covered in constraints
        if last in covered and any(index in covered for index in range(last))
    ]


def claim_text(claim: Claim) -> str:
    """A claim in a few words: "8 h100 (gpu) + 1 efa (nic) with one pcie_root"."""
    parts = [
        " or else ".join(_amount(way, way.device_class) for way in request.alternatives) + f" ({request.name})"
        for request in claim.requests
    ]
    shared = [constraint.match_attribute for constraint in claim.constraints if constraint.match_attribute]
    apart = [constraint.distinct_attribute for constraint in claim.constraints if constraint.distinct_attribute]
    text = " + ".join(parts) + (f" with one {' and one '.join(shared)}" if shared else "")
    return text + (f" with distinct {' and distinct '.join(apart)}" if apart else "")


def _amount(way, class_name: str) -> str:
    """ "2 h100", or "all h100" for a way taking every matching device."""
    return f"all {class_name}" if way.takes_all else f"{way.count} {class_name}"


def _way_text(ways: list[_Way]) -> str:
    return " or else ".join(_amount(way, way.class_name) for way in ways)


def claim_from_dra(data) -> tuple[tuple[DeviceRequest, ...], tuple[DeviceConstraint, ...]]:
    """PodSet.requests and .constraints from a claim as resource.k8s.io/v1 writes its `devices`:
    {"requests": [{"name", "exactly": {"deviceClassName", "allocationMode", "count", "selectors":
    [{"cel": {"expression"}}]}} or {"name", "firstAvailable": [{"name", "deviceClassName",
    "allocationMode", "count", "selectors"}]}], "constraints": [{"requests": [...], "matchAttribute":
    "gpu.example.com/pcie_root"} or {"requests": [...], "distinctAttribute": ...}]}. allocationMode is
    ExactCount (the default; `count`, default 1) or All (every matching device the pod reaches; no
    `count`). A qualified attribute name stands for its plain name (the part after the last "/").
    ValueError with one line for anything else.
    """
    if not isinstance(data, dict) or not isinstance(data.get("requests"), list):
        raise ValueError("a claim is an object with a list of requests")
    unknown = set(data) - {"requests", "constraints"}
    if unknown:
        raise ValueError(f"unknown claim field '{sorted(unknown)[0]}'")
    requests = []
    for index, raw in enumerate(data["requests"]):
        where = f"requests[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
            raise ValueError(f"{where}: a request needs a name")
        if ("exactly" in raw) == ("firstAvailable" in raw):
            raise ValueError(f"{where}: give exactly or firstAvailable")
        if "exactly" in raw:
            requests.append(DeviceRequest(raw["name"], exactly=_way_from_dra(raw["exactly"], raw["name"], where)))
        else:
            ways = raw["firstAvailable"]
            if not isinstance(ways, list) or not ways:
                raise ValueError(f"{where}.firstAvailable: a non-empty list of sub-requests")
            requests.append(
                DeviceRequest(
                    raw["name"],
                    first_available=tuple(
                        _way_from_dra(
                            way, way.get("name") if isinstance(way, dict) else None, f"{where}.firstAvailable[{i}]"
                        )
                        for i, way in enumerate(ways)
                    ),
                )
            )
    constraints = []
    for index, raw in enumerate(data.get("constraints") or []):
        where = f"constraints[{index}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: a constraint is an object")
        unknown = set(raw) - {"requests", "matchAttribute", "distinctAttribute"}
        if unknown:
            raise ValueError(f"{where}: unknown constraint field '{sorted(unknown)[0]}'")
        given = [key for key in ("matchAttribute", "distinctAttribute") if raw.get(key) is not None]
        if len(given) != 1 or not isinstance(raw[given[0]], str) or not raw[given[0]]:
            raise ValueError(f"{where}: give one matchAttribute or one distinctAttribute")
        names = raw.get("requests") or []
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ValueError(f"{where}.requests: a list of request names")
        attribute = raw[given[0]].rsplit("/", 1)[-1]
        if given[0] == "matchAttribute":
            constraints.append(DeviceConstraint(attribute, tuple(names)))
        else:
            constraints.append(DeviceConstraint(None, tuple(names), distinct_attribute=attribute))
    return tuple(requests), tuple(constraints)


def _way_from_dra(raw, name, where) -> DeviceSubRequest:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: an object")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a sub-request needs a name")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ALLOCATION_MODES:
        raise ValueError(f"{where}.allocationMode: ExactCount or All, not {mode!r}")
    device_class = raw.get("deviceClassName")
    if not isinstance(device_class, str) or not device_class:
        raise ValueError(f"{where}: deviceClassName is required")
    if mode == ALL_DEVICES and raw.get("count") is not None:
        raise ValueError(f"{where}.count: allocationMode All takes every matching device; give no count")
    count = raw.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{where}.count: a whole number of at least 1")
    selectors = []
    for selector in raw.get("selectors") or []:
        expression = selector.get("cel", {}).get("expression") if isinstance(selector, dict) else None
        if not isinstance(expression, str) or not expression:
            raise ValueError(f"{where}.selectors: each is {{cel: {{expression: ...}}}}")
        selectors.append(expression)
    return DeviceSubRequest(name, device_class, count, tuple(selectors), mode)
