"""The simulation behind estimated starts (fronts grouped by their placements, known failures passed
over, the release timeline cut at the horizon) starts what a plain simulation starts, when it does."""

import heapq
from collections import deque
from dataclasses import replace

import pytest

from broker.scheduler import estimate
from broker.scheduler.cycle import decide
from broker.scheduler.placement import place_gang
from broker.scheduler.snapshot import SchedulerConfig
from broker.scheduler.synthetic import synthetic_snapshot


def plain_simulation(cycle, remaining) -> dict[str, float]:
    """Each release time: the fronts of the shapes' FIFOs in cluster order, every class tried every
    time, from every known end sorted (the specification)."""
    now = cycle.snapshot.now
    ends = [
        (
            now if workload.evicting or workload.id in cycle.chosen_victims else max(now, workload.expected_end),
            workload.id,
        )
        for workload in cycle.snapshot.running
        if workload.evicting or workload.id in cycle.chosen_victims or workload.expected_end is not None
    ]
    for workload_id in cycle.log.admitted:
        duration = cycle.requests[workload_id].workload.expected_duration
        if duration is not None:
            ends.append((now + duration, workload_id))
    events = [(end, order, workload_id) for order, (end, workload_id) in enumerate(sorted(ends))]
    heapq.heapify(events)
    counter = len(events)
    started: dict[str, float] = {}
    head = cycle.protection.workload_id if cycle.protection is not None else None
    members: dict[tuple, deque] = {}
    for position, request in enumerate(remaining):
        key = estimate._shape(request) + ((request.id,) if request.id == head else ())
        members.setdefault(key, deque()).append((position, request))
    handled = 0
    while events and members and handled < cycle.config.estimate_horizon_events:
        time = events[0][0]
        while events and events[0][0] == time:
            estimate._release(cycle, heapq.heappop(events)[2])
            handled += 1
        held = estimate._held_for_head(cycle, started)
        fronts = [(queue[0][0], key) for key, queue in members.items()]
        heapq.heapify(fronts)
        failed = []
        while fronts:
            entry = heapq.heappop(fronts)
            request = members[entry[1]][0][1]
            class_name, plan = first_fit(cycle, request, held if request.id != head else frozenset())
            if plan is None:
                failed.append(entry)
                continue
            estimate._start(cycle, request, class_name, plan)
            started[request.id] = time
            members[entry[1]].popleft()
            if members[entry[1]]:
                heapq.heappush(fronts, (members[entry[1]][0][0], entry[1]))
            if held and request.id == head:
                held = frozenset()
                for entry in failed:
                    heapq.heappush(fronts, entry)
                failed = []
            if request.workload.expected_duration is not None:
                counter += 1
                heapq.heappush(events, (time + request.workload.expected_duration, counter, request.id))
        members = {key: queue for key, queue in members.items() if queue}
    return started


def first_fit(cycle, request, excluded):
    levels = cycle.state.levels
    required = levels.index(request.required) if request.required else None
    preferred = levels.index(request.preferred) if request.preferred else None
    for class_name in request.classes:
        if cycle.quota.fits(request.queue.name, class_name, request.needed):
            plan = place_gang(
                cycle.view(class_name, request.default_access, excluded), request.demands, required, preferred
            )
            if plan is not None:
                return class_name, plan
    return None, None


@pytest.mark.parametrize(
    ("seed", "sizes", "horizon", "head_planned"),
    [(3, (1, 1, 2, 4, 8, 16, 32, 64), 256, True), (8, (1, 2, 4, 8, 16, 32), 40, True), (5, None, 7, False)],
)
def test_it_starts_what_a_plain_simulation_starts(monkeypatch, seed, sizes, horizon, head_planned):
    snapshot = synthetic_snapshot(nodes=64, pending=1500, seed=seed, busy=0.9, sizes=sizes)
    # Ends in few distinct times: release times free several workloads at once.
    running = tuple(
        replace(workload, expected_end=snapshot.now + 600.0 * (index % 9)) if workload.expected_end else workload
        for index, workload in enumerate(snapshot.running)
    )
    # Small quotas: fronts of one placement group also fail on their queue's quota, one by one.
    queues = tuple(
        replace(queue, quota={"h100": 60, "a100": 20}, borrowing_limit={"h100": 0, "a100": 0})
        if queue.quota is not None
        else queue
        for queue in snapshot.queues
    )
    config = SchedulerConfig(estimate_horizon_events=horizon)
    snapshot = replace(snapshot, running=running, queues=queues, config=config)
    simulated = []
    simulate = estimate._simulate

    def counted(cycle, remaining):
        simulated.append(cycle.protection is not None and cycle.protection.planned_start is not None)
        return simulate(cycle, remaining)

    monkeypatch.setattr(estimate, "_simulate", counted)
    optimised = decide(snapshot)
    monkeypatch.setattr(estimate, "_simulate", plain_simulation)
    assert decide(snapshot) == optimised
    assert sum(decision.estimated_start is not None for decision in optimised.pending) > 20
    assert simulated == [head_planned]


def test_it_estimates_starts_no_deeper_in_line_than_configured():
    snapshot = synthetic_snapshot(nodes=64, pending=400, seed=3, busy=0.9, sizes=(1, 2, 4, 8))
    running = tuple(
        replace(workload, expected_end=snapshot.now + 600.0 * (index % 9) + 60.0)
        for index, workload in enumerate(snapshot.running)
    )
    deep = decide(replace(snapshot, running=running, config=SchedulerConfig(estimate_queue_depth=10_000)))
    shallow = decide(replace(snapshot, running=running, config=SchedulerConfig(estimate_queue_depth=30)))
    assert sum(decision.estimated_start is not None for decision in deep.pending) > 30
    estimated = sorted(
        decision.position_in_cluster for decision in shallow.pending if decision.estimated_start is not None
    )
    assert 0 < len(estimated) <= 30
    beyond = [decision for decision in shallow.pending if decision.position_in_cluster > estimated[-1]]
    assert beyond and all(decision.estimated_start is None for decision in beyond)
    assert {decision.details["estimate"] for decision in beyond} >= {
        "not estimated: only the first 30 waiting workloads in line are"
    }
