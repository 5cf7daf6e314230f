"""Claims owned by a whole gang (Kubernetes 1.36 PodGroup spec.resourceClaims, issue 26).

A group claim is allocated once per gang and every pod of the gang uses its devices, so the pods may
only go where all of them are reachable. *Reach* is read from the device as DRA publishes it: a device
of a ResourceSlice with a nodeName is node-local (reachable from its node only); a network-attached
device published for a nodeSelector on a topology label carries the attribute `reach` naming that level
(`reach: rack` = every node of its node's rack; `reach: cluster` = every node, DRA allNodes). A `reach`
naming no level of the topology counts as node-local.

The placement, for each device class the gang may use (the cycle's order):
- Every free device of the claims' classes that the request may use is a candidate; its reach is a
  domain key (its node's path down to the reach level; ROOT for the cluster).
- The gang's region is one of the candidates' reach domains: as domains nest, the pods of a gang using
  devices of several reaches stand in the finest of them, which is one of those keys. Regions are tried
  finest first, then by key (deterministic).
- In a region each claim must be met by devices whose reach covers the whole region (its key is a
  prefix of the region's): a quick check first; then the gang is placed inside the region (its required
  topology level, if finer, inside it), then the claims are matched (claims.Planner on one virtual node
  of those devices: requests, firstAvailable, matchAttribute constraints and shared counters as a pod's
  claim) on what the gang left, claim after claim. The claims take devices after the gang, so a claim
  of the gang's own class competes for what the gang did not take: the gang's placement is kept.
- No region works: `why_not` names the first claim that stops it, e.g. "group claim scratch: no 1
  scratch reachable from a rack with 8 free h100".
As several-request claims, a gang with group claims waits for free devices: it neither chooses victims
nor gets a protected start (Cycle._after_failure). Workloads without group claims never come here.
"""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

from broker.scheduler.capacity import PLAIN, ROOT
from broker.scheduler.claims import Claim, OutOfSteps, Planner, _NodeInfo, claim_problem, claim_text, slot_labels
from broker.scheduler.placement import PodDemand, domains_with_room, minimum_devices, place_within_scope
from broker.scheduler.snapshot import REACH_ATTRIBUTE, REACH_CLUSTER, GroupClaim

VIRTUAL_NODE = -1  # the node index of a claim's candidate devices matched together


class GroupedPlan(NamedTuple):
    """A GangPlan (same first fields) with its group claims' devices: `group` holds
    ("<claim>/<request label>", slots) pairs in the claims' order."""

    class_index: int
    scope: tuple
    pods: tuple
    group: tuple

    def slots(self):
        for pod in self.pods:
            yield from pod.slots
        for _, slots in self.group:
            yield from slots

    def group_count(self) -> int:
        return sum(len(slots) for _, slots in self.group)


def group_problem(group_claims: tuple[GroupClaim, ...], known_classes) -> str | None:
    """What can never be valid in a workload's group claims, or None."""
    names = [claim.name for claim in group_claims]
    if len(set(names)) != len(names):
        return "group claim names must be unique"
    for claim in group_claims:
        if not claim.name or "/" in claim.name:
            return "a group claim needs a name without '/'"
        problem = claim_problem(Claim(claim.requests, claim.constraints), known_classes)
        if problem:
            return f"group claim {claim.name}: {problem}"
    return None


def claim_classes(group_claims: tuple[GroupClaim, ...]) -> tuple[str, ...]:
    names: list[str] = []
    for claim in group_claims:
        for name in Claim(claim.requests, claim.constraints).classes():
            if name not in names:
                names.append(name)
    return tuple(names)


def reach_key(state, slot) -> tuple:
    """The domain from every node of which the device is reachable (see the module's docstring)."""
    level = slot.attributes.get(REACH_ATTRIBUTE)
    if level == REACH_CLUSTER:
        return ROOT
    index = state.level_index(level) if isinstance(level, str) else None
    if index is None:
        index = len(state.levels) - 1  # node-local
    return state.node_domains[index][slot.node]


_order = attrgetter("order")


def class_slots(state, class_index: int, known: dict) -> list:
    """(slot, reach key) of every device of the class, whatever its state: made once per cycle state
    and class (`known`, the cycle's), as gangs with group claims ask it again and again."""
    kept = known.get(class_index)
    if kept is None or kept[0] is not state:
        pairs = [(slot, reach_key(state, slot)) for slot in state.slots if class_index in slot.classes]
        kept = known[class_index] = (state, pairs)
    return kept[1]


