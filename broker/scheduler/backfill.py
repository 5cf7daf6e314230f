"""Head-of-line protection (Slurm-style backfill) so small work cannot starve a large gang.

When the first workload in cluster order that is blocked only by capacity (the head) cannot start, its
earliest start is planned from the expected ends of running work (and of work admitted this cycle with
a known duration): at each release time, is there a placement? The first one found fixes a start time
and a domain (the required-level domain, or the plan's nodes without a required level). Later work may
still start if it stays off that domain, or if its own expected duration ends before the planned start.

Without enough known durations the start cannot be planned; once the head has waited
`backfill_wait_seconds`, the domain it could use soonest (the one with most free devices among those
that can hold it at all) is kept free anyway, with no start time. Only one head is protected per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.scheduler.capacity import ROOT, View
from broker.scheduler.placement import place_gang, place_within_scope


@dataclass(frozen=True)
class Protection:
    workload_id: str
    priority: int
    nodes: frozenset
    scope: tuple
    level: str | None
    planned_start: float | None

    def excluded_for(self, request, now: float) -> frozenset:
        duration = request.workload.expected_duration
        if self.planned_start is not None and duration is not None and now + duration <= self.planned_start:
            return frozenset()
        return self.nodes

    def describe(self, state) -> str:
        if self.scope != ROOT and self.level:
            where = f"{self.level} {self.scope[-1]}"
        else:
            names = sorted(state.node_names[node] for node in self.nodes)
            where = "nodes " + ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        head = f"{where} is held for {self.workload_id} (priority {self.priority}, ahead in line)"
        if self.planned_start is None:
            return f"{head}; it has waited too long and durations are unknown, so no start is planned"
        return f"{head}, planned to start at {self.planned_start:g}"


def release_timeline(cycle) -> list[tuple[float, str]]:
    """(expected end, workload id) of everything holding devices whose end is known, earliest first.

    Asked by backfill during the cycle and by estimates after it. Chosen victims and admissions only
    grow during a cycle, so the parts already built are kept (on the cycle) and only the new admissions
    are added; (end, id) pairs are unique, so the sorted list is the same however it was assembled."""
    now = cycle.snapshot.now
    cache = cycle.__dict__.setdefault("_release_timeline", {})
    victims = len(cycle.chosen_victims)
    if cache.get("victims") != victims:
        running = []
        for workload in cycle.snapshot.running:
            if workload.evicting or workload.id in cycle.chosen_victims:
                running.append((now, workload.id))
            elif workload.expected_end is not None:
                running.append((max(now, workload.expected_end), workload.id))
        running.sort()
        cache["victims"], cache["running"] = victims, running
    admitted_ids = list(cycle.log.admitted)
    admitted = cache.setdefault("admitted", [])
    for workload_id in admitted_ids[cache.get("seen", 0) :]:
        duration = cycle.requests[workload_id].workload.expected_duration
        if duration is not None:
            admitted.append((now + duration, workload_id))
    cache["seen"] = len(admitted_ids)
    admitted.sort()
    events = cache["running"] + admitted
    events.sort()
    return events


def held_slots(cycle, workload_id: str, access) -> list:
    slots = []
    for slot in cycle.slots_held_by(workload_id):
        rank = access.rank(slot)
        if rank is not None:
            slots.append((rank, slot))
    return slots


def plan_protection(cycle, request) -> Protection | None:
    levels = cycle.state.levels
    required = levels.index(request.required) if request.required else None
    preferred = levels.index(request.preferred) if request.preferred else None
    access = request.default_access
    classes = cycle.entitled_classes(request)
    released: list = []
    events = release_timeline(cycle)[: cycle.config.estimate_horizon_events]
    # One view per class, extended with each release (not rebuilt with everything released so far).
    views = {name: cycle.view(name, access) for name in classes}
    extended = dict.fromkeys(classes, 0)
    free_now = max((view.total() for view in views.values()), default=0)
    for position, (end, workload_id) in enumerate(events):
        released.extend(held_slots(cycle, workload_id, access))
        if position + 1 < len(events) and events[position + 1][0] == end:
            continue
        if free_now + len(released) < request.needed:
            continue  # not even the total is there yet: no placement to try
        for class_name in classes:
            view = views[class_name]
            view.extend(released[extended[class_name] :])
            extended[class_name] = len(released)
            plan = place_gang(view, request.demands, required, preferred)
            if plan is not None:
                return _protection(cycle, request, plan.scope, {pod.node for pod in plan.pods}, end)
    if cycle.snapshot.now - request.workload.submitted < cycle.config.backfill_wait_seconds:
        return None
    return _protection_without_durations(cycle, request, classes, required)


def _protection(cycle, request, scope, plan_nodes, start) -> Protection:
    nodes = frozenset(cycle.state.nodes_of(scope)) if scope != ROOT else frozenset(plan_nodes)
    return Protection(request.id, request.workload.priority, nodes, scope, request.required, start)


def _protection_without_durations(cycle, request, classes, required) -> Protection | None:
    """Keep free the domain the head could use soonest: the most free devices now among domains that
    could hold it once everything there has ended (the cluster as built)."""
    built = cycle.empty_state()
    access = request.default_access
    for class_name in classes:
        now_view = cycle.view(class_name, access)
        built_view = View(built, built.class_index[class_name])
        if required is None:
            nodes = _soonest_nodes(cycle, request, now_view, built_view)
            if nodes:
                return _protection(cycle, request, ROOT, nodes, None)
            continue
        candidates = sorted(
            (-now_view.domain_count(scope), scope)
            for scope, capacity in built_view.domain_counts(required).items()
            if capacity >= request.needed
        )
        for _, scope in candidates:
            if place_within_scope(built_view, scope, request.demands, None) is not None:
                return _protection(cycle, request, scope, (), None)
    return None


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
