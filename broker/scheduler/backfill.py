"""Head-of-line protection (Slurm-style backfill) so small work cannot starve a large gang.

When the first workload in cluster order that is blocked only by capacity (the head) cannot start, its
earliest start is planned from the expected ends of running work (and of work admitted this cycle with
a known duration): at each release time, is there a placement? The first one found fixes a start time
and a domain (the required-level domain, or the plan's nodes without a required level). Later work may
still start if it stays off that domain, or if its own expected duration ends before the planned start.

Without enough known durations the start cannot be planned; once the head has waited
`backfill_wait_seconds`, the domain it could use soonest (the one with most free devices among those
that can hold it at all) is kept free anyway, with no start time.

With depth (issue 27, Slurm's `bf_max_job_test`): up to `backfill_depth` waiting gangs are protected per
cycle, first in line first, each planned around the ones before it (it never plans on their nodes), and
work behind them runs now only if it delays none of them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import islice

from broker.scheduler import claims
from broker.scheduler.capacity import ROOT, View
from broker.scheduler.placement import place_gang, place_within_scope
from broker.scheduler.snapshot import label, moment


@dataclass(frozen=True)
class Protection:
    workload_id: str
    priority: int
    nodes: frozenset
    scope: tuple
    level: str | None
    planned_start: float | None
    name: str = ""  # the protected workload's, for messages

    def excluded_for(self, request, now: float) -> frozenset:
        duration = request.workload.expected_duration
        if self.planned_start is not None and duration is not None and now + duration <= self.planned_start:
            return frozenset()
        return self.nodes

    def describe(self, state) -> str:
        if self.scope != ROOT and self.level:
            where = f"{self.level} {self.scope[-1]} is"
        else:
            names = sorted(state.node_names[node] for node in self.nodes)
            more = f" and {len(names) - 5} more" if len(names) > 5 else ""
            where = f"node {names[0]} is" if len(names) == 1 else "nodes " + ", ".join(names[:5]) + more + " are"
        head = f"{where} held for {self.name or self.workload_id} (priority {self.priority}, ahead in line)"
        if self.planned_start is None:
            return f"{head}; it has waited too long and durations are unknown, so no start is planned"
        return f"{head}, planned to start at {moment(self.planned_start)}"


def release_timeline(cycle) -> list[tuple[float, str]]:
    """(expected end, workload id) of everything holding devices whose end is known, earliest first, as
    far as simulations reach: the first `estimate_horizon_events` releases and any at the same time as
    the last of them (a simulation handles whole release times until it has handled that many).

    Asked by backfill during the cycle and by estimates after it. Chosen victims end now; a shrunk one
    runs on, and only the pods it gives up end now (under their `leaving_id`). Victims and admissions
    only grow during a cycle, so what is read of running work is gathered once (on the cycle)."""
    return _timeline(cycle).events(cycle, cycle.config.estimate_horizon_events)


def unknown_ends(cycle) -> int:
    """Running workloads holding devices with no expected end (not evicting, not chosen as victims)."""
    victims = cycle.chosen_victims - cycle.shrunk_victims
    return sum(1 for workload_id in _timeline(cycle).without_end if workload_id not in victims)


def admitted_without_end(cycle) -> int:
    """The cycle's admissions so far with no expected duration."""
    timeline = _timeline(cycle)
    timeline._admitted(cycle)
    return timeline.admitted_without_end


def _timeline(cycle) -> ReleaseTimeline:
    timeline = cycle.__dict__.get("_release_timeline")
    if timeline is None:
        timeline = cycle.__dict__["_release_timeline"] = ReleaseTimeline(cycle)
    return timeline