class _ClaimSearch:
    """One group claim matched as one pod of its claim on a virtual node of candidate devices."""

    def __init__(self, claim: GroupClaim, state, views: dict, selectors, known: dict):
        self.claim = claim
        self.state = state
        self.selectors = selectors
        self.known = known
        as_claim = Claim(claim.requests, claim.constraints)
        self.demand = PodDemand(claim.name, 1, 1, as_claim.fewest_devices(), None, as_claim)
        self.planner = Planner(state, views, (self.demand,), selectors)
        # Candidate devices by reach key: every free one of its classes the request may use (plain and
        # free, off the nodes held for others, or among the view's extras), in device order.
        self.by_reach: dict[tuple, list] = {}
        classes = as_claim.classes()
        seen: set[int] | None = set() if len(classes) > 1 else None  # a device of two of its classes once
        by_reach = self.by_reach
        for name in classes:
            view = views[name]
            pairs = class_slots(state, view.class_index, known)
            usable = [pair for pair in pairs if pair[0].holder is None and pair[0].category == PLAIN]
            if view.excluded:
                usable = [pair for pair in usable if pair[0].node not in view.excluded]
            usable += [(slot, reach_key(state, slot)) for ranked in view.extra_by_node.values() for _, slot in ranked]
            for slot, key in usable:
                if seen is not None:
                    if id(slot) in seen:
                        continue
                    seen.add(id(slot))
                found = by_reach.get(key)
                if found is None:
                    by_reach[key] = [slot]
                else:
                    found.append(slot)

    @property
    def candidates(self) -> int:
        return sum(len(slots) for slots in self.by_reach.values())

    def regions(self) -> set[tuple]:
        return set(self.by_reach)

    def match(self, region: tuple, taken: set, spent: dict) -> list | None:
        """[(label, slots)] for the claim from devices reachable from all of `region`, not in `taken`
        (ids of slots), within the shared counters left after `spent`; None when it cannot be met."""
        by_reach = self.by_reach
        slots = []
        for depth in range(len(region) + 1):  # the keys reaching the region are its prefixes
            reaching = by_reach.get(region[:depth])
            if reaching:
                slots.extend(slot for slot in reaching if id(slot) not in taken)
        slots.sort(key=_order)
        if len(slots) < self.demand.per_pod:
            return None
        planner = self.planner
        planner.steps = 0
        planner.base_spent = spent
        everything = self._reaching_all(region) if planner.takes_all else None
        info = _NodeInfo(VIRTUAL_NODE, slots, planner.shapes, self.selectors, everything)
        try:
            placed = planner._fit(info, (1,))
        except OutOfSteps:
            return None
        if placed is None:
            return None
        shape_index, ways, bits = placed[0]
        pod = planner._pod(info, shape_index, ways, bits, [0])
        by_id = {slot.id: slot for slot in pod.slots}
        return [
            (f"{self.claim.name}/{label}", tuple(by_id[device_id] for device_id in ids))
            for label, ids in slot_labels(pod)
        ]

    def _reaching_all(self, region: tuple) -> list:
        """Every device of the classes its All ways take, whatever its state, reachable from all of
        `region`: what allocationMode All must take in full (a device of them busy or broken fails it)."""
        state = self.state
        classes = {way.class_index for ways in self.planner.shapes[0].ways for way in ways if way.takes_all}
        found: dict[int, object] = {}
        for class_index in classes:
            for slot, key in class_slots(state, class_index, self.known):
                if key == region[: len(key)]:
                    found[slot.order] = slot
        return [found[order] for order in sorted(found)]


