"""The victim index answers by bisection what a scan of every running workload would answer."""

import random

from broker.scheduler.preemption import PriorityRun, _victim_order
from broker.scheduler.snapshot import RunningPod, RunningWorkload


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
