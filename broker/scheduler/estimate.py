"""Estimated start times: a list-scheduling simulation of the future from known durations.

Running work (and work admitted this cycle with a known duration) ends at its expected end; at each
release the waiting workloads are started in cluster order wherever they fit (quota included), and
those that start release their devices after their own expected duration. An open reservation window
ends too: from its end its devices are anyone's, not only its team's (issue 27). A workload's estimate
is the first release time at which it starts. Work with unknown duration never ends in this model, so a
workload stuck behind it has no estimate, and the note says so. Victims being evicted end now.
This runs after every decision of the cycle is made: it consumes the cycle's free-capacity state.

Like Slurm's backfill (`bf_max_job_test`), only the first `estimate_queue_depth` estimable workloads in
cluster order are simulated: on a long queue the simulation would otherwise start every waiting
workload, a second cycle's worth of placements, for estimates far out in time. Those beyond the depth
get a note saying so; those within it are estimated as if nothing behind them could take their devices.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

from broker.scheduler.backfill import admitted_without_end, release_timeline, unknown_ends

NO_ESTIMATE_REASONS = ("InvalidRequest", "NotEntitled", "AwaitingApproval")
FROM_EXPECTED_ENDS = "from the expected ends of running work and the work ahead of it"


def estimated_starts(cycle, waiting: list[str], reasons: dict[str, str]) -> dict[str, tuple]:
    """workload id -> (estimated start or None, a note saying how it was reached or why not)."""
    estimates: dict[str, tuple] = {}
    remaining = []
    for workload_id in waiting:
        reason = reasons[workload_id]
        if reason in NO_ESTIMATE_REASONS:
            estimates[workload_id] = (None, f"no estimate: {reason} must be resolved first")
        else:
            remaining.append(workload_id)
    depth = cycle.config.estimate_queue_depth
    beyond = (None, f"not estimated: only the first {depth} waiting workloads in line are")  # one for all
    for workload_id in remaining[depth:]:
        estimates[workload_id] = beyond
    del remaining[depth:]
    unknown = unknown_ends(cycle) + admitted_without_end(cycle)
    requests = cycle.requests
    started = _simulate(cycle, [requests[workload_id] for workload_id in remaining])
    if unknown:
        not_started = (None, f"unknown: {unknown} running workload(s) have no expected duration")
    else:
        horizon = cycle.config.estimate_horizon_events
        not_started = (None, f"unknown: it does not start within the next {horizon} releases")
    # Most never start within the horizon: all get that note, then the few that start their time.
    estimates.update(dict.fromkeys(remaining, not_started))
    for workload_id, when in started.items():
        estimates[workload_id] = (when, FROM_EXPECTED_ENDS)
    for protection in cycle.protections:  # a protected gang's planned start holds: nothing may delay it
        if protection.planned_start is None:
            continue
        head = protection.workload_id
        if head in estimates and reasons[head] not in NO_ESTIMATE_REASONS:
            when = started.get(head)
            when = protection.planned_start if when is None else min(when, protection.planned_start)
            estimates[head] = (when, FROM_EXPECTED_ENDS)
    return estimates


def _simulate(cycle, remaining) -> dict[str, float]:
    """Start waiting work in cluster order at each release time. Workloads of one shape (same classes,
    gang, topology, queue and team) succeed or fail alike, so each shape is a FIFO and a release time
    only visits each shape's first member, in cluster order, until that shape fails."""
    return _Simulation(cycle, remaining).run()


