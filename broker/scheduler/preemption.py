"""Workload-aware preemption: the preemptor is the whole gang, victims are whole workloads.

Who may be a victim (each victim carries the rule that allowed it):
- WithinQueue: a workload of the preemptor's own queue, when the queue's `within_queue` policy allows it
  (LowerPriority: strictly lower priority; LowerOrNewerEqualPriority: lower, or equal and started after
  the preemptor was submitted). A higher-priority workload is never preempted for a lower one.
- ReclaimWithinCohort: a workload of another queue in the same cohort tree that is borrowing above its
  nominal quota for that device class, when the preemptor's queue stays within its own nominal quota
  after admission (it reclaims what it lent), per `reclaim_within_cohort` (LowerPriority: strictly lower;
  Any: whatever its priority, as Kueue's reclaimWithinCohort Any: lent quota is the lender's to take
  back). Borrowers above the preemptor's priority are searched only when no set of the others, in any
  device class, makes room: reclaiming evicts higher-priority work only when nothing else would do.
- ReservationReclaim: preemptible work of another team running on devices reserved for the preemptor's
  team (it borrowed them knowing this), whatever its priority.
- ClassPriority: when the preemptor's resource class `preempts_across_queues`, preemptible work of strictly
  lower priority in the other queues of its cohort tree (the menu lets short, interactive work displace
  batch work whoever runs it).
- ShorterRemaining: with `shorter_remaining_factor` set, preemptible work of the preemptor's own priority in
  its cohort tree whose expected remaining device-time is at least that many times the preemptor's expected
  device-time (preemptive shortest-remaining-first among equals).
Only workloads marked preemptible are ever victims, and none that is protected from thrashing: one that
started less than `preemption_min_runtime_seconds` ago, or was already preempted
`max_preemptions_per_workload` times. A PodGroup-mode victim is evicted whole. A Pod-mode
victim with pods above its gang minimum (`RunningWorkload.surplus_pods`) is first offered shrunk: a
search among such surplus pods alone comes first, and only when shrinking cannot make room are workloads
evicted whole; a gang never drops below its minimum while it runs.

A gang whose pods claim several requests (claims.Planner), that owns group claims
(group_claims.GroupPlacer), or whose pods take time-slices of shared devices (sharing.place_shared) is
searched apart (`find_claim_victims`): the same rules, in every class it names, and the shortest
cheapest-first run of victims that lets it be placed, less those it can do without.

Device classes are tried in fallback order; the first class some victim set works for decides (as Kueue
tries flavors in order). The victims must free room inside ONE domain of the preemptor's required level,
and off the nodes the preemptor may not take (`Cycle.excluded_for`: those held for protected gangs whose
planned start it would delay, those of reservation windows it would overrun), as an admission must.
The cheapest set wins (issue 27, as Kubernetes' workload-aware preemption and Kueue take the lowest
priority first): the lowest priorities (sets compared by their victims' priorities, highest first, so
two priority-1 jobs go before one priority-250 gang), then pods before whole PodGroups, then the fewest
and smallest victims (devices), then the most recently started, then ids. Sets are searched best-first
in that order (each set reached from a cheaper one, pruned by how many devices the candidates left can
free) up to a budget, then greedily lowest priority first with every unneeded victim dropped. Devices of
workloads already being evicted count as free at no cost.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from heapq import heappop, heappush
from operator import attrgetter

from broker.scheduler.capacity import COUNTERS, PLAIN, RANK_PLAIN, ROOT
from broker.scheduler.group_claims import GroupPlacer
from broker.scheduler.placement import place_within_scope
from broker.scheduler.quota import EPSILON, request_charges
from broker.scheduler.snapshot import NEVER_PREEMPT, RunningWorkload, label, leaving_id, span


@dataclass(frozen=True)
class Victim:
    workload: RunningWorkload
    rule: str

    def message(self, request, now: float = 0.0, factor: float = 0.0) -> str:
        preemptor = request.workload
        what = "preempted"
        if self.workload.partial:
            count = len(self.workload.pods)
            what = f"{count} of its pods preempted" if count != 1 else "1 of its pods preempted"
        return f"{what} for {label(preemptor)} ({self.rule}): {self._reason(request, now, factor)}"

    def _reason(self, request, now: float, factor: float) -> str:
        preemptor, victim = request.workload, self.workload
        if self.rule == "WithinQueue":
            return f"a priority {preemptor.priority} workload of the same queue needs the room"
        if self.rule == "ReclaimWithinCohort":
            return (
                f"queue {victim.queue} is borrowing above its nominal quota and queue {preemptor.queue} is "
                "reclaiming it"
            )
        if self.rule == "ReservationReclaim":
            return f"it runs on devices reserved for team {request.team}"
        if self.rule == "ShorterRemaining":
            return (
                f"it expects to hold its devices for {span(victim.expected_end - now)} more, at least "
                f"{factor:g} times what {label(preemptor)} needs in all, at the same priority"
            )
        class_name = request.resource_class.name if request.resource_class else "its"
        return (
            f"{class_name} work of priority {preemptor.priority} may preempt preemptible work of lower priority "
            "in any queue of the cohort"
        )


@dataclass(frozen=True)
class Found:
    victims: tuple[Victim, ...]
    evicting: tuple[str, ...]
    scope: tuple = ROOT  # the domain the victims make room in


def cost_key(victims) -> tuple:
    """Cheaper sets sort first: their priorities highest first (a set whose highest priority is lower
    wins; of equal ones the set with fewer at it, ...), then fewer whole PodGroups (shrinking a Pod-mode
    workload stops nobody), then fewer victims, fewer devices, the most recently started, then ids.
    Adding a victim to a set always makes it dearer, and so does replacing one by a dearer one
    (`_cost_order`): the best-first search relies on both."""
    return (
        tuple(sorted((victim.workload.priority for victim in victims), reverse=True)),
        sum(not victim.workload.partial for victim in victims),
        len(victims),
        sum(victim.workload.device_count for victim in victims),
        -sum(victim.workload.started for victim in victims),
        tuple(sorted(victim.workload.id for victim in victims)),
    )


def _cost_order(workload: RunningWorkload) -> tuple:
    """One victim's place in `cost_key` order (the key of the set of it alone)."""
    return (workload.priority, not workload.partial, workload.device_count, -workload.started, workload.id)