class ReleaseTimeline:
    """What `release_timeline` reads of running work, gathered once per cycle.

    Simulations consume at most `estimate_horizon_events` releases (plus those at the same time as the
    last of them), so only that many of the earliest ends are ever put in order: a partial selection
    of the ~all running work instead of a full sort each time the chosen victims change."""

    def __init__(self, cycle):
        now = cycle.snapshot.now
        self.now = now
        self.evicting: list[str] = []
        self.without_end: list[str] = []
        self.ends: list[tuple[float, str]] = []  # not evicting, end known; chosen victims still in
        # One pass, each record read once: tens of thousands of them, and the reads are cache misses.
        for workload in cycle.snapshot.running:
            if workload.evicting:
                self.evicting.append(workload.id)
            elif workload.expected_end is None:
                self.without_end.append(workload.id)
            else:
                end = workload.expected_end
                self.ends.append((end if end > now else now, workload.id))
        self.earliest: list[tuple[float, str]] = []  # the smallest of `ends`, in order
        self.admitted: list[tuple[float, str]] = []
        self.admitted_seen = 0
        self.admitted_without_end = 0

    def events(self, cycle, horizon: int) -> list[tuple[float, str]]:
        # A shrunk victim runs on to its end; the pods it gives up leave now (`cycle.leaving`).
        victims = cycle.chosen_victims - cycle.shrunk_victims if cycle.leaving else cycle.chosen_victims
        now = self.now
        ending_now = sorted(
            {(now, workload_id) for workload_id in self.evicting}
            | {(now, workload_id) for workload_id in victims if workload_id in cycle.running}
            | {(now, workload_id) for workload_id in cycle.leaving}
        )
        events: list[tuple[float, str]] = []
        for event in heapq.merge(ending_now, self._ends_except(victims, horizon), self._admitted(cycle)):
            if len(events) >= horizon and (not events or event[0] != events[-1][0]):
                break
            events.append(event)
        return events

    def _ends_except(self, victims, horizon: int):
        position = 0
        while True:
            if position == len(self.earliest):
                if position == len(self.ends):
                    return
                self._select(2 * position + horizon + 64)  # room for victims skipped and ties
            event = self.earliest[position]
            position += 1
            if event[1] not in victims:
                yield event

    def _select(self, count: int) -> None:
        # (end, id) pairs are unique, so the `count` smallest come in the order a full sort gives them.
        # Past the first selection, sort them all: a reach that outran it is ending inside a tie (work
        # past its expected end all ends "now", thousands at once), and selecting ever larger prefixes
        # cost seven passes over every end where one sort does.
        first = not self.earliest
        self.earliest = heapq.nsmallest(count, self.ends) if first and count < len(self.ends) else sorted(self.ends)

    def _admitted(self, cycle) -> list[tuple[float, str]]:
        """(expected end, id) of the cycle's admissions so far, earliest first; those without an expected
        duration are counted in `admitted_without_end`. Admissions only grow: each is read once."""
        admitted = cycle.log.admitted
        if len(admitted) == self.admitted_seen:
            return self.admitted
        seen = self.admitted_seen
        ends = self.admitted
        now = self.now
        unknown = 0
        durations = cycle.log.admitted_durations[seen:]
        for workload_id, duration in zip(islice(admitted, seen, None), durations, strict=True):
            if duration is None:
                unknown += 1
            else:
                ends.append((now + duration, workload_id))
        self.admitted_seen = len(admitted)
        self.admitted_without_end += unknown
        ends.sort()
        return ends


def held_slots(cycle, workload_id: str, access) -> list:
    slots = []
    for slot in cycle.slots_held_by(workload_id):
        rank = access.rank(slot)
        if rank is not None:
            slots.append((rank, slot))
    return slots


def plan_protection(cycle, request, every_domain: bool = False) -> Protection | None:
    """The earliest start the release timeline gives `request`, on nodes no gang protected before it
    holds. `every_domain`: when that timeline ends before a start is found, look further in each domain
    of the required level by the ends of the work there alone (see `_plan_in_each_domain`)."""
    levels = cycle.state.levels
    required = levels.index(request.required) if request.required else None
    preferred = levels.index(request.preferred) if request.preferred else None
    access = request.default_access
    classes = cycle.entitled_classes(request)
    events = release_timeline(cycle)[: cycle.config.estimate_horizon_events]
    # Never on the nodes held for gangs protected before it (ahead of it in line).
    ahead = frozenset().union(*(protection.nodes for protection in cycle.protections))
    if request.claimed:
        return _plan_claim(cycle, request, events, ahead, every_domain and required is not None)
    # One view per class, extended with each release (not rebuilt with everything released so far).
    views = {name: cycle.view(name, access, excluded=ahead) for name in classes}
    extended = dict.fromkeys(classes, 0)
    free_now = max((view.total() for view in views.values()), default=0)

    def place_in_a_class(released):
        for class_name in classes:
            view = views[class_name]
            view.extend(released[extended[class_name] :])
            extended[class_name] = len(released)
            plan = place_gang(view, request.demands, required, preferred)
            if plan is not None:
                return plan
        return None

    found = _first_start(cycle, events, access, request.needed - free_now, place_in_a_class)
    if found is not None:
        end, plan = found
        return _protection(cycle, request, plan.scope, {pod.node for pod in plan.pods}, end)
    if every_domain and required is not None:
        found = _plan_in_each_domain(cycle, request, classes, required, preferred, ahead)
        if found is not None:
            return found
    if cycle.snapshot.now - request.workload.submitted < cycle.config.backfill_wait_seconds:
        return None
    return _protection_without_durations(cycle, request, classes, required, ahead)


