"""The release timeline puts in order only the earliest ends a simulation can reach, and gives what
sorting every end would give as far as that reach."""

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from broker.scheduler import backfill
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import RunningWorkload, SchedulerConfig, leaving_id
from broker.scheduler.synthetic import synthetic_snapshot

NOW = 1000.0


def running(workload_id: str, expected_end: float | None, evicting: bool = False) -> RunningWorkload:
    return RunningWorkload(
        id=workload_id,
        queue="q",
        pods=(),
        device_class="h100",
        priority=0,
        started=0.0,
        expected_end=expected_end,
        evicting=evicting,
    )


def random_cycle(seed: int, horizon: int):
    chance = random.Random(seed)
    running_work = [
        running(
            f"w{index:04d}",
            chance.choice((None, NOW - 5.0, NOW, NOW + chance.randrange(1, 60) * 10.0)),
            evicting=chance.random() < 0.05,
        )
        for index in range(chance.randrange(0, 400))
    ]
    durations = {f"p{index:03d}": chance.choice((None, 0.0, 10.0, 20.0, 35.0)) for index in range(50)}
    requests = {
        workload_id: SimpleNamespace(workload=SimpleNamespace(expected_duration=duration))
        for workload_id, duration in durations.items()
    }
    return SimpleNamespace(
        snapshot=SimpleNamespace(now=NOW, running=tuple(running_work)),
        running={workload.id: workload for workload in running_work},
        chosen_victims=set(),
        shrunk_victims=set(),
        leaving={},
        log=SimpleNamespace(admitted={}, admitted_durations=[]),
        requests=requests,
        config=SimpleNamespace(estimate_horizon_events=horizon),
    )


def full_timeline(cycle) -> list[tuple[float, str]]:
    """Every end, sorted: what the simulation would read without a horizon."""
    now = cycle.snapshot.now
    events = []
    for workload in cycle.snapshot.running:
        if workload.evicting or workload.id in cycle.chosen_victims - cycle.shrunk_victims:
            events.append((now, workload.id))
        elif workload.expected_end is not None:
            events.append((max(now, workload.expected_end), workload.id))
    events.extend((now, workload_id) for workload_id in cycle.leaving)  # the pods shrunk victims give up
    for workload_id in cycle.log.admitted:
        duration = cycle.requests[workload_id].workload.expected_duration
        if duration is not None:
            events.append((now + duration, workload_id))
    return sorted(events)


def reach(events, horizon: int) -> list[tuple[float, str]]:
    """The first `horizon` events and every later one at the time of the last of them."""
    if len(events) <= horizon:
        return events
    if horizon == 0:
        return []
    last = events[horizon - 1][0]
    return events[:horizon] + [event for event in events[horizon:] if event[0] == last]


@pytest.mark.parametrize("seed", range(40))
def test_it_gives_the_sorted_ends_as_far_as_the_horizon_reaches(seed):
    chance = random.Random(seed)
    horizon = chance.choice((0, 1, 3, 16, 64, 256))
    cycle = random_cycle(seed, horizon)
    # Victims and admissions grow between calls, as during a cycle.
    for _ in range(4):
        for workload in cycle.snapshot.running:
            if workload.id in cycle.chosen_victims or workload.evicting:
                continue
            if chance.random() < 0.05:
                cycle.chosen_victims.add(workload.id)
            elif chance.random() < 0.03:  # shrunk: it runs on, some of its pods leave now
                cycle.chosen_victims.add(workload.id)
                cycle.shrunk_victims.add(workload.id)
                cycle.leaving[leaving_id(workload.id)] = workload
        for workload_id in cycle.requests:
            if chance.random() < 0.1 and workload_id not in cycle.log.admitted:
                cycle.log.admitted[workload_id] = None
                cycle.log.admitted_durations.append(cycle.requests[workload_id].workload.expected_duration)
        assert backfill.release_timeline(cycle) == reach(full_timeline(cycle), horizon)
        unknown = [
            w
            for w in cycle.snapshot.running
            if w.expected_end is None and not w.evicting and w.id not in cycle.chosen_victims - cycle.shrunk_victims
        ]
        assert backfill.unknown_ends(cycle) == len(unknown)
        admitted_unknown = [w for w in cycle.log.admitted if cycle.requests[w].workload.expected_duration is None]
        assert backfill.admitted_without_end(cycle) == len(admitted_unknown)


@pytest.mark.parametrize("horizon", [3, 40])
def test_it_estimates_as_from_the_whole_timeline(monkeypatch, horizon):
    snapshot = synthetic_snapshot(nodes=48, pending=600, seed=5, busy=0.9, sizes=(1, 2, 4, 8, 16))
    # Many equal ends: the reach of a horizon ends inside a group released at one time.
    running = tuple(
        replace(workload, expected_end=snapshot.now + 100.0 * (index % 7))
        for index, workload in enumerate(snapshot.running)
    )
    snapshot = replace(snapshot, running=running, config=SchedulerConfig(estimate_horizon_events=horizon))
    within_reach = decide(snapshot)
    monkeypatch.setattr(backfill.ReleaseTimeline, "events", lambda self, cycle, horizon: full_timeline(cycle))
    assert decide(snapshot) == within_reach
    assert any(decision.estimated_start is not None for decision in within_reach.pending)


def test_it_selects_once_then_sorts_when_the_reach_runs_into_a_large_tie(monkeypatch):
    """Work past its expected end all ends "now": thousands of ends in one tie that the reach must take whole."""
    cycle = random_cycle(seed=0, horizon=16)
    overdue = [running(f"late{index:05d}", NOW - 1) for index in range(5000)]
    later = [running(f"on{index:03d}", NOW + 10.0 + index) for index in range(300)]
    cycle.snapshot.running = tuple(overdue + later)
    cycle.running = {workload.id: workload for workload in cycle.snapshot.running}
    selections = []
    nsmallest = backfill.heapq.nsmallest
    monkeypatch.setattr(
        backfill.heapq, "nsmallest", lambda count, items: selections.append(count) or nsmallest(count, items)
    )

    events = backfill.release_timeline(cycle)

    assert events == reach(full_timeline(cycle), 16)
    assert len(events) == 5000, "the whole tie at now, nothing after it"
    assert selections == [16 + 64], "one partial selection; past it, one sort of every end"