class _Simulation:
    """`_simulate`'s state: the release events, the waiting shapes' FIFOs and their fronts."""

    def __init__(self, cycle, remaining):
        self.cycle = cycle
        timeline = release_timeline(cycle)
        self.events = [(end, order, workload_id) for order, (end, workload_id) in enumerate(timeline)]
        self.counter = len(self.events)
        # Open reservation windows end as well: events of their own (no workload), ordered among the
        # releases by time; they are no releases, so they do not count towards the horizon.
        self.window_ends: dict[int, list] = {}
        now = cycle.snapshot.now
        for reservation in sorted(cycle.snapshot.reservations, key=lambda r: r.name):
            slots = cycle.state.reserved_by(reservation.name)
            if slots and reservation.start <= now < reservation.end and math.isfinite(reservation.end):
                self.counter += 1
                self.window_ends[self.counter] = slots
                self.events.append((reservation.end, self.counter, None))
        heapq.heapify(self.events)
        self.started: dict[str, float] = {}
        self.head = head = cycle.protection.workload_id if cycle.protection is not None else None
        # Shapes are numbered: the loops below look them up by number, not by hashing the shape again.
        numbers: dict[tuple, int] = {}
        self.members: list[deque] = []
        head_request = cycle.requests.get(head)
        for position, request in enumerate(remaining):
            key = _shape(request) + ((head,) if request is head_request else ())
            number = numbers.get(key)
            if number is None:
                number = numbers[key] = len(self.members)
                self.members.append(deque())
            self.members[number].append((position, request))
        self.front = [_Front(cycle, *queue[0]) for queue in self.members]
        self.waiting = len(self.members)  # shapes with members left
        self.placement_ids: dict[tuple, int] = {}
        # Waiting shapes grouped by the placements their fronts try, each group in cluster order: once
        # all of a group's placements failed since the release, the whole group is passed over at once.
        self.groups: dict[tuple, list[tuple[int, int]]] = {}
        self.grouped_for: frozenset | None = None  # the nodes held for the head when grouped

    def run(self) -> dict[str, float]:
        events = self.events
        handled = 0
        while events and self.waiting and handled < self.cycle.config.estimate_horizon_events:
            time = events[0][0]
            while events and events[0][0] == time:
                _, order, workload_id = heapq.heappop(events)
                if workload_id is None:
                    self.cycle.unreserve(self.window_ends[order])
                    continue
                _release(self.cycle, workload_id)
                handled += 1
            self.start_what_fits(time)
        return self.started

    def group(self, held: frozenset) -> None:
        self.groups = {}
        self.grouped_for = held
        for shape, queue in enumerate(self.members):
            if queue:
                self.add(shape, held)

    def add(self, shape: int, held: frozenset) -> tuple:
        first = self.front[shape]
        placements = first.placement_ids(self.cycle, held if first.excludable else frozenset(), self.placement_ids)
        bisect.insort(self.groups.setdefault(placements, []), (first.position, shape))
        return placements

    def start_what_fits(self, time: float) -> None:
        """Try the waiting fronts in cluster order (a heap of groups, each at its next untried front)."""
        held = _held_for_head(self.cycle, self.started)
        if held != self.grouped_for:
            self.group(held)
        unplaceable: set[int] = set()  # placements failed since this release; starts only take devices away
        hopeless: set[tuple] = set()  # groups whose placements are all in `unplaceable`
        next_try, agenda = self.agenda()
        while agenda:
            position, placements = heapq.heappop(agenda)
            entries = self.groups[placements]
            at = next_try[placements]
            if placements in hopeless or at >= len(entries) or entries[at][0] != position:
                continue  # passed over, or a stale entry of a front already tried
            shape = entries[at][1]
            first = self.front[shape]
            excluded = held if first.excludable else frozenset()
            class_name, plan = _try_start(self.cycle, first, excluded, placements, unplaceable)
            if plan is None:
                if unplaceable.issuperset(placements):
                    hopeless.add(placements)
                    continue
                next_try[placements] = at = at + 1
            else:
                self.start(first.request, class_name, plan, time)
                del entries[at]
                self.advance(shape, held, next_try, agenda)
            if at < len(entries):
                heapq.heappush(agenda, (entries[at][0], placements))
            if held and plan is not None and first.request.id == self.head:
                held = frozenset()  # the head starts: all wait again, and what failed for its hold may fit
                self.group(held)
                next_try, agenda = self.agenda()
        self.groups = {placements: entries for placements, entries in self.groups.items() if entries}

    def agenda(self) -> tuple[dict, list]:
        """Per group, the index of its next front to try (none tried yet), and a heap of the groups by
        the cluster position of that front."""
        agenda = [(entries[0][0], placements) for placements, entries in self.groups.items()]
        heapq.heapify(agenda)
        return dict.fromkeys(self.groups, 0), agenda

    def advance(self, shape: int, held: frozenset, next_try: dict, agenda: list) -> None:
        """The shape's next member becomes its front, in the group of its placements (after the fronts
        that group tried at this release: they come earlier in cluster order)."""
        queue = self.members[shape]
        queue.popleft()
        if not queue:
            self.waiting -= 1
            return
        self.front[shape] = _Front(self.cycle, *queue[0])
        placements = self.add(shape, held)
        next_try.setdefault(placements, 0)
        heapq.heappush(agenda, (self.front[shape].position, placements))

    def start(self, request, class_name: str, plan, time: float) -> None:
        workload_id = request.workload.id
        _start(self.cycle, request, class_name, plan)
        self.started[workload_id] = time
        duration = request.workload.expected_duration
        if duration is not None:
            self.counter += 1
            heapq.heappush(self.events, (time + duration, self.counter, workload_id))


