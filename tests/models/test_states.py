import pytest

from broker.workloads.states import FINAL_STATES, InvalidTransition, State
from tests.builders import make_workload


def test_it_walks_the_happy_path_with_timestamps(cluster, alice):
    workload = make_workload(cluster.queue_a)
    for target in (State.PENDING, State.ADMITTED, State.RUNNING, State.SUCCEEDED):
        workload.transition(target, actor=alice)
    workload.refresh_from_db()
    assert workload.state == State.SUCCEEDED
    assert workload.admitted_at <= workload.started_at <= workload.finished_at
    assert [t.to_state for t in workload.transitions.all()] == ["Pending", "Admitted", "Running", "Succeeded"]
    assert workload.transitions.first().actor == alice


def test_it_refuses_skipping_admission(cluster):
    workload = make_workload(cluster.queue_a)
    workload.transition(State.PENDING)
    with pytest.raises(InvalidTransition, match="A Pending workload cannot become Running"):
        workload.transition(State.RUNNING)
    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert workload.transitions.count() == 1


@pytest.mark.parametrize("final", sorted(FINAL_STATES))
def test_it_keeps_final_states_final(cluster, final):
    workload = make_workload(cluster.queue_a, state=final)
    with pytest.raises(InvalidTransition, match="final state"):
        workload.transition(State.PENDING)


def test_it_requeues_a_preempted_workload(cluster):
    workload = make_workload(cluster.queue_a, state=State.RUNNING)
    workload.transition(State.PREEMPTED, reason="preempted by team-b/urgent")
    workload.transition(State.PENDING)
    assert workload.finished_at is None