def _plan_claim(cycle, request, events, ahead, every_domain) -> Protection | None:
    """plan_protection for a several-request claim: its pods are placed by the claim planner (every
    request in its own class, with the constraints across them) over what the releases free, of any of
    its classes; with `every_domain`, in each domain of its required level by the ends there alone.
    Without a start from the expected ends, once it has waited `backfill_wait_seconds`, it is kept a
    place as whole-device gangs are (`_claim_without_durations`)."""
    access = request.default_access
    free_now = sum(cycle.view(name, access, excluded=ahead).total() for name in request.classes)

    def place_claim(released):
        return cycle.claim_plan(request, access, excluded=ahead, freed=released)

    found = _first_start(cycle, events, access, request.needed - free_now, place_claim)
    if found is not None:
        end, plan = found
        return _protection(cycle, request, plan.scope, {pod.node for pod in plan.pods}, end)
    if every_domain:
        protection = _plan_claim_in_each_domain(cycle, request, ahead)
        if protection is not None:
            return protection
    if cycle.snapshot.now - request.workload.submitted < cycle.config.backfill_wait_seconds:
        return None
    return _claim_without_durations(cycle, request, ahead)


def _first_start(cycle, events, access, short, place):
    """(end, plan) of the first end of the release timeline `events` after which `place(released)` plans
    the gang over the slots the releases so far freed (held_slots, in release order), or None. Releases
    at one time are tried once, after the last of them, and none before `short` devices are released
    (what the free ones lack of the gang's count: no placement can succeed with fewer)."""
    released: list = []
    for position, (end, workload_id) in enumerate(events):
        released.extend(held_slots(cycle, workload_id, access))
        if position + 1 < len(events) and events[position + 1][0] == end:
            continue
        if len(released) < short:
            continue
        plan = place(released)
        if plan is not None:
            return end, plan
    return None


def _plan_claim_in_each_domain(cycle, request, ahead) -> Protection | None:
    """_plan_in_each_domain for a several-request claim: the earliest end after which the claim planner
    places it within one domain, every node outside that domain excluded."""
    required = cycle.state.levels.index(request.required)
    access = request.default_access
    ends = _ends_by_domain(cycle, required)
    views = [cycle.view(name, access, excluded=ahead) for name in request.classes]
    every_node = frozenset(range(len(cycle.state.node_names)))
    best = None
    for scope in sorted(ends):
        events = ends[scope]
        free = sum(view.domain_count(scope) for view in views)
        if free + sum(len(slots) for _, slots in events) < request.needed:
            continue  # even everything there ending is not enough
        outside = None  # every node but the domain's: made once a placement is worth trying
        released: list = []
        for position, (end, slots) in enumerate(events):
            if best is not None and end >= best[0]:
                break
            released.extend((rank, slot) for slot in slots if (rank := access.rank(slot)) is not None)
            if position + 1 < len(events) and events[position + 1][0] == end:
                continue
            if free + len(released) < request.needed:
                continue
            if outside is None:
                outside = ahead | (every_node - frozenset(cycle.state.nodes_of(scope)))
            if cycle.claim_plan(request, access, excluded=outside, freed=released) is not None:
                best = (end, scope)
                break
    if best is None:
        return None
    return _protection(cycle, request, best[1], (), best[0])