def _start(cycle, request, class_name: str, plan) -> None:
    cycle.state.hold(list(plan.slots()), request.workload.id)
    cycle.quota.add_usage(request.queue.name, class_name, cycle.consumption.of_devices([s.id for s in plan.slots()]))
    cycle.simulated_plans[request.workload.id] = plan
    cycle.simulated_class[request.workload.id] = class_name


def _held_for_head(cycle, started) -> frozenset:
    """Nodes kept for the protected head until it starts in the simulation too."""
    protection = cycle.protection
    if protection is None or protection.workload_id in started:
        return frozenset()
    return protection.nodes


def _shape(request) -> tuple:
    return (
        request.classes,
        request.demands,
        request.required,
        request.preferred,
        request.queue.name,
        request.team,
    )


class _Front:
    """The first waiting workload of one shape, with what every try of it needs worked out once: a
    front is tried at each release time until it starts."""

    __slots__ = ("position", "request", "queue", "needed", "excludable", "placements")

    def __init__(self, cycle, position: int, request):
        protection = cycle.protection
        self.position = position  # in cluster order
        self.request = request
        self.queue = request.queue.name
        self.needed = request.needed
        self.excludable = protection is not None and request.id != protection.workload_id
        self.placements: dict[frozenset, tuple] = {}  # nodes excluded -> placement id (or None) per class

    def placement_ids(self, cycle, excluded: frozenset, ids: dict[tuple, int]) -> tuple:
        """Per class, a number standing for `_placement_key` (one hashed int instead of a key tuple
        hashed at every try), None where failures are not remembered."""
        known = self.placements.get(excluded)
        if known is None:
            known = self.placements[excluded] = tuple(
                _placement_id(_placement_key(cycle, self.request, class_name, excluded), ids)
                for class_name in self.request.classes
            )
        return known


def _placement_id(key: tuple | None, ids: dict[tuple, int]) -> int | None:
    if key is None:
        return None
    known = ids.get(key)
    if known is None:
        known = ids[key] = len(ids)
    return known


def _try_start(cycle, front: _Front, excluded: frozenset, placements: tuple, unplaceable: set[int]):
    """The first class whose quota and placement let the front start now, and its plan. `unplaceable`
    holds placements that failed since the last release, for requests of other queues to skip (known
    failures are skipped before the quota is asked: both only answer, so the order cannot matter)."""
    request = front.request
    for class_name, placement in zip(request.classes, placements, strict=True):
        if placement in unplaceable or not cycle.quota.fits(front.queue, class_name, front.needed):
            continue
        plan = cycle.plan_now(request, class_name, request.default_access, excluded)
        if plan is not None:
            return class_name, plan
        if placement is not None:
            unplaceable.add(placement)
    return None, None


def _placement_key(cycle, request, class_name: str, excluded: frozenset) -> tuple | None:
    """What a placement of `request` depends on, when its failure is sure to last while devices are only
    taken: with one pod set and no matchAttribute, it fits exactly when enough of its pods fit in one
    domain, which fewer free devices never makes true. None for gangs a greedy packing might place only
    on fewer devices."""
    demands = request.demands
    if len(demands) != 1 or demands[0].match_attribute:
        return None
    return (
        class_name,
        demands,
        request.required,
        request.preferred,
        cycle.access_key(request.default_access),
        excluded,
    )


def _release(cycle, workload_id: str) -> None:
    slots = cycle.slots_held_by(workload_id)
    cycle.state.release(slots)
    workload = cycle.running.get(workload_id) or cycle.leaving.get(workload_id)
    if workload is not None:  # what it was charged (broker.scheduler.quota.Consumption)
        for device_class, amount in cycle.consumption.of_running(workload).items():
            cycle.quota.add_usage(workload.queue, device_class, -amount)
        return
    request = cycle.requests.get(workload_id)
    class_name = cycle.log.admitted[workload_id].device_class if workload_id in cycle.log.admitted else None
    class_name = class_name or cycle.simulated_class.get(workload_id)
    if request is not None and class_name is not None:
        cycle.quota.add_usage(request.queue.name, class_name, -cycle.consumption.of_devices([s.id for s in slots]))
