"""Workload-aware preemption: the preemptor is the whole gang, victims are whole workloads.

Who may be a victim (each victim carries the rule that allowed it):
- WithinQueue: a workload of the preemptor's own queue, when the queue's `within_queue` policy allows it
  (LowerPriority: strictly lower priority; LowerOrNewerEqualPriority: lower, or equal and started after
  the preemptor was submitted). A higher-priority workload is never preempted for a lower one.
- ReclaimWithinCohort: a workload of another queue in the same cohort tree that is borrowing above its
  nominal quota for that device class, when the preemptor's queue stays within its own nominal quota
  after admission (it reclaims what it lent), per `reclaim_within_cohort` (LowerPriority: strictly lower;
  Any: any priority up to the preemptor's own, so no higher-priority work is ever evicted for lower).
- ReservationReclaim: preemptible work of another team running on devices reserved for the preemptor's
  team (it borrowed them knowing this), whatever its priority.
Only workloads marked preemptible are ever victims, and they are evicted whole: a Pod-mode victim could
in principle lose single pods, but evicting the whole workload keeps a gang from limping on half its pods.

The victims must free room inside ONE domain of the preemptor's required level. The cheapest set wins:
fewest victims, then lowest total priority, then the most recently started, then ids. Sets are searched
exactly by increasing size (pruned by how many devices each can free) up to a budget, then greedily with
every unneeded victim dropped. Devices of workloads already being evicted count as free at no cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from broker.scheduler.capacity import ROOT
from broker.scheduler.placement import place_within_scope
from broker.scheduler.snapshot import RunningWorkload


@dataclass(frozen=True)
class Victim:
    workload: RunningWorkload
    rule: str

    def message(self, request) -> str:
        preemptor = request.workload
        reasons = {
            "WithinQueue": f"a priority {preemptor.priority} workload of the same queue needs the room",
            "ReclaimWithinCohort": (
                f"queue {self.workload.queue} is borrowing above its nominal quota and queue "
                f"{preemptor.queue} is reclaiming it"
            ),
            "ReservationReclaim": f"it runs on devices reserved for team {request.team}",
        }
        return f"preempted for {preemptor.id} ({self.rule}): {reasons[self.rule]}"


@dataclass(frozen=True)
class Found:
    victims: tuple[Victim, ...]
    evicting: tuple[str, ...]


def cost_key(victims) -> tuple:
    """Cheaper sets sort first: fewest, lowest total priority, most recently started, then ids."""
    return (
        len(victims),
        sum(victim.workload.priority for victim in victims),
        -sum(victim.workload.started for victim in victims),
        tuple(sorted(victim.workload.id for victim in victims)),
    )


def find_victims(cycle, request) -> Found | None:
    if not _may_preempt(cycle, request):
        return None
    memo_key = (
        request.classes, request.demands, request.required, request.preferred, request.queue.name,
        request.team, request.workload.priority, request.workload.submitted, request.preemptible,
    )  # fmt: skip
    failed = cycle.preemption_failed
    if memo_key in failed:
        return None
    for class_name in request.classes:
        found = _search_class(cycle, request, class_name)
        if found is not None:
            _claim(cycle, found)
            return found
    failed.add(memo_key)
    return None


def _may_preempt(cycle, request) -> bool:
    queue = request.queue
    return (
        queue.within_queue != "Never"
        or queue.reclaim_within_cohort != "Never"
        or request.team in cycle.reserved_teams
    )


def _claim(cycle, found: Found) -> None:
    cycle.chosen_victims.update(victim.workload.id for victim in found.victims)
    cycle.chosen_victims.update(found.evicting)


def eligible_victims(cycle, request, class_name: str) -> list[Victim]:
    """Running workloads the policy lets `request` preempt, with the rule that allows each."""
    chosen = cycle.chosen_victims
    victims = []
    for workload in sorted(cycle.snapshot.running, key=lambda workload: workload.id):
        if workload.evicting or not workload.preemptible or workload.id in chosen:
            continue
        rule = _rule(cycle, request, workload, class_name)
        if rule is not None:
            victims.append(Victim(workload, rule))
    return victims


def _rule(cycle, request, workload: RunningWorkload, class_name: str) -> str | None:
    preemptor = request.workload
    queue = request.queue
    if workload.queue == queue.name:
        policy = queue.within_queue
        lower = workload.priority < preemptor.priority
        newer_equal = workload.priority == preemptor.priority and workload.started > preemptor.submitted
        if policy == "LowerPriority" and lower:
            return "WithinQueue"
        if policy == "LowerOrNewerEqualPriority" and (lower or newer_equal):
            return "WithinQueue"
        return None
    if _holds_reserved_for(cycle, workload, request.team):
        return "ReservationReclaim"
    policy = queue.reclaim_within_cohort
    if policy == "Never" or not _same_cohort_tree(cycle, queue.name, workload.queue):
        return None
    if not cycle.quota.is_borrowing(workload.queue, workload.device_class):
        return None
    nominal = cycle.quota.nominal(queue.name, class_name)
    if nominal is not None and cycle.quota.usage(queue.name, class_name) + request.needed > nominal:
        return None
    if policy == "LowerPriority" and workload.priority < preemptor.priority:
        return "ReclaimWithinCohort"
    if policy == "Any" and workload.priority <= preemptor.priority:
        return "ReclaimWithinCohort"
    return None


def _holds_reserved_for(cycle, workload: RunningWorkload, team: str) -> bool:
    team_of_queue = {queue.name: queue.team for queue in cycle.snapshot.queues}
    if team_of_queue.get(workload.queue) == team:
        return False
    slots = cycle.state.slot_by_id
    return any(
        slots[device_id].owner == team
        for pod in workload.pods
        for device_id in pod.device_ids
        if device_id in slots
    )


def _same_cohort_tree(cycle, first: str, second: str) -> bool:
    roots = cycle.cohort_roots
    if roots is None:
        parents = {cohort.name: cohort.parent for cohort in cycle.snapshot.cohorts}
        roots = {}
        for queue in cycle.snapshot.queues:
            cohort = queue.cohort
            seen = set()
            while cohort is not None and parents.get(cohort) and cohort not in seen:
                seen.add(cohort)
                cohort = parents[cohort]
            roots[queue.name] = cohort
        cycle.cohort_roots = roots
    return roots.get(first) is not None and roots.get(first) == roots.get(second)


def _search_class(cycle, request, class_name: str) -> Found | None:
    access = request.access()
    class_index = cycle.state.class_index[class_name]
    level_index = cycle.state.levels.index(request.required) if request.required else None
    evicting = _by_scope(cycle, _evicting_slots(cycle, access), class_index, level_index)
    victims = eligible_victims(cycle, request, class_name)
    freed = {
        victim.workload.id: _by_scope(
            cycle, _freed_slots(cycle, victim.workload, access), class_index, level_index
        )
        for victim in victims
    }
    touched = sorted({scope for groups in list(freed.values()) + [evicting] for scope in groups})
    base_view = cycle.view(class_name, access)
    best = None
    for scope in touched:
        candidates = [victim for victim in victims if scope in freed[victim.workload.id]]
        gains = {victim.workload.id: len(freed[victim.workload.id][scope]) for victim in candidates}
        evicting_here = evicting.get(scope, [])
        room = base_view.domain_count(scope) + len(evicting_here) + sum(gains.values())
        if room < request.needed:
            continue
        search = _ScopeSearch(cycle, request, class_name, scope, evicting_here, freed)
        found = search.run(candidates, gains)
        if found is not None and (best is None or cost_key(found.victims) < cost_key(best.victims)):
            best = found
        if best is not None and not best.victims:
            break
    return best


def _by_scope(cycle, slots, class_index: int, level_index: int | None) -> dict[tuple, list]:
    groups: dict[tuple, list] = {}
    for rank, slot in slots:
        if class_index in slot.classes:
            scope = ROOT if level_index is None else cycle.state.domain_of(slot.node, level_index)
            groups.setdefault(scope, []).append((rank, slot))
    return groups


def _evicting_slots(cycle, access) -> list:
    evicting = {
        workload.id
        for workload in cycle.snapshot.running
        if workload.evicting and workload.id not in cycle.chosen_victims
    }
    slots = []
    for slot in cycle.state.slots:
        if slot.holder in evicting:
            rank = access.rank(slot)
            if rank is not None:
                slots.append((rank, slot))
    return slots


def _freed_slots(cycle, workload: RunningWorkload, access) -> list:
    slots = []
    for pod in workload.pods:
        for device_id in pod.device_ids:
            slot = cycle.state.slot_by_id.get(device_id)
            if slot is not None and slot.holder == workload.id:
                rank = access.rank(slot)
                if rank is not None:
                    slots.append((rank, slot))
    return slots


class _ScopeSearch:
    """The cheapest victim set that makes the request fit inside one scope."""

    def __init__(self, cycle, request, class_name, scope, evicting_here, freed):
        self.cycle = cycle
        self.request = request
        self.class_name = class_name
        self.scope = scope
        self.evicting_here = evicting_here
        self.freed = freed
        self.checks = 0
        self.preferred = cycle.state.levels.index(request.preferred) if request.preferred else None
        evicting_ids = {slot.holder for _, slot in evicting_here}
        self.evicting_workloads = [cycle.running[workload_id] for workload_id in sorted(evicting_ids)]

    def run(self, candidates, gains) -> Found | None:
        evicting = _evicting_ids(self.evicting_here)
        if self.feasible(()):
            return Found((), evicting) if evicting else None
        view = self.cycle.view(self.class_name, self.request.access())
        deficit = self.request.needed - view.domain_count(self.scope) - len(self.evicting_here)
        budget = self.cycle.config.preemption_search_limit
        chosen = _cheapest_feasible(candidates, gains, deficit, self.feasible, budget)
        if chosen is None:
            return None
        return Found(tuple(sorted(chosen, key=lambda victim: victim.workload.id)), evicting)

    def feasible(self, chosen) -> bool:
        self.checks += 1
        released: dict[str, int] = {}
        for workload in [victim.workload for victim in chosen] + self.evicting_workloads:
            if workload.device_class == self.class_name:
                released[workload.queue] = released.get(workload.queue, 0) + workload.device_count
        quota = self.cycle.quota.check(
            self.request.queue.name, self.class_name, self.request.needed, released
        )
        if not quota.fits:
            return False
        more = list(self.evicting_here)
        for victim in chosen:
            more.extend(self.freed[victim.workload.id][self.scope])
        view = self.cycle.view(self.class_name, self.request.access(), more=more)
        return place_within_scope(view, self.scope, self.request.demands, self.preferred) is not None


def _evicting_ids(slots) -> tuple[str, ...]:
    return tuple(sorted({slot.holder for _, slot in slots}))


def _cheapest_feasible(candidates, gains, deficit, feasible, budget):
    """Exact search by increasing set size while within `budget` feasibility checks, else greedy.
    Sets that cannot free `deficit` devices are skipped without a check."""
    ordered = sorted(candidates, key=lambda victim: cost_key((victim,)))
    by_gain = sorted((gains[victim.workload.id] for victim in ordered), reverse=True)
    checks = 0
    for size in range(1, len(ordered) + 1):
        if sum(by_gain[:size]) < deficit:
            continue
        best = None
        for chosen in combinations(ordered, size):
            if best is not None and cost_key(chosen) >= cost_key(best):
                continue
            if sum(gains[victim.workload.id] for victim in chosen) < deficit:
                continue
            checks += 1
            if checks > budget:
                return _greedy(ordered, gains, deficit, feasible)
            if feasible(chosen):
                best = chosen
        if best is not None:
            return best
    return None


def _greedy(ordered, gains, deficit, feasible):
    chosen = []
    gained = 0
    for victim in ordered:
        chosen.append(victim)
        gained += gains[victim.workload.id]
        if gained >= deficit and feasible(tuple(chosen)):
            break
    else:
        return None
    # Minimality: drop every victim the others can do without, the most expensive first.
    for victim in sorted(chosen, key=lambda victim: cost_key((victim,)), reverse=True):
        trial = tuple(other for other in chosen if other is not victim)
        if sum(gains[other.workload.id] for other in trial) >= deficit and feasible(trial):
            chosen = list(trial)
    return tuple(chosen)
