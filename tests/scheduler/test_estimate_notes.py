"""Estimated starts write the not-started note for all at once and then the starts: the same notes as
deciding workload by workload, the protected gangs' planned starts included."""

import random
from types import SimpleNamespace

import pytest

from broker.scheduler import estimate

NOW = 500.0


def one_by_one(cycle, waiting, reasons, started, unknown):
    """The estimates as deciding each waiting workload in turn gives them."""
    estimates = {}
    planned = {p.workload_id: p.planned_start for p in cycle.protections if p.planned_start is not None}
    for workload_id in waiting:
        if reasons[workload_id] in estimate.NO_ESTIMATE_REASONS:
            estimates[workload_id] = (None, f"no estimate: {reasons[workload_id]} must be resolved first")
            continue
        when = started.get(workload_id)
        if workload_id in planned:
            when = planned[workload_id] if when is None else min(when, planned[workload_id])
        if when is not None:
            estimates[workload_id] = (when, estimate.FROM_EXPECTED_ENDS)
        elif unknown:
            estimates[workload_id] = (None, f"unknown: {unknown} running workload(s) have no expected duration")
        else:
            horizon = cycle.config.estimate_horizon_events
            estimates[workload_id] = (None, f"unknown: it does not start within the next {horizon} releases")
    return estimates


@pytest.mark.parametrize("seed", range(30))
def test_it_notes_what_deciding_one_workload_at_a_time_notes(monkeypatch, seed):
    chance = random.Random(seed)
    waiting = [f"w{index:03d}" for index in range(chance.randrange(1, 40))]
    reasons = {
        workload_id: chance.choice(("InsufficientCapacity", "QuotaExceeded", "NotEntitled", "AwaitingApproval"))
        for workload_id in waiting
    }
    started = {
        workload_id: NOW + chance.randrange(0, 5) * 10.0
        for workload_id in waiting
        if reasons[workload_id] not in estimate.NO_ESTIMATE_REASONS and chance.random() < 0.3
    }
    unknown = chance.choice((0, 0, 3))
    heads = chance.sample(waiting + ["admitted-head"], chance.randrange(0, 3))  # gangs protected, in line
    protections = [
        SimpleNamespace(workload_id=head, planned_start=chance.choice((None, NOW, NOW + 15.0, NOW + 95.0)))
        for head in heads
    ]
    cycle = SimpleNamespace(
        requests={workload_id: SimpleNamespace(id=workload_id) for workload_id in waiting},
        log=SimpleNamespace(admitted={}),
        protections=protections,
        config=SimpleNamespace(estimate_horizon_events=256, estimate_queue_depth=1000),
    )
    monkeypatch.setattr(estimate, "_simulate", lambda cycle, remaining: dict(started))
    monkeypatch.setattr(estimate, "unknown_ends", lambda cycle: unknown)
    monkeypatch.setattr(estimate, "admitted_without_end", lambda cycle: 0)
    assert estimate.estimated_starts(cycle, waiting, reasons) == one_by_one(cycle, waiting, reasons, started, unknown)


def test_it_simulates_only_the_first_estimable_workloads_in_line(monkeypatch):
    waiting = [f"w{index:02d}" for index in range(12)]
    reasons = dict.fromkeys(waiting, "InsufficientCapacity")
    reasons["w01"] = reasons["w04"] = "AwaitingApproval"  # never estimated: they do not count
    cycle = SimpleNamespace(
        requests={workload_id: SimpleNamespace(id=workload_id) for workload_id in waiting},
        log=SimpleNamespace(admitted={}),
        protections=[],
        config=SimpleNamespace(estimate_horizon_events=256, estimate_queue_depth=5),
    )
    simulated = []

    def simulate(cycle, remaining):
        simulated.extend(request.id for request in remaining)
        return {request.id: NOW for request in remaining}

    monkeypatch.setattr(estimate, "_simulate", simulate)
    monkeypatch.setattr(estimate, "unknown_ends", lambda cycle: 0)
    monkeypatch.setattr(estimate, "admitted_without_end", lambda cycle: 0)
    estimates = estimate.estimated_starts(cycle, waiting, reasons)
    assert simulated == ["w00", "w02", "w03", "w05", "w06"]
    assert {workload_id: when for workload_id, (when, _) in estimates.items() if when is not None} == dict.fromkeys(
        simulated, NOW
    )
    beyond = "not estimated: only the first 5 waiting workloads in line are"
    assert [estimates[workload_id][1] for workload_id in ("w07", "w08", "w09", "w10", "w11")] == [beyond] * 5
    assert estimates["w04"] == (None, "no estimate: AwaitingApproval must be resolved first")