def find_victims(cycle, request) -> Found | None:
    if not _may_preempt(cycle, request):
        return None
    if cycle.preemptions_by_queue.get(request.queue.name, 0) >= cycle.config.preemptions_per_queue_per_cycle:
        return _waiting_for_evictions_only(cycle, request)
    newer_counts = request.queue.within_queue == "LowerOrNewerEqualPriority"
    excluded = cycle.excluded_for(request)
    memo_key = (
        request.classes, request.demands, request.required, request.preferred, request.queue.name,
        request.team, request.workload.priority, request.preemptible,
        request.workload.submitted if newer_counts else None, excluded,
        # ShorterRemaining's victims depend on how long the preemptor runs: a shorter one may find some.
        request.workload.expected_duration if cycle.config.shorter_remaining_factor else None,
    )  # fmt: skip
    if memo_key in cycle.preemption_failed:
        return None
    priorities = (False, True) if _reclaims_above_own_priority(cycle, request) else (False,)
    # Shrinking Pod-mode work to its gang minimum stops nobody: tried first, at each priority tier.
    shrinking = (True, False) if _index(cycle).shrunk else (False,)
    for any_priority in priorities:
        for shrink in shrinking:
            for class_name in request.classes:
                found = _search_class(
                    cycle, request, class_name, any_priority=any_priority, shrink=shrink, excluded=excluded
                )
                if found is not None:
                    _claim(cycle, found)
                    if found.victims:
                        queue = request.queue.name
                        cycle.preemptions_by_queue[queue] = cycle.preemptions_by_queue.get(queue, 0) + 1
                    return found
    cycle.preemption_failed.add(memo_key)
    return None


def find_claim_victims(cycle, request) -> Found | None:
    """Victims for a gang whose pods claim several requests (GPUs beside a NIC, claims.Planner places
    it), that owns group claims (group_claims.GroupPlacer) or takes time-slices of shared devices
    (sharing.place_shared, on a ledger without the victims). Who may be a victim is decided
    as for whole devices, in each class the gang names. Which victims: the shortest prefix of them in
    cost order (`_cost_order`, cheapest first) that lets the gang be placed within the quota of every
    class it is charged to, found by doubling, then bisection (freeing more never takes a place away), then
    less every victim the others can do without, dearest first.
    Devices being evicted for it, or for nobody, count as free at no cost."""
    if not _may_preempt(cycle, request):
        return None
    queue = request.queue.name
    excluded = cycle.excluded_for(request)
    access = request.default_access
    evicting = _evicting_slots(cycle, access, request.id)
    if excluded and evicting:
        evicting = [entry for entry in evicting if entry[1].node not in excluded]
    search = _ClaimSearch(cycle, request, excluded, evicting)
    if evicting and search.feasible(()):
        found = Found((), _evicting_ids(evicting))
        _claim(cycle, found)
        return found
    if cycle.preemptions_by_queue.get(queue, 0) >= cycle.config.preemptions_per_queue_per_cycle:
        return None
    newer_counts = request.queue.within_queue == "LowerOrNewerEqualPriority"
    memo_key = (
        "claim", request.classes, request.demands, request.required, request.preferred, queue, request.team,
        tuple(sorted(request.shared_amounts.items())) if request.shared_amounts else None,
        request.workload.priority, request.preemptible, request.workload.submitted if newer_counts else None,
        excluded, request.workload.expected_duration if cycle.config.shorter_remaining_factor else None,
    )  # fmt: skip
    if memo_key in cycle.preemption_failed:
        return None
    candidates: dict[str, Victim] = {}
    for class_name in request.classes:
        for workload_id, (workload, rule) in _eligible(cycle, request, class_name).by_id.items():
            candidates.setdefault(workload_id, Victim(workload, rule))
    ordered = sorted(candidates.values(), key=lambda victim: _cost_order(victim.workload))
    chosen = search.fewest(ordered)
    if chosen is None:
        cycle.preemption_failed.add(memo_key)
        return None
    found = Found(tuple(sorted(chosen, key=lambda victim: victim.workload.id)), _evicting_ids(evicting))
    _claim(cycle, found)
    cycle.preemptions_by_queue[queue] = cycle.preemptions_by_queue.get(queue, 0) + 1
    return found


