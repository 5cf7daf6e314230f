"""A finished cycle's device records are rebased onto the next snapshot of the same inventory instead of
built anew: the rebased state must be the state a new build gives, whatever the cycle did to it (holds,
nominations, the estimate simulation's releases) and whatever changed between the snapshots."""

import dataclasses

import pytest

from bench.saturated import admitted_as_running
from broker.scheduler.capacity import CapacityState, InventoryIndex
from broker.scheduler.cycle import Cycle, decide
from broker.scheduler.snapshot import Reservation
from tests.scheduler.test_hopeless_memo import crowded


def fingerprint(state: CapacityState) -> tuple:
    """Everything a cycle reads of a state, in the order it reads it."""
    return (
        [(slot.id, slot.holder, slot.owner, slot.category) for slot in state.slots],
        [[slot.order for slot in free] for free in state.free_plain],
        [slot.order for slot in state.extras],
        state.node_free,
        [[list(counts.items()) for counts in per_level] for per_level in state.domain_free],
        [(buckets.values, list(buckets.members.items())) for buckets in state.buckets],
        state.total_free,
        state.has_tainted,
    )


def built(snapshot) -> CapacityState:
    cycle = Cycle(snapshot)
    return CapacityState(snapshot, cycle.matcher, cycle.class_names)


def for_cycle(snapshot) -> CapacityState:
    cycle = Cycle(snapshot)
    return CapacityState.for_cycle(snapshot, cycle.matcher, cycle.class_names)


def next_snapshot(snapshot, result, step: int):
    """What the next cycle sees: admissions running (new records), victims evicting, some work done,
    some records rebuilt equal, a reservation changed, a preemptor's freed devices nominated."""
    waiting = {workload.id: workload for workload in snapshot.pending}
    admitted = {admission.workload_id for admission in result.admissions}
    victims = {preemption.victim_id: preemption.preemptor_id for preemption in result.preemptions}
    running = []
    for index, workload in enumerate(snapshot.running):
        if index % 11 == step % 11 and not workload.evicting:
            continue  # completed
        if workload.id in victims:
            workload = dataclasses.replace(workload, evicting=True, evicted_for=victims[workload.id])
        elif index % 13 == 0:
            workload = dataclasses.replace(workload)  # the loader rebuilt an equal record
        running.append(workload)
    for workload in admitted_as_running(snapshot, result):
        running.append(dataclasses.replace(workload, expected_end=snapshot.now + 600.0 * (1 + len(running) % 5)))
    nominated = {}
    for workload in snapshot.running:
        if workload.evicting and workload.evicted_for in waiting:
            nominated.setdefault(workload.evicted_for, []).extend(
                device_id for pod in workload.pods for device_id in pod.device_ids
            )
    pending = tuple(
        dataclasses.replace(workload, nominated_devices=tuple(nominated[workload.id]))
        if workload.id in nominated
        else workload
        for workload in snapshot.pending
        if workload.id not in admitted
    )
    reservations = (
        Reservation("res-a", snapshot.reservations[0].team, "h100", 120 + 40 * step, domain={"zone": "z1"}),
        *snapshot.reservations[2 - step % 2 :],
    )
    return dataclasses.replace(
        snapshot, running=tuple(running), pending=pending, reservations=reservations, now=snapshot.now + 60
    )


def sequence(seed: int, steps: int = 4):
    snapshot = crowded(seed)
    snapshots = [snapshot]
    for step in range(1, steps):
        snapshot = next_snapshot(snapshot, decide(snapshot), step)
        snapshots.append(snapshot)
    return snapshots


@pytest.mark.parametrize("seed", [1, 2])
def test_it_rebases_to_the_state_a_new_build_gives(seed):
    snapshots = sequence(seed)
    for previous, snapshot in zip(snapshots, snapshots[1:], strict=False):
        decide(previous)  # leaves its state behind, journal and all
        spare = InventoryIndex._last._spare[0]

        rebased = for_cycle(snapshot)

        assert rebased is spare
        assert fingerprint(rebased) == fingerprint(built(snapshot))
        rebased.retire()


@pytest.mark.parametrize("seed", [1, 3])
def test_it_decides_a_sequence_of_cycles_as_new_states_do(seed, monkeypatch):
    snapshots = sequence(seed)
    snapshots.insert(2, snapshots[1])  # the same snapshot twice: a cycle whose commit was refused
    reused = [decide(snapshot) for snapshot in snapshots]
    assert InventoryIndex._last._spare, "the sequence must have gone through rebases"

    monkeypatch.setattr(InventoryIndex, "take_spare", lambda self: None)
    assert [decide(snapshot) for snapshot in snapshots] == reused
    assert any(result.admissions for result in reused[1:]) and any(result.preemptions for result in reused)


def test_it_builds_anew_when_two_running_workloads_claim_one_device():
    snapshot = sequence(1, steps=2)[1]
    decide(snapshot)
    first, second = snapshot.running[0], snapshot.running[1]
    device = first.pods[0].device_ids[0]
    claimed = dataclasses.replace(
        second, pods=(dataclasses.replace(second.pods[0], device_ids=(*second.pods[0].device_ids, device)),)
    )
    twice = dataclasses.replace(snapshot, running=(first, claimed, *snapshot.running[2:]))
    spare = InventoryIndex._last._spare[0]

    state = for_cycle(twice)

    assert state is not spare
    assert state.slot_by_id[device].holder == second.id  # the later claim, as a new build gives it
    assert fingerprint(state) == fingerprint(built(twice))
    state.retire()
    assert not InventoryIndex._last._spare, "a state with a doubly claimed device cannot be rebased later"


def test_it_lends_the_state_to_one_cycle_at_a_time():
    snapshot = crowded(2)
    decide(snapshot)
    spare = InventoryIndex._last._spare[0]

    outer = for_cycle(snapshot)
    inner = for_cycle(snapshot)  # a what-if or a nested decide meanwhile

    assert outer is spare and inner is not spare
    assert fingerprint(inner) == fingerprint(outer)
    outer.retire()
    inner.retire()
    assert InventoryIndex._last._spare == [outer]
    assert outer.index is None, "kept without a reference cycle back to its index"


def test_it_keeps_no_state_of_a_cycle_that_failed(monkeypatch):
    snapshot = crowded(3)
    decide(snapshot)
    InventoryIndex._last._spare.clear()

    def broken(cycle, rerun):
        raise RuntimeError("explanations failed")

    monkeypatch.setattr("broker.scheduler.explanation.explain_all", broken)
    with pytest.raises(RuntimeError):
        decide(snapshot)

    assert not InventoryIndex._last._spare
