"""Reservation windows seen ahead in time (issue 27, Slurm's rule): work of another team that is not
preemptible and would still run when a window opens is never placed on the window's nodes."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.scheduler.capacity import CapacityState
from broker.scheduler.cycle import decide
from broker.scheduler.selectors import ClassMatcher
from broker.scheduler.snapshot import Reservation
from broker.scheduler.windows import future_windows
from tests.scheduler.invariants import assert_valid_result
from tests.scheduler.strategies import snapshots

NOW = 1000.0


@st.composite
def with_windows(draw):
    snapshot = draw(snapshots(quotas=False))
    racks = sorted({node.domains["rack"] for node in snapshot.nodes})
    reservations = []
    for index in range(draw(st.integers(1, 2))):
        reservations.append(
            Reservation(
                f"res{index}",
                draw(st.sampled_from(("team1", "team2"))),
                draw(st.sampled_from(("h100", "a100"))),
                draw(st.integers(1, 8)),
                domain={"rack": draw(st.sampled_from(racks))},
                start=NOW + draw(st.sampled_from((10.0, 100.0, 1000.0))),
                end=NOW + 5000.0,
            )
        )
    pending = tuple(
        replace(
            workload,
            submitted=NOW - 1,
            expected_duration=draw(st.sampled_from((None, 5.0, 50.0, 500.0))),
            preemptible=draw(st.sampled_from((None, True))),
        )
        for workload in snapshot.pending
    )
    return replace(snapshot, reservations=tuple(reservations), pending=pending, now=NOW)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_windows())
def test_it_never_places_work_that_would_overrun_a_window_on_its_nodes(snapshot):
    result = decide(snapshot)
    assert_valid_result(snapshot, result)
    state = CapacityState.for_cycle(
        snapshot, ClassMatcher(snapshot.device_classes), tuple(sorted(c.name for c in snapshot.device_classes))
    )
    windows = future_windows(state, snapshot)
    window_nodes = [(window.reservation, {state.node_names[node] for node in window.nodes}) for window in windows]
    state.retire()
    queues = {queue.name: queue for queue in snapshot.queues}
    workloads = {workload.id: workload for workload in snapshot.pending}
    for admission in result.admissions:
        workload = workloads[admission.workload_id]
        team = workload.team or queues[workload.queue].team
        if workload.preemptible:
            continue
        duration = workload.expected_duration
        for reservation, nodes in window_nodes:
            if reservation.team == team or (duration is not None and NOW + duration <= reservation.start):
                continue
            placed = {pod.node for pod in admission.pods}
            assert not placed & nodes, (workload.id, reservation.name, placed & nodes)