class _ClaimSearch:
    """Whether a gang with claims fits once some victims are gone: their devices (and the devices their
    counters free) are added to each class's view, their quota usage is given back."""

    def __init__(self, cycle, request, excluded, evicting):
        self.cycle = cycle
        self.request = request
        self.excluded = excluded
        self.evicting = evicting
        evicting_ids = {slot.holder for _, slot in evicting}
        self.evicting_workloads = [cycle.running[workload_id] for workload_id in sorted(evicting_ids)]
        self.freed: dict[str, list] = {}
        self.checks = 0
        self.used: set[str] = set()  # the devices of the last plan that fitted

    def fewest(self, ordered: list[Victim]) -> list[Victim] | None:
        # Prefixes of 1, 2, 4, ... victims first: most preemptors need a few of thousands of candidates,
        # and a check's cost grows with the devices its victims free.
        low, size = 0, 1  # a prefix of `low` victims does not fit
        while True:
            if size > len(ordered):
                if low == len(ordered) or not self.feasible(ordered):
                    return None
                high = len(ordered)
                break
            if self.feasible(ordered[:size]):
                high = size
                break
            low, size = size, size * 2
        while high - low > 1:  # a prefix of `high` victims fits, one of `low` does not
            middle = (low + high) // 2
            if self.feasible(ordered[:middle]):
                high = middle
            else:
                low = middle
        chosen = list(ordered[:high])
        # The cheapest prefix frees devices all over the cluster: keep first the victims whose devices
        # the plan takes, if that alone fits (counters or quota may need others), then drop one by one.
        self.feasible(chosen)
        taken = [victim for victim in chosen if self.used.intersection(_device_ids(victim.workload))]
        if taken and len(taken) < len(chosen) and self.feasible(taken):
            chosen = taken
        budget = self.cycle.config.preemption_search_limit
        for victim in sorted(chosen, key=lambda victim: cost_key((victim,)), reverse=True):
            if self.checks >= budget:
                break
            trial = [other for other in chosen if other is not victim]
            if trial and self.feasible(trial):
                chosen = trial
        return chosen

    def feasible(self, chosen) -> bool:
        self.checks += 1
        cycle = self.cycle
        leaving = [victim.workload for victim in chosen] + self.evicting_workloads
        freed = list(self.evicting)
        for victim in chosen:
            freed.extend(self._freed(victim.workload))
        credit = _counters_given_back(cycle, leaving) if cycle.state.counted else None
        for charges, device_ids in self._plans(freed, credit, leaving):
            if self._within_quota(charges, leaving):
                self.used = device_ids
                return True
        return False

    def _plans(self, freed, credit, leaving):
        """(charges {device class: amount}, device ids) of each plan the request would have with `freed` devices
        free too, and the workloads `leaving` gone: one for a several-request claim, one per class tried
        for a gang with group claims (its claims' devices count with its pods' against the class it is
        admitted with, as admitted) or for a time-sliced request (its shares, on a ledger without them)."""
        cycle, request = self.cycle, self.request
        access = request.default_access
        if request.shared_amounts is not None:
            consumed = tuple(sorted(request.shared_amounts.items()))
            for class_name in request.classes:
                plan = cycle.shared_plan(request, class_name, access, self.excluded, leaving)
                if plan is not None:
                    slots = [slot.id for pod in plan.pods for slot in pod.slots]
                    yield {class_name: cycle.consumption.of_devices(slots, consumed)}, set(slots)
            return
        if request.workload.group_claims:
            placer = GroupPlacer(cycle, request, access, self.excluded, freed, credit)
            for class_name in request.classes[:1] if request.claimed else request.classes:
                plan = placer.place(class_name)
                if plan is not None:
                    admitted_as = plan.pods[0].requests[0][1] if request.claimed else class_name
                    taken = {slot.id for pod in plan.pods for slot in pod.slots}
                    taken.update(slot.id for _, slots in plan.group for slot in slots)
                    yield {admitted_as: sum(len(pod.slots) for pod in plan.pods) + plan.group_count()}, taken
            return
        plan = cycle.claim_plan(request, access, self.excluded, freed, credit)
        if plan is not None:
            taken = {slot.id for pod in plan.pods for slot in pod.slots}
            yield request_charges(plan.pods, cycle.consumption, plan.pods[0].requests[0][1]), taken

    def _within_quota(self, charges, leaving) -> bool:
        cycle = self.cycle
        consumption = cycle.consumption
        for device_class, amount in charges.items():
            released: dict[str, float] = {}
            for workload in leaving:
                given = consumption.of_running(workload).get(device_class, 0)
                if given:
                    released[workload.queue] = released.get(workload.queue, 0) + given
            check = cycle.quota.check(self.request.queue.name, device_class, amount, released)
            if check.available is not None and amount > check.available + EPSILON:
                return False
        return True

    def _freed(self, workload: RunningWorkload) -> list:
        freed = self.freed.get(workload.id)
        if freed is None:
            freed = _freed_slots(self.cycle, workload, self.request.default_access)
            if self.excluded:
                freed = [entry for entry in freed if entry[1].node not in self.excluded]
            self.freed[workload.id] = freed
        return freed


def _reclaims_above_own_priority(cycle, request) -> bool:
    """Whether `reclaim_within_cohort: Any` gives `request` borrowers above its own priority to consider
    (the second tier of find_victims; without them it would repeat the first search). A run is in
    victim order, lowest priority first: its last workload says whether any is above."""
    if request.queue.reclaim_within_cohort != "Any":
        return False
    if not any(_within_nominal_after(cycle, request, name) for name in request.classes):
        return False  # it may reclaim nothing at all
    priority = request.workload.priority
    return any(run.workloads[-1].priority > priority for run in _cohort_reclaim_runs(cycle, _index(cycle), request))


def _may_preempt(cycle, request) -> bool:
    if request.workload.preemption_policy == NEVER_PREEMPT:
        return False
    queue = request.queue
    return (
        queue.within_queue != "Never"
        or queue.reclaim_within_cohort != "Never"
        or request.team in cycle.reserved_teams
        or _preempts_across_queues(request)
        or _shorter_remaining_bar(cycle, request) is not None
    )


def _shorter_remaining_bar(cycle, request) -> float | None:
    """The remaining device-seconds a victim must expect at least for ShorterRemaining, None when the rule
    is off or the preemptor's own duration is unknown."""
    factor = cycle.config.shorter_remaining_factor
    duration = request.workload.expected_duration
    if not factor or not duration:
        return None
    return factor * duration * request.needed


def _preempts_across_queues(request) -> bool:
    return request.resource_class is not None and request.resource_class.preempts_across_queues


def protection(config, now):
    """A test for running work that no rule may preempt at `now` (it started too recently, or was
    preempted too often already), or None when the config protects nothing."""
    least = config.preemption_min_runtime_seconds
    most = config.max_preemptions_per_workload
    if least <= 0 and most is None:
        return None

    def protected(workload: RunningWorkload) -> bool:
        return (least > 0 and now - workload.started < least) or (most is not None and workload.preemptions >= most)

    return protected


def _claim(cycle, found: Found) -> None:
    cycle.chosen_victims.update(victim.workload.id for victim in found.victims)
    for victim in found.victims:
        if victim.workload.partial:
            cycle.leaving[leaving_id(victim.workload.id)] = victim.workload
    cycle.chosen_victims.update(found.evicting)


def _waiting_for_evictions_only(cycle, request) -> Found | None:
    """Once its queue has preempted this cycle, a workload may still wait for evictions under way."""
    if not _index(cycle).evicting_slots:
        return None
    excluded = cycle.excluded_for(request)
    for class_name in request.classes:
        found = _search_class(cycle, request, class_name, with_victims=False, excluded=excluded)
        if found is not None:
            _claim(cycle, found)
            return found
    return None


class PriorityRun:
    """Workloads in victim order (priority, then most recently started, then id), so that those a
    preemptor's priority lets it evict are a prefix found by bisection rather than a scan (on the
    workloads' own attributes: no list of keys is built for a run that may be searched once)."""

    def __init__(self, ordered: list[RunningWorkload]):
        """`ordered`: workloads already in victim order (`_victim_order`)."""
        self.workloads = ordered

    def below(self, priority) -> list[RunningWorkload]:
        """Those of lower priority."""
        return self.workloads[: bisect_left(self.workloads, priority, key=_priority)]

    def equal(self, priority) -> list[RunningWorkload]:
        """Those of exactly this priority."""
        start = bisect_left(self.workloads, priority, key=_priority)
        return self.workloads[start : bisect_right(self.workloads, priority, start, key=_priority)]

    def up_to(self, priority) -> list[RunningWorkload]:
        """Those of lower or equal priority."""
        return self.workloads[: bisect_right(self.workloads, priority, key=_priority)]

    def below_or_newer_equal(self, priority, since) -> list[RunningWorkload]:
        """Those of lower priority, and those of equal priority started after `since` (within equal
        priority the most recently started come first, so they end the prefix)."""
        workloads = self.workloads
        equal_start = bisect_left(workloads, priority, key=_priority)
        equal_end = bisect_right(workloads, priority, equal_start, key=_priority)
        return workloads[: bisect_left(workloads, -since, equal_start, equal_end, key=_negated_start)]