def _plan_in_each_domain(cycle, request, classes, required, preferred, ahead) -> Protection | None:
    """The earliest start in any one domain of the required level, each domain simulated with the
    expected ends of the work holding devices there alone. The cluster-wide timeline stops after
    `estimate_horizon_events` releases, and on a cluster busy with short jobs those are spent within
    minutes, long before the one batch job whose end frees a rack: a large gang planned only from it
    loses its protection at every burst of short work, and its rack is refilled meanwhile."""
    access = request.default_access
    needed = request.needed
    ends = _ends_by_domain(cycle, required)
    built = cycle.empty_state()
    best = None
    for class_name in classes:
        capacities = View(built, built.class_index[class_name], excluded=ahead).domain_counts(required)
        free_now = cycle.view(class_name, access, excluded=ahead)
        for scope in sorted(capacities):
            if capacities[scope] < needed:
                continue
            view = cycle.view(class_name, access, excluded=ahead)  # extended below: one per domain
            free = free_now.domain_count(scope)
            events = ends.get(scope, ())
            for position, (end, slots) in enumerate(events):
                if best is not None and end >= best[0]:
                    break
                view.extend([(rank, slot) for slot in slots if (rank := access.rank(slot)) is not None])
                free += len(slots)
                if position + 1 < len(events) and events[position + 1][0] == end:
                    continue
                if free >= needed and place_within_scope(view, scope, request.demands, preferred) is not None:
                    best = (end, scope)
                    break
    if best is None:
        return None
    return _protection(cycle, request, best[1], (), best[0])


def _ends_by_domain(cycle, level_index: int) -> dict[tuple, list[tuple[float, list]]]:
    """Domain of the level -> (expected end, the devices it frees there) of everything holding devices
    there whose end is known (the whole timeline, not its first releases), earliest first. Made once per
    cycle state: asked for the few oldest large gangs only, before anything is admitted."""
    timeline = _timeline(cycle)
    key = (level_index, len(cycle.log.admitted), len(cycle.chosen_victims), len(cycle.leaving))
    known = cycle.__dict__.setdefault("_ends_by_domain", {})
    if key in known:
        return known[key]
    events = timeline.events(cycle, len(timeline.ends) + len(timeline.evicting) + len(cycle.log.admitted) + 1)
    keys = cycle.state.node_domains[level_index]
    by_domain: dict[tuple, list] = {}
    if cycle.log.admitted_plans or cycle.simulated_plans or cycle.leaving:
        for end, workload_id in events:
            here: dict[tuple, list] = {}
            for slot in cycle.slots_held_by(workload_id):
                here.setdefault(keys[slot.node], []).append(slot)
            for scope, slots in here.items():
                by_domain.setdefault(scope, []).append((end, slots))
    else:
        held = _held_by_holder(cycle.state.slots)
        for end, workload_id in events:
            slots = held.get(workload_id)
            if not slots:
                continue
            # The devices lie node by node: first and last on one node, all are (most work's case).
            if slots[0].node == slots[-1].node:
                by_domain.setdefault(keys[slots[0].node], []).append((end, slots))
                continue
            here = {}
            for slot in slots:
                here.setdefault(keys[slot.node], []).append(slot)
            for scope, slots_there in here.items():
                by_domain.setdefault(scope, []).append((end, slots_there))
    known[key] = by_domain
    return by_domain


def _held_by_holder(slots) -> dict[str, list]:
    """Holder -> the devices it holds, in one pass over the devices. Before any plan is held and while no
    victim leaves, a running workload's devices are exactly those held under its id (Cycle.slots_held_by):
    asked for each of ~40,000 running workloads one by one, they cost three times as much at 325,000
    devices."""
    held: dict[str, list] = {}
    for slot in slots:
        holder = slot.holder
        if holder is not None:
            if holder in held:
                held[holder].append(slot)
            else:
                held[holder] = [slot]
    return held


def _protection(cycle, request, scope, plan_nodes, start) -> Protection:
    nodes = frozenset(cycle.state.nodes_of(scope)) if scope != ROOT else frozenset(plan_nodes)
    return Protection(
        request.id, request.workload.priority, nodes, scope, request.required, start, label(request.workload)
    )


