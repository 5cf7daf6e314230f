"""The victim index answers by bisection what a scan of every running workload would answer."""

import random
from dataclasses import replace

from broker.scheduler.cycle import Cycle
from broker.scheduler.preemption import (
    PriorityRun,
    _cohort_roots,
    _in_victim_order,
    _index,
    _victim_order,
    eligible_victims,
)
from broker.scheduler.snapshot import Reservation, RunningPod, RunningWorkload
from broker.scheduler.synthetic import synthetic_snapshot
from tests.scheduler.policies import every_preemption_policy


def workloads(seed: int, count: int = 200) -> list[RunningWorkload]:
    chance = random.Random(seed)
    return [
        RunningWorkload(
            id=f"w{index:03d}",
            queue="q",
            pods=(RunningPod("main", 0, "n1", (f"n1/{index}",)),),
            device_class="h100",
            priority=chance.choice((0, 1, 5, 10)),
            started=float(chance.choice((0, 10, 20, 30))),  # ties in start time too
        )
        for index in range(count)
    ]


def run_of(all_workloads) -> PriorityRun:
    return PriorityRun(sorted(all_workloads, key=_victim_order))


def ids(found) -> list[str]:
    return sorted(workload.id for workload in found)


def test_it_orders_victims_by_priority_then_newest_then_id():
    ordered = sorted(workloads(1), key=_victim_order)
    keys = [(workload.priority, -workload.started, workload.id) for workload in ordered]
    assert keys == sorted(keys)


def test_it_sorts_all_running_work_into_victim_order_by_stable_passes():
    shuffled = workloads(4, count=500)
    random.Random(5).shuffle(shuffled)
    assert _in_victim_order(shuffled) == sorted(shuffled, key=_victim_order)


def test_it_finds_lower_and_up_to_priority_as_a_scan_would():
    all_workloads = workloads(2)
    run = run_of(all_workloads)
    for priority in (-1, 0, 1, 3, 5, 10, 11):
        assert ids(run.below(priority)) == ids(w for w in all_workloads if w.priority < priority)
        assert ids(run.up_to(priority)) == ids(w for w in all_workloads if w.priority <= priority)


def test_it_finds_lower_or_newer_equal_priority_as_a_scan_would():
    all_workloads = workloads(3)
    run = run_of(all_workloads)
    for priority in (0, 1, 5, 10, 7):
        for since in (-5.0, 0.0, 10.0, 15.0, 30.0, 40.0):
            expected = [
                w for w in all_workloads if w.priority < priority or (w.priority == priority and w.started > since)
            ]
            assert ids(run.below_or_newer_equal(priority, since)) == ids(expected), (priority, since)


def test_it_answers_empty_on_no_work():
    run = PriorityRun([])
    assert run.below(5) == [] and run.up_to(5) == [] and run.below_or_newer_equal(5, 0.0) == []


def scanned_victims(cycle, request, class_name, any_priority=False) -> list[tuple[str, str]]:
    """What eligible_victims answers, by scanning every running workload (the index's specification)."""
    preemptor, queue, chosen = request.workload, request.queue, cycle.chosen_victims
    roots = _cohort_roots(cycle.snapshot)
    found = {}
    for workload in cycle.snapshot.running:
        if not workload.preemptible or workload.evicting or workload.id in chosen or workload.queue != queue.name:
            continue
        lower = workload.priority < preemptor.priority
        newer_equal = workload.priority == preemptor.priority and workload.started > preemptor.submitted
        if (queue.within_queue == "LowerPriority" and lower) or (
            queue.within_queue == "LowerOrNewerEqualPriority" and (lower or newer_equal)
        ):
            found[workload.id] = "WithinQueue"
    for workload_id in _index(cycle).on_reserved.get(request.team, ()):
        if workload_id not in chosen:
            found.setdefault(workload_id, "ReservationReclaim")
    nominal = cycle.quota.nominal(queue.name, class_name)
    within_nominal = nominal is None or cycle.quota.usage(queue.name, class_name) + request.needed <= nominal
    root = roots.get(queue.name)
    if queue.reclaim_within_cohort != "Never" and within_nominal and root is not None:
        for workload in cycle.snapshot.running:
            if (
                not workload.preemptible
                or workload.evicting
                or workload.id in chosen
                or workload.id in found
                or workload.queue == queue.name
                or roots.get(workload.queue) != root
                or not cycle.quota.is_borrowing(workload.queue, workload.device_class)
            ):
                continue
            if workload.priority < preemptor.priority or (
                queue.reclaim_within_cohort == "Any" and (any_priority or workload.priority == preemptor.priority)
            ):
                found[workload.id] = "ReclaimWithinCohort"
    return sorted(found.items())


def test_it_finds_the_victims_a_scan_of_all_running_work_finds():
    snapshot = synthetic_snapshot(nodes=40, pending=300, seed=7)
    queues = every_preemption_policy(snapshot.queues)
    reservations = (
        Reservation("held", "vc03", "h100", 24),
        Reservation("pinned", "vc07", "h100", 8, domain={"zone": "z0"}),
    )
    snapshot = replace(
        snapshot,
        # Healthy devices: work on failed ones would be evicted first (issue 26), taking the borrowers
        # above the preemptors' priority this test looks for out of the victim search.
        devices=tuple(replace(device, healthy=True) for device in snapshot.devices),
        queues=queues,
        reservations=reservations,
        config=replace(snapshot.config, preemptions_per_queue_per_cycle=5),
    )
    cycle = Cycle(snapshot)
    cycle.run()  # ends with chosen victims and borrowing as a search late in the cycle sees them
    assert cycle.chosen_victims
    checked = 0
    above = {False: 0, True: 0}
    for request in list(cycle.requests.values())[:150]:
        for class_name in request.classes:
            for any_priority in (False, True):
                victims = eligible_victims(cycle, request, class_name, any_priority)
                assert [(victim.workload.id, victim.rule) for victim in victims] == scanned_victims(
                    cycle, request, class_name, any_priority
                )
                checked += bool(victims)
                above[any_priority] += sum(victim.workload.priority > request.workload.priority for victim in victims)
    assert checked
    assert above[False] == 0 and above[True] > 0, "the second tier adds borrowers above the preemptor's priority"