_priority = attrgetter("priority")


def _negated_start(workload: RunningWorkload) -> float:
    return -workload.started


def _victim_order(workload: RunningWorkload) -> tuple:
    return (workload.priority, -workload.started, workload.id)


def _in_victim_order(workloads: list[RunningWorkload]) -> list[RunningWorkload]:
    """`sorted(workloads, key=_victim_order)` as three stable sorts, least significant key first, on
    attribute getters (no key tuple built per workload: this orders all of a queue's running work)."""
    workloads = sorted(workloads, key=attrgetter("id"))
    workloads.sort(key=attrgetter("started"), reverse=True)  # reverse keeps equal ones in order
    workloads.sort(key=attrgetter("priority"))
    return workloads


class VictimIndex:
    """Running work arranged for victim searches, made once per cycle. A queue's work is put in victim
    order only when a search first asks for it: many cycles search few queues, or none of their classes."""

    def __init__(self, cycle):
        self.candidates: dict[str, list[RunningWorkload]] = {}  # by queue, in snapshot order
        self.shrunk: dict[str, RunningWorkload] = {}  # by id: Pod-mode candidates' surplus pods alone
        evicting = set()
        # An evicting workload's devices are for the workload it is evicted for while that one waits.
        self.evicted_for: dict[str, str] = {}
        protected = protection(cycle.config, cycle.snapshot.now)
        for workload in cycle.snapshot.running:
            if workload.evicting:
                evicting.add(workload.id)
                if workload.evicted_for in cycle.requests:
                    self.evicted_for[workload.id] = workload.evicted_for
            elif workload.preemptible and (protected is None or not protected(workload)):
                self.candidates.setdefault(workload.queue, []).append(workload)
                if workload.disruption == "Pod" and workload.min_counts:
                    surplus = workload.surplus_pods
                    if surplus:
                        self.shrunk[workload.id] = replace(workload, pods=surplus, partial=True)
        self.queues = sorted(self.candidates)
        self._own: dict[str, PriorityRun] = {}
        self._by_class: dict[str, dict[str, PriorityRun]] = {}
        team_of_queue = {queue.name: queue.team for queue in cycle.snapshot.queues}
        self.on_reserved: dict[str, set[str]] = {}
        for slot in cycle.state.extras:  # reserved devices are never plain: the extras hold all of them
            if slot.owner is None or not slot.holder:
                continue
            holder = cycle.running.get(slot.holder)
            if holder is not None and protected is not None and protected(holder):
                continue
            if holder is not None and team_of_queue.get(holder.queue) != slot.owner:
                self.on_reserved.setdefault(slot.owner, set()).add(holder.id)
        self.evicting_slots = [slot for slot in cycle.state.slots if slot.holder in evicting] if evicting else []
        self.nominees = set(self.evicted_for.values())
        self.evicting_for: dict[tuple, list] = {}  # `_evicting_slots` by (access key, nominee, claimed)
        self.cohort_root = _cohort_roots(cycle.snapshot)
        self.freed: dict[tuple, dict[str, dict[tuple, list]]] = {}  # freed key -> workload id -> by scope
        self.running_by_class: dict[str, dict[str, list[RunningWorkload]]] = {}  # for lent_out, by queue
        self.holders: dict[tuple, tuple[str, ...]] = {}  # (queue, class) -> `_holders_by_priority`

    def own(self, queue: str) -> PriorityRun | None:
        """The queue's preemptible work, not evicting, in victim order."""
        run = self._own.get(queue)
        if run is None and queue in self.candidates:
            run = self._own[queue] = PriorityRun(_in_victim_order(self.candidates[queue]))
        return run

    def by_class(self, queue: str) -> dict[str, PriorityRun]:
        """The same per device class, by class name: cohort reclaim takes a borrower's work only of the
        classes it borrows above nominal, so whole classes are skipped without looking at their work."""
        runs = self._by_class.get(queue)
        if runs is None:
            by_class: dict[str, list[RunningWorkload]] = {}
            for workload in self.own(queue).workloads:  # taken in order: each class's list stays ordered
                by_class.setdefault(workload.device_class, []).append(workload)
            runs = self._by_class[queue] = {name: PriorityRun(by_class[name]) for name in sorted(by_class)}
        return runs


def _index(cycle) -> VictimIndex:
    if cycle.victim_index is None:
        cycle.victim_index = VictimIndex(cycle)
    return cycle.victim_index


def eligible_victims(cycle, request, class_name: str, any_priority: bool = False, shrink: bool = False) -> list[Victim]:
    """Running workloads the policy lets `request` preempt, with the rule that allows each, by id.
    `any_priority`: find_victims' second tier, cohort borrowers above the preemptor's priority too (Any).
    `shrink`: only the Pod-mode ones that can lose pods, as records of those surplus pods."""
    eligible = _eligible(cycle, request, class_name, any_priority, shrink)
    return [Victim(*eligible.by_id[workload_id]) for workload_id in sorted(eligible.by_id)]


class _Eligible:
    """`eligible_victims` before any Victim is made: the preemptor's own queue's (WithinQueue) as its
    run gives them, in victim order, chosen ones skipped as they are read, and the others by id. A
    search that settles early reads few."""

    def __init__(self, own: list[RunningWorkload], chosen: set[str], others: dict[str, tuple[RunningWorkload, str]]):
        self.own = own
        self.chosen = chosen
        self.others = others

    def __bool__(self) -> bool:
        return bool(self.others) or any(workload.id not in self.chosen for workload in self.own)

    def own_unchosen(self):
        chosen = self.chosen
        return (workload for workload in self.own if workload.id not in chosen) if chosen else iter(self.own)

    def workloads(self):
        yield from self.own_unchosen()
        for workload, _ in self.others.values():
            yield workload

    def in_victim_order(self):
        if not self.others:
            return self.own_unchosen()
        return _in_victim_order(self.workloads())  # ids are distinct: the same order, without key tuples

    def victim(self, workload: RunningWorkload) -> Victim:
        other = self.others.get(workload.id)
        return Victim(workload, "WithinQueue") if other is None else Victim(*other)

    @property
    def by_id(self) -> dict[str, tuple[RunningWorkload, str]]:
        found = {workload.id: (workload, "WithinQueue") for workload in self.own_unchosen()}
        found.update(self.others)
        return found