def _protection_without_durations(cycle, request, classes, required, ahead=frozenset()) -> Protection | None:
    """Keep free the domain the head could use soonest: the most free devices now among domains that
    could hold it once everything there has ended (the cluster as built), off the nodes held `ahead`."""
    built = cycle.empty_state()
    access = request.default_access
    for class_name in classes:
        now_view = cycle.view(class_name, access, excluded=ahead)
        built_view = View(built, built.class_index[class_name], excluded=ahead)
        if required is None:
            nodes = _soonest_nodes(cycle, request, now_view, built_view)
            if nodes:
                return _protection(cycle, request, ROOT, nodes, None)
            continue
        candidates = sorted(
            (-now_view.domain_count(scope), scope)
            for scope, capacity in built_view.domain_counts(required).items()
            if capacity >= request.needed and not (ahead and ahead.intersection(cycle.state.nodes_of(scope)))
        )
        for _, scope in candidates:
            if place_within_scope(built_view, scope, request.demands, None) is not None:
                return _protection(cycle, request, scope, (), None)
    return None


def _claim_without_durations(cycle, request, ahead) -> Protection | None:
    """_protection_without_durations for a several-request claim. Its requests span several classes, so
    the free devices that rank the places are those of all its classes, and the claim planner, not one
    class's placement, says whether a place could hold it once everything there has ended: in a domain
    of its required level, the one with most free devices now; without one, the fewest nodes, most free
    now first, on which it could be planned."""
    built = cycle.empty_state()
    access = request.default_access
    now_views = [cycle.view(name, access, excluded=ahead) for name in request.classes]
    primary = built.class_index[request.classes[0]]
    levels = built.levels

    def plan_as_built(excluded, within=ROOT):
        views = {name: View(built, built.class_index[name], excluded=excluded) for name in request.classes}
        planner = claims.Planner(built, views, request.demands, cycle.selectors)
        return planner.place(None, None, primary, within)

    if request.required is not None:
        required = levels.index(request.required)
        built_views = [View(built, built.class_index[name], excluded=ahead) for name in request.classes]
        capacity: dict[tuple, int] = {}
        for view in built_views:
            for scope, count in view.domain_counts(required).items():
                capacity[scope] = capacity.get(scope, 0) + count
        candidates = sorted(
            (-sum(view.domain_count(scope) for view in now_views), scope)
            for scope, count in capacity.items()
            if count >= request.needed and not (ahead and ahead.intersection(cycle.state.nodes_of(scope)))
        )
        for _, scope in candidates:
            if plan_as_built(ahead, within=scope) is not None:
                return _protection(cycle, request, scope, (), None)
        return None
    every_node = range(len(built.node_names))
    ranked = sorted(
        (node for node in every_node if node not in ahead),
        key=lambda node: (-sum(view.node_count(node) for view in now_views), node),
    )
    everywhere = frozenset(every_node)

    def plan_on_first(count):
        return plan_as_built(everywhere.difference(ranked[:count]))

    plan = plan_on_first(len(ranked)) if ranked else None
    if plan is None:
        return None
    # The fewest of the ranked nodes that hold a plan, bisected: more nodes give the planner more room
    # (were its search to give up sooner with more, the plan kept is still one it found).
    low, high = 0, len(ranked)
    while high - low > 1:
        middle = (low + high) // 2
        found = plan_on_first(middle)
        if found is None:
            low = middle
        else:
            high, plan = middle, found
    return _protection(cycle, request, ROOT, {pod.node for pod in plan.pods}, None)


def _soonest_nodes(cycle, request, now_view: View, built_view: View) -> set[int]:
    """Without a required level: the nodes with most free devices now that together could hold it."""
    per_pod = max(demand.per_pod for demand in request.demands)
    pods_needed = sum(demand.min_count for demand in request.demands)
    ranked = sorted(
        (node for node in range(len(cycle.state.node_names)) if built_view.node_count(node) >= per_pod),
        key=lambda node: (-now_view.node_count(node), node),
    )
    chosen, pods = set(), 0
    for node in ranked:
        chosen.add(node)
        pods += built_view.node_count(node) // per_pod
        if pods >= pods_needed:
            return chosen
    return set()