class GroupPlacer:
    """Places one gang with group claims on the current free state (one class of the gang at a time)."""

    def __init__(self, cycle, request, access, excluded, freed=(), credit=None):
        """`freed`: (rank, slot) of devices to count as free too, `credit`: counter position -> amount given
        back with them (what a preemption search's victims would leave)."""
        self.cycle = cycle
        self.request = request
        self.access = access
        self.excluded = excluded
        self.freed = freed
        self.credit = credit
        state = cycle.state
        self.state = state
        group_claims = request.workload.group_claims
        views = {name: self._view(name) for name in claim_classes(group_claims)}
        self.searches = [
            _ClaimSearch(claim, state, views, cycle.selectors, cycle.group_candidates) for claim in group_claims
        ]
        regions: set[tuple] = set()
        for search in self.searches:
            regions |= search.regions()
        self.regions = sorted(regions, key=_finest_first(state))
        self.needed = minimum_devices(request.demands)

    def claims_fit(self, region: tuple, taken: set | None = None, spent: dict | None = None) -> list | None:
        """Every claim met in `region` after the devices `taken` (slot ids) and counters `spent`."""
        taken = set(taken or ())
        spent = dict(spent or {})
        group = []
        for search in self.searches:
            found = search.match(region, taken, spent)
            if found is None:
                return None
            for _, slots in found:
                for slot in slots:
                    taken.add(id(slot))
                    if slot.consumes is not None:
                        for counter, amount in slot.consumes:
                            spent[counter] = spent.get(counter, 0) + amount
            group.extend(found)
        return group

    def place(self, class_name: str) -> GroupedPlan | None:
        room = self._room(class_name)
        for region in self.regions:
            if room is not None and room(region) < self.needed:
                continue  # the gang alone has no room there: a count, before any device is looked at
            if self.claims_fit(region) is None:
                continue
            plan = self._gang_in(region, class_name)
            if plan is None:
                continue
            taken = {id(slot) for pod in plan.pods for slot in pod.slots}
            spent: dict = {}
            for pod in plan.pods:
                for slot in pod.slots:
                    if slot.consumes is not None:
                        for counter, amount in slot.consumes:
                            spent[counter] = spent.get(counter, 0) + amount
            group = self.claims_fit(region, taken, spent)
            if group is not None:
                return GroupedPlan(plan.class_index, plan.scope, plan.pods, tuple(group))
        return None

    def _view(self, class_name: str):
        return self.cycle.freed_view(class_name, self.access, self.excluded, self.freed, self.credit)

    def _room(self, class_name: str):
        """Free devices of the gang's class in a region as it sees them (None for a several-request claim,
        whose classes are counted by its own planner)."""
        if self.request.claimed:
            return None
        return self._view(class_name).domain_count

    def _gang_in(self, region: tuple, class_name: str):
        request, cycle, state = self.request, self.cycle, self.state
        levels = state.levels
        required = levels.index(request.required) if request.required else None
        preferred = levels.index(request.preferred) if request.preferred else None
        if request.claimed:
            views = {name: self._view(name) for name in request.classes}
            planner = Planner(state, views, request.demands, cycle.selectors)
            return planner.place(required, preferred, state.class_index[request.classes[0]], within=region)
        view = self._view(class_name)
        needed = minimum_devices(request.demands)
        if view.domain_count(region) < needed:
            return None
        if required is None or len(region) > required:
            scopes = [region]  # the region lies inside one domain of the required level
        else:
            scopes = domains_with_room(view, required, needed, region)
        for scope in scopes:
            plan = place_within_scope(view, scope, request.demands, preferred)
            if plan is not None:
                return plan
        return None

    def why_not(self, class_name: str) -> tuple[str, str]:
        """(reason code, message): the first group claim that stops the gang, said as its owner wrote
        it; InsufficientCapacity when too few of its devices are free at all."""
        levels = self.state.levels
        for position, search in enumerate(self.searches):
            text = claim_text(search.demand.claim)
            if search.candidates < search.demand.per_pod:
                return "InsufficientCapacity", f"group claim {search.claim.name}: too few free devices for {text}"
            fitting = [region for region in self.regions if self._claims_fit_upto(region, position)]
            if not fitting:
                if position == 0:
                    message = f"group claim {search.claim.name}: {text} cannot be met by devices reachable together"
                else:
                    message = (
                        f"group claim {search.claim.name}: no {text} reachable beside group claim "
                        f"{self.searches[0].claim.name}"
                    )
                return "TopologyFragmented", message
        gang = _gang_text(self.request, class_name)
        first = self.searches[0]
        depths = sorted({len(region) for region in self.regions}, reverse=True)
        where = " or ".join(("the cluster" if depth == 0 else f"a {levels[depth - 1]}") for depth in depths)
        return "TopologyFragmented", (
            f"group claim {first.claim.name}: no {claim_text(first.demand.claim)} reachable from {where} with {gang}"
        )

    def _claims_fit_upto(self, region: tuple, last: int) -> bool:
        taken: set = set()
        spent: dict = {}
        for search in self.searches[: last + 1]:
            found = search.match(region, taken, spent)
            if found is None:
                return False
            for _, slots in found:
                taken.update(id(slot) for slot in slots)
        return True


def _finest_first(state):
    """A sort key of domain keys: finer levels first, then by key (as sorted tuples), as one int."""
    depth = len(state.levels)
    ranks, positions = state.domain_key_rank, state.domain_position
    width = max((len(keys) for keys in state.domain_keys), default=0) + 1

    def order(key: tuple) -> int:
        if not key:
            return depth * width  # ROOT last
        level = len(key) - 1
        return (depth - 1 - level) * width + ranks[level][positions[level][key]]

    return order


def _gang_text(request, class_name: str) -> str:
    """What the gang needs free, e.g. "8 free h100"."""
    if request.claimed:
        return "room for " + " + ".join(
            f"{demand.min_count} × ({claim_text(demand.claim)})" if demand.min_count > 1 else claim_text(demand.claim)
            for demand in request.demands
        )
    return f"{minimum_devices(request.demands)} free {class_name}"