def _eligible(cycle, request, class_name: str, any_priority: bool = False, shrink: bool = False) -> _Eligible:
    index = _index(cycle)
    chosen = cycle.chosen_victims
    queue = request.queue
    own: list[RunningWorkload] = []
    run = index.own(queue.name)
    if run is not None:
        own = _within_queue_candidates(run, queue.within_queue, request.workload)
    others: dict[str, tuple[RunningWorkload, str]] = {}
    reserved = index.on_reserved.get(request.team)
    if reserved:
        own_ids = {workload.id for workload in own}  # chosen ones among them are skipped anyway
        for workload_id in sorted(reserved):
            if workload_id not in chosen and workload_id not in own_ids:
                others[workload_id] = (cycle.running[workload_id], "ReservationReclaim")
    if queue.reclaim_within_cohort != "Never" and _within_nominal_after(cycle, request, class_name):
        for workload in _cohort_reclaim_candidates(cycle, index, request, any_priority):  # none is own
            if workload.id not in chosen and workload.id not in others:
                others[workload.id] = (workload, "ReclaimWithinCohort")
    if _preempts_across_queues(request):
        for workload in _cohort_work(index, request, PriorityRun.below, own_queue=False):
            if workload.id not in chosen and workload.id not in others:
                others[workload.id] = (workload, "ClassPriority")
    bar = _shorter_remaining_bar(cycle, request)
    if bar is not None:
        own_ids = {workload.id for workload in own}
        now = cycle.snapshot.now
        spared = _spared_gang_size(cycle, request)
        for workload in _cohort_work(index, request, PriorityRun.equal, own_queue=True):
            if workload.id in chosen or workload.id in others or workload.id in own_ids:
                continue
            if workload.device_count >= spared:
                continue
            if workload.expected_end is not None and (workload.expected_end - now) * workload.device_count >= bar:
                others[workload.id] = (workload, "ShorterRemaining")
    if shrink:
        shrunk = index.shrunk
        own = [shrunk[workload.id] for workload in own if workload.id in shrunk]
        others = {key: (shrunk[key], rule) for key, (_, rule) in others.items() if key in shrunk}
    return _Eligible(own, chosen, others)


def _spared_gang_size(cycle, request) -> float:
    """The devices from which a running gang is no ShorterRemaining victim of `request`: large gangs,
    while they are protected (`protected_large_gangs`), for work smaller than a large gang. Measured in
    device-time, a large gang's remaining work dwarfs any small job's, so every equal-priority job would
    find it a victim; stopped, it waits for a whole rack again, its protected start undone."""
    least = cycle.config.large_gang_devices
    if cycle.config.protected_large_gangs <= 0 or request.needed >= least:
        return float("inf")
    return least


def _within_queue_candidates(run: PriorityRun, policy: str, preemptor) -> list[RunningWorkload]:
    if policy == "LowerPriority":
        return run.below(preemptor.priority)
    if policy == "LowerOrNewerEqualPriority":
        return run.below_or_newer_equal(preemptor.priority, preemptor.submitted)
    return []


def _cohort_reclaim_candidates(cycle, index: VictimIndex, request, any_priority: bool = False):
    """Work of the other queues of the cohort tree, in the device classes they borrow above nominal,
    of priority below the preemptor's (LowerPriority) or up to it (Any; of any priority with
    `any_priority`)."""
    priority = request.workload.priority
    for run in _cohort_reclaim_runs(cycle, index, request):
        if request.queue.reclaim_within_cohort != "Any":
            yield from run.below(priority)
        else:
            yield from run.workloads if any_priority else run.up_to(priority)


def _cohort_work(index: VictimIndex, request, select, own_queue: bool):
    """Preemptible work in the other queues of the preemptor's cohort tree (and in its own queue too with
    `own_queue`) that `select` (a PriorityRun method: below, equal) picks by the preemptor's priority:
    below for ClassPriority, equal for ShorterRemaining. A queue outside any cohort has only itself."""
    queue = request.queue.name
    root = index.cohort_root.get(queue)
    priority = request.workload.priority
    for other in index.queues:
        if other == queue:
            if own_queue:
                yield from select(index.own(other), priority)
        elif root is not None and index.cohort_root.get(other) == root:
            yield from select(index.own(other), priority)


def _cohort_reclaim_runs(cycle, index: VictimIndex, request):
    """The victim-ordered runs of the other queues of the cohort tree, one per device class they
    borrow above nominal."""
    queue = request.queue
    root = index.cohort_root.get(queue.name)
    if root is None:
        return
    for other in index.queues:
        if other == queue.name or index.cohort_root.get(other) != root:
            continue
        if not any(cycle.quota.is_borrowing(other, name) for name in cycle.class_names):
            continue  # its work is not put in order for nothing
        for device_class, run in index.by_class(other).items():
            if run.workloads and cycle.quota.is_borrowing(other, device_class):
                yield run


def _within_nominal_after(cycle, request, class_name: str) -> bool:
    nominal = cycle.quota.nominal(request.queue.name, class_name)
    return nominal is None or cycle.quota.usage(request.queue.name, class_name) + request.needed <= nominal


def _cohort_roots(snapshot) -> dict[str, str | None]:
    parents = {cohort.name: cohort.parent for cohort in snapshot.cohorts}
    roots = {}
    for queue in snapshot.queues:
        cohort = queue.cohort
        seen = set()
        while cohort is not None and parents.get(cohort) and cohort not in seen:
            seen.add(cohort)
            cohort = parents[cohort]
        roots[queue.name] = cohort
    return roots


def _search_class(
    cycle,
    request,
    class_name: str,
    with_victims: bool = True,
    any_priority: bool = False,
    shrink: bool = False,
    excluded: frozenset = frozenset(),
) -> Found | None:
    """The cheapest victims in one class. `excluded`: nodes the request may not take (those held for
    protected gangs whose planned start it would delay, and reservation windows it would overrun):
    what victims free there, or evictions under way leave there, is not room for it. Without this,
    short work preempting batch work keeps refilling the rack a large gang is waiting for."""
    access = request.default_access
    class_index = cycle.state.class_index[class_name]
    level_index = cycle.state.levels.index(request.required) if request.required else None
    evicting_slots = _evicting_slots(cycle, access, request.id)
    if excluded and evicting_slots:
        evicting_slots = [entry for entry in evicting_slots if entry[1].node not in excluded]
    evicting = _by_scope(cycle, evicting_slots, class_index, level_index)
    eligible = _eligible(cycle, request, class_name, any_priority, shrink) if with_victims else _Eligible([], set(), {})
    if shrink and not eligible:
        return None  # the search without shrinking answers the same
    if not evicting and not eligible:
        return None  # no scope to search (what follows would find none)
    base_view = cycle.view(class_name, access, excluded)
    most = base_view.total() + sum(len(slots) for slots in evicting.values())
    if not _hold_at_least(cycle, eligible.workloads(), request.needed - most):
        return None
    # Shrunk records share their workload's id: what they free is kept apart from what the whole frees.
    freed_key = (cycle.access_key(access), class_index, level_index, shrink, excluded)
    if level_index is None and eligible:
        found = _cheapest_single(cycle, request, class_name, eligible, evicting.get(ROOT, []), freed_key)
        if found is not _UNDECIDED:
            return found
    ranked = _ranked_scopes(cycle, request, eligible, evicting, base_view, freed_key)
    freed = _freed_memo(cycle, freed_key)
    # A scope's sets cost at least `fewest` victims of its lowest priority: scopes by that bound, and
    # none searched once the bound passes the best set found.
    bounded = []
    for fewest, scope, candidates, gains, evicting_here in ranked:
        lowest = min((victim.workload.priority for victim in candidates), default=0)
        bounded.append(((lowest,) * fewest, fewest, scope, candidates, gains, evicting_here))
    bounded.sort(key=lambda entry: (entry[0], entry[1], entry[2]))
    best = None
    for bound, _, scope, candidates, gains, evicting_here in bounded:
        if best is not None and bound > cost_key(best.victims)[0]:
            break
        search = _ScopeSearch(cycle, request, class_name, scope, evicting_here, freed, excluded)
        found = search.run(candidates, gains)
        if found is not None and (best is None or cost_key(found.victims) < cost_key(best.victims)):
            best = found
    return best


def _ranked_scopes(cycle, request, eligible, evicting, base_view, freed_key) -> list[tuple]:
    """(fewest victims it could need, scope, candidates, their gains, evicting slots there) of every
    scope where evicting all candidates would free enough. Gains and Victims are made only for those
    scopes: the freed totals rule the others out first (fewest is None exactly when they fall short)."""
    access = request.default_access
    by_id = eligible.by_id
    freed: dict[str, dict] = {}
    totals: dict[tuple, int] = dict.fromkeys(evicting, 0)
    members: dict[tuple, list[str]] = {scope: [] for scope in evicting}
    known = _freed_memo(cycle, freed_key)  # `_freed_by_scope`, its lookup inlined: this loop meets every candidate
    for workload_id in sorted(by_id):
        scopes = known.get(workload_id)
        if scopes is None:
            scopes = _freed_now(cycle, by_id[workload_id][0], access, freed_key)
        freed[workload_id] = scopes
        for scope, slots in scopes.items():
            totals[scope] = totals.get(scope, 0) + len(slots)
            members.setdefault(scope, []).append(workload_id)
    victims: dict[str, Victim] = {}
    ranked = []
    for scope, workload_ids in members.items():
        evicting_here = evicting.get(scope, [])
        deficit = request.needed - base_view.domain_count(scope) - len(evicting_here)
        if deficit > totals[scope]:
            continue
        gains = {workload_id: len(freed[workload_id][scope]) for workload_id in workload_ids}
        fewest = _fewest_needed(sorted(gains.values(), reverse=True), deficit)
        candidates = []
        for workload_id in workload_ids:
            victim = victims.get(workload_id)
            if victim is None:
                victim = victims[workload_id] = Victim(*by_id[workload_id])
            candidates.append(victim)
        ranked.append((fewest, scope, candidates, gains, evicting_here))
    return ranked


_UNDECIDED = object()


def _cheapest_single(cycle, request, class_name, eligible, evicting_here, freed_key):
    """Without a required level (one scope, the whole cluster): what the full search below answers
    when one victim suffices, found by walking the victims cheapest first and working out what one
    frees only when its device count could cover the deficit. _UNDECIDED when the full search may
    answer otherwise: no single victim works, or the walk would pass the search budget.

    The full search would check the same singles in the same order: candidates are the victims that
    free anything here (none that frees less than the deficit could be chosen alone), a set of one is
    tried once its gain covers the deficit, and the first feasible one ends the search."""
    access = request.default_access
    excluded = freed_key[4]
    freed: dict[str, dict] = {}
    search = _ScopeSearch(cycle, request, class_name, ROOT, evicting_here, freed, excluded)
    evicting = _evicting_ids(evicting_here)
    if search.feasible(()):
        return Found((), evicting) if evicting else None
    view = cycle.view(class_name, access, excluded)
    deficit = max(1, request.needed - view.total() - len(evicting_here))
    budget = cycle.config.preemption_search_limit  # a walk within it examines no more sets than the search
    known = _freed_memo(cycle, freed_key)
    best = None
    for position, workload in enumerate(eligible.in_victim_order()):
        if position >= budget:
            return _UNDECIDED
        if best is not None and workload.priority != best.workload.priority:
            break
        if workload.device_count < deficit:
            continue  # it frees at most the devices it holds
        if best is not None and _cost_order(workload) >= _cost_order(best.workload):
            continue
        scopes = known.get(workload.id)
        if scopes is None:
            scopes = _freed_now(cycle, workload, access, freed_key)
        if len(scopes.get(ROOT, ())) < deficit:
            continue
        freed[workload.id] = scopes
        victim = eligible.victim(workload)
        if search.feasible((victim,)):
            best = victim
    if best is None:
        return _UNDECIDED
    # One victim of priority p is the cheapest set unless the victims below p make room together.
    lower = []
    for workload in eligible.workloads():
        if workload.priority < best.workload.priority:
            scopes = freed.get(workload.id) or known.get(workload.id) or _freed_now(cycle, workload, access, freed_key)
            if scopes.get(ROOT):
                freed[workload.id] = scopes
                lower.append(eligible.victim(workload))
    if lower and search.feasible(tuple(lower)):
        return _UNDECIDED
    return Found((best,), evicting)


def _fewest_needed(gains_descending: list[int], deficit: int) -> int | None:
    total = 0
    if deficit <= 0:
        return 0
    for count, gain in enumerate(gains_descending, start=1):
        total += gain
        if total >= deficit:
            return count
    return None


def _by_scope(cycle, slots, class_index: int, level_index: int | None) -> dict[tuple, list]:
    if level_index is None:
        matching = [entry for entry in slots if class_index in entry[1].classes]
        return {ROOT: matching} if matching else {}
    groups: dict[tuple, list] = {}
    keys = cycle.state.node_domains[level_index]  # state.domain_of, read directly: called per freed device
    for entry in slots:
        slot = entry[1]
        if class_index in slot.classes:
            groups.setdefault(keys[slot.node], []).append(entry)
    return groups


def _evicting_slots(cycle, access, request_id=None) -> list:
    """(rank, slot) of devices being evicted that the request may count as free: those of workloads
    evicted for nobody waiting or for this request, not claimed by a search this cycle. Kept per access
    key and nominee while the claimed set stays the same size (it only grows during a cycle)."""
    index = _index(cycle)
    if not index.evicting_slots:
        return []
    nominee = request_id if request_id in index.nominees else None  # any other id is answered alike
    key = (cycle.access_key(access), nominee, len(cycle.chosen_victims))
    slots = index.evicting_for.get(key)
    if slots is None:
        slots = index.evicting_for[key] = _evicting_slots_now(cycle, access, nominee)
    return slots


def _evicting_slots_now(cycle, access, request_id) -> list:
    index = _index(cycle)
    slots = []
    for slot in index.evicting_slots:
        nominee = index.evicted_for.get(slot.holder)
        if nominee is not None and nominee != request_id:
            continue
        if slot.holder not in cycle.chosen_victims:
            rank = access.rank(slot)
            if rank is not None:
                slots.append((rank, slot))
    return slots


def _hold_at_least(cycle, workloads, devices: int) -> bool:
    """Whether `workloads` hold `devices` devices between them (counted only until they do)."""
    total = 0
    for workload in workloads:
        if total >= devices:
            return True
        total += workload.device_count  # kept on the record (a shrunk one counts its own pods)
    return total >= devices


def _freed_by_scope(cycle, workload: RunningWorkload, access, freed_key: tuple) -> dict:
    """`_by_scope` of what evicting `workload` frees, for freed_key = (access key, class index, level
    index, shrink, nodes excluded). Kept for the cycle, as one workload is a candidate in many searches:
    running work keeps its devices while decisions are made, and what a request may use of them depends
    only on its access key and the nodes it may not take."""
    freed = _freed_memo(cycle, freed_key).get(workload.id)
    return _freed_now(cycle, workload, access, freed_key) if freed is None else freed


def _freed_memo(cycle, freed_key: tuple) -> dict[str, dict[tuple, list]]:
    """What `_freed_by_scope` knows for `freed_key`, by workload id (a search looks its many victims up
    by id, not by a key tuple made and hashed for each)."""
    index = _index(cycle)
    memo = index.freed.get(freed_key)
    if memo is None:
        memo = index.freed[freed_key] = {}
    return memo


def _freed_now(cycle, workload: RunningWorkload, access, freed_key: tuple) -> dict:
    class_index, level_index, excluded = freed_key[1], freed_key[2], freed_key[4]
    slots = _freed_slots(cycle, workload, access)
    if excluded:
        slots = [entry for entry in slots if entry[1].node not in excluded]
    freed = _by_scope(cycle, slots, class_index, level_index)
    _freed_memo(cycle, freed_key)[workload.id] = freed
    return freed


def _freed_slots(cycle, workload: RunningWorkload, access) -> list:
    slots = []
    slot_by_id = cycle.state.slot_by_id
    workload_id = workload.id
    for pod in workload.pods:
        for device_id in pod.device_ids:
            slot = slot_by_id.get(device_id)
            if slot is not None and slot.holder == workload_id:
                # A plain device is anyone's at the plain rank (Access.rank), and most devices are plain.
                rank = RANK_PLAIN if slot.category == PLAIN else access.rank(slot)
                if rank is not None:
                    slots.append((rank, slot))
    if cycle.state.counted:
        slots += _unblocked_slots(cycle.state, [slot for _, slot in slots], access)
    return slots


def _counters_given_back(cycle, workloads) -> dict:
    """Counter position -> amount the devices of `workloads` consume, whatever their class: evicting a
    partition's holder gives its counters back to the whole device too."""
    credit: dict[int, float] = {}
    slot_by_id = cycle.state.slot_by_id
    for workload in workloads:
        for pod in workload.pods:
            for device_id in pod.device_ids:
                slot = slot_by_id.get(device_id)
                if slot is not None and slot.consumes is not None and slot.holder == workload.id:
                    for counter, amount in slot.consumes:
                        credit[counter] = credit.get(counter, 0) + amount
    return credit


def _unblocked_slots(state, freed, access) -> list:
    """(rank, slot) of the devices that only the counters of the `freed` ones keep from being free (a
    whole GPU while a partition of it runs): evicting their holder may free them. Placement checks the
    counters again (View.counter_credit), so one named here that needs more victims is not taken."""
    found = {}
    for slot in freed:
        if slot.consumes is None:
            continue
        for counter, _ in slot.consumes:
            for order, _ in state.counter_consumers[counter]:
                other = state.slots[order]
                if other.holder == COUNTERS and order not in found:
                    rank = RANK_PLAIN if other.category == PLAIN else access.rank(other)
                    if rank is not None:
                        found[order] = (rank, other)
    return [found[order] for order in sorted(found)]


class _ScopeSearch:
    """The cheapest victim set that makes the request fit inside one scope."""

    def __init__(self, cycle, request, class_name, scope, evicting_here, freed, excluded=frozenset()):
        self.cycle = cycle
        self.request = request
        self.class_name = class_name
        self.scope = scope
        self.excluded = excluded
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
        view = self.cycle.view(self.class_name, self.request.default_access, self.excluded)
        deficit = self.request.needed - view.domain_count(self.scope) - len(self.evicting_here)
        budget = self.cycle.config.preemption_search_limit
        chosen = _cheapest_feasible(candidates, gains, deficit, self.feasible, budget)
        if chosen is None:
            return None
        return Found(tuple(sorted(chosen, key=lambda victim: victim.workload.id)), evicting, self.scope)

    def feasible(self, chosen) -> bool:
        self.checks += 1
        released: dict[str, float] = {}
        consumption = self.cycle.consumption
        for workload in [victim.workload for victim in chosen] + self.evicting_workloads:
            if consumption.whole and not workload.device_classes:
                if workload.device_class == self.class_name:
                    released[workload.queue] = released.get(workload.queue, 0) + workload.device_count
                continue
            # What its quota usage drops by: what it was charged to this class (quota.Consumption).
            amount = consumption.of_running(workload).get(self.class_name, 0)
            if amount:
                released[workload.queue] = released.get(workload.queue, 0) + amount
        quota = self.cycle.quota.check(self.request.queue.name, self.class_name, self.request.needed, released)
        if not quota.fits:
            return False
        more = list(self.evicting_here)
        for victim in chosen:
            more.extend(self.freed[victim.workload.id][self.scope])
        view = self.cycle.view(self.class_name, self.request.default_access, self.excluded, more=more)
        if self.cycle.state.counted:
            view.counter_credit = _counters_given_back(
                self.cycle, [victim.workload for victim in chosen] + self.evicting_workloads
            )
        return place_within_scope(view, self.scope, self.request.demands, self.preferred) is not None


def _device_ids(workload: RunningWorkload) -> set[str]:
    return {device_id for pod in workload.pods for device_id in pod.device_ids}


def _evicting_ids(slots) -> tuple[str, ...]:
    return tuple(sorted({slot.holder for _, slot in slots}))


def _cheapest_feasible(candidates, gains, deficit, feasible, budget):
    """The cheapest feasible set by `cost_key`, searched best-first: each set is reached from a cheaper
    one by adding the next candidate in `_cost_order` or by replacing its last by the next, so sets
    leave the heap in cost order and the first feasible one is the cheapest. A set (and all reached from
    it) is dropped when even every candidate after its last cannot free `deficit` devices; sets that
    free fewer are not checked. Past `budget` sets examined, greedy."""
    ordered = sorted(candidates, key=lambda victim: _cost_order(victim.workload))
    gain = [gains[victim.workload.id] for victim in ordered]
    count = len(ordered)
    after = [0] * (count + 1)  # devices all candidates from a position on could free
    for position in range(count - 1, -1, -1):
        after[position] = after[position + 1] + gain[position]
    if after[0] < deficit or not ordered:
        return None
    heap: list = []

    def push(members: tuple, gained: int) -> None:
        if gained + after[members[-1] + 1] >= deficit:
            chosen = tuple(ordered[position] for position in members)
            heappush(heap, (cost_key(chosen), members, gained, chosen))

    push((0,), gain[0])
    popped = 0
    while heap:
        _, members, gained, chosen = heappop(heap)
        popped += 1
        if popped > budget:  # sets examined, checked or not: the budget bounds the search either way
            return _greedy(ordered, gains, deficit, feasible)
        if gained >= deficit and feasible(chosen):
            return chosen
        last = members[-1]
        if last + 1 < count:
            push(members + (last + 1,), gained + gain[last + 1])
            push(members[:-1] + (last + 1,), gained - gain[last] + gain[last + 1])
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


def lent_out(cycle, request, class_name: str) -> dict | None:
    """When the request stays within its queue's own nominal quota but cohort borrowers hold that quota
    and the policy does not let this request reclaim it now: the borrowers and a message saying why.
    None when the queue is not within its nominal or nobody in its cohort borrows above nominal."""
    quota = cycle.quota
    queue = request.queue
    nominal = quota.nominal(queue.name, class_name)
    used = quota.usage(queue.name, class_name)
    if nominal is None or used + request.needed > nominal:
        return None
    roots = _index(cycle).cohort_root
    root = roots.get(queue.name)
    if root is None:
        return None
    borrowers = []
    for other in sorted(roots):
        other_nominal = quota.nominal(other, class_name)
        if other == queue.name or roots.get(other) != root or other_nominal is None:
            continue
        over = quota.usage(other, class_name) - other_nominal
        if over > 0:
            workloads = list(_holders_by_priority(cycle, other, class_name))
            borrowers.append({"queue": other, "over": over, "workloads": workloads})
    if not borrowers:
        return None
    held = "; ".join(
        f"queue {b['queue']} borrows {b['over']} above its nominal ({_names(b['workloads'])})" for b in borrowers
    )
    policy = queue.reclaim_within_cohort
    priority = request.workload.priority
    if policy == "Never":
        why = f"queue {queue.name} may not reclaim (reclaim_within_cohort: Never), so it waits for them to end"
    elif policy == "LowerPriority":
        why = (
            f"reclaim_within_cohort LowerPriority reclaims only preemptible borrowers of priority below "
            f"{priority}, and there are not enough of those"
        )
    else:
        why = (
            "reclaim_within_cohort Any reclaims preemptible borrowers of any priority, and evicting them "
            "would not make room"
        )
    message = (
        f"queue {queue.name} uses {used} of its nominal {nominal} {class_name} and needs {request.needed}, "
        f"but that quota is lent out: {held}; {why}"
    )
    return {"message": message, "borrowers": borrowers}


def _holders_by_priority(cycle, queue: str, class_name: str) -> tuple[str, ...]:
    """Names of the queue's running work of `class_name` (evicting or not), highest priority first, then
    by id. Running work is grouped by class once per cycle, not scanned for every explanation."""
    index = _index(cycle)
    by_queue = index.running_by_class.get(class_name)
    if by_queue is None:
        by_queue = index.running_by_class[class_name] = {}
        for workload in cycle.snapshot.running:
            if workload.device_class == class_name:
                by_queue.setdefault(workload.queue, []).append(workload)
    ids = index.holders.get((queue, class_name))
    if ids is None:
        ordered = sorted(by_queue.get(queue, ()), key=lambda workload: (-workload.priority, workload.id))
        ids = index.holders[(queue, class_name)] = tuple(label(workload) for workload in ordered)
    return ids


def _names(ids: list[str], most: int = 5) -> str:
    shown = ", ".join(ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")
