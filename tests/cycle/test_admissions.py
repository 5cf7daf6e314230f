"""Admissions written while the core decides (broker.cycle.admissions): the batches sent during the
decision write what a commit after it would, and a refusal or a failure leaves none of them behind."""

import threading

import pytest
from django.db import connection

from broker.cycle import admissions
from broker.cycle.runner import run_once
from broker.inventory.models import Device, Health
from broker.scheduler.cycle import decide
from broker.workloads.models import (
    Allocation,
    Explanation,
    ExplanationChange,
    SchedulingCycle,
    Workload,
    WorkloadTransition,
)
from broker.workloads.states import State
from tests.cycle.helpers import pending

on_postgresql = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="SQLite writes the admissions after the decision, by design"
)


@pytest.fixture
def batches_of_one(monkeypatch):
    """Every admission is a batch of its own: a small cluster's cycle then streams."""
    monkeypatch.setattr(admissions, "FIRST_ADMISSION_BATCH", 1)
    monkeypatch.setattr(admissions, "ADMISSION_BATCH", 1)


@pytest.fixture
def events(monkeypatch):
    """'sent' when a batch goes to the background, 'decided' when the core returns."""
    seen = []
    background = admissions.Background

    def sending(work, after=None):
        seen.append("sent")
        return background(work, after=after)

    monkeypatch.setattr(admissions, "Background", sending)
    return seen


def two_that_fit(cluster):
    return [
        pending(cluster.queue_a, "first", replicas=1, devices_per_pod=4, resource_class=cluster.training),
        pending(cluster.queue_b, "second", replicas=2, devices_per_pod=2, resource_class=cluster.training),
    ]


def in_another_connection(action):
    outcome = {}

    def target():
        try:
            outcome["value"] = action()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the other connection waited for the cycle"
    return outcome.get("value")


def assert_nothing_admitted(workloads):
    for workload in workloads:
        workload.refresh_from_db()
        assert workload.state == State.PENDING
    assert not Allocation.objects.exists()
    assert not WorkloadTransition.objects.filter(to_state=State.ADMITTED).exists()
    assert not ExplanationChange.objects.filter(reason="Admitted").exists()


def test_it_writes_each_batch_while_the_core_decides_the_next(cluster, batches_of_one, events):
    """On PostgreSQL; SQLite (the embedded default) writes them all once the decision is done."""
    workloads = two_that_fit(cluster)
    Explanation.objects.create(workload=workloads[0], reason="QuotaExceeded", message="said last cycle")

    def deciding(snapshot, **options):
        result = decide(snapshot, **options)
        events.append("decided")
        return result

    run = run_once(decider=deciding)

    assert events == (["sent", "sent", "decided"] if connection.vendor == "postgresql" else ["decided"])
    assert run.admitted == tuple(sorted(w.pk for w in workloads))
    reason = f"admitted in cycle {run.cycle_id}"
    for workload in workloads:
        workload.refresh_from_db()
        assert (workload.state, workload.chosen_device_class_id) == (State.ADMITTED, cluster.h100.pk)
        assert list(workload.transitions.values_list("from_state", "to_state", "reason")) == [
            (State.PENDING, State.ADMITTED, reason)
        ]
        allocations = Allocation.objects.filter(workload=workload)
        assert allocations.count() == 4
        assert {a.cycle_id for a in allocations} == {run.cycle_id}
        assert {(a.pod_set, a.released_at) for a in allocations} == {("main", None)}
    assert sorted(Allocation.objects.filter(workload=workloads[1]).values_list("pod_index", flat=True)) == [0, 0, 1, 1]
    history = ExplanationChange.objects.filter(reason="Admitted").order_by("workload_id")
    assert [(h.workload_id, h.cycle_id) for h in history] == [(w.pk, run.cycle_id) for w in workloads]
    assert history[0].message.startswith("admitted: 1 pods, 4 h100 devices in ")
    assert not Explanation.objects.exists()


@on_postgresql
def test_it_sends_small_first_batches_so_the_database_starts_early(cluster, events, monkeypatch):
    monkeypatch.setattr(admissions, "FIRST_ADMISSION_BATCH", 1)
    monkeypatch.setattr(admissions, "ADMISSION_BATCH", 3)
    workloads = [
        pending(cluster.queue_a, f"small-{index}", devices_per_pod=1, resource_class=cluster.training)
        for index in range(8)
    ]
    sizes = []
    send = admissions.AdmissionWriter._send
    monkeypatch.setattr(
        admissions.AdmissionWriter, "_send", lambda self, batch: sizes.append(len(batch)) or send(self, batch)
    )

    def deciding(snapshot, **options):
        result = decide(snapshot, **options)
        events.append("decided")
        return result

    run = run_once(decider=deciding)

    # Batches of 1, 2, then 3 (the most) while the core decides; the last 2 once it is done.
    assert events == ["sent", "sent", "sent", "decided", "sent"]
    assert sizes == [1, 2, 3, 2]
    assert run.admitted == tuple(sorted(w.pk for w in workloads))
    assert set(Workload.objects.values_list("state", flat=True)) == {State.ADMITTED}


@on_postgresql
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_undoes_the_batches_sent_when_the_inventory_changed_meanwhile(cluster, batches_of_one, events):
    workloads = two_that_fit(cluster)

    def decide_then_break_a_device(snapshot, **options):
        result = decide(snapshot, **options)
        node, name = result.admissions[0].pods[0].device_ids[0].split("/")
        in_another_connection(lambda: Device.objects.filter(node__name=node, name=name).update(health=Health.UNHEALTHY))
        return result

    run = run_once(decider=decide_then_break_a_device)

    assert events == ["sent", "sent"]
    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert cycle.outcome == SchedulingCycle.Outcome.REFUSED
    assert "changed after the snapshot" in cycle.detail
    assert_nothing_admitted(workloads)


@on_postgresql
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_refuses_when_a_workload_changed_before_its_batch_was_sent(cluster, batches_of_one):
    workloads = two_that_fit(cluster)

    def decide_changing_the_first_admitted(snapshot, on_admission):
        def admitted(admission):
            if admission.workload_id == str(workloads[0].pk):
                in_another_connection(lambda: Workload.objects.filter(pk=workloads[0].pk).update(priority=7))
            on_admission(admission)

        return decide(snapshot, on_admission=admitted)

    run = run_once(decider=decide_changing_the_first_admitted)

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert (cycle.outcome, cycle.admitted_count) == (SchedulingCycle.Outcome.REFUSED, 0)
    assert "changed after the snapshot" in cycle.detail
    assert_nothing_admitted(workloads)
    assert Workload.objects.get(pk=workloads[0].pk).priority == 7
    assert run_once().admitted == tuple(sorted(w.pk for w in workloads))


def test_it_undoes_the_batches_sent_when_the_decision_then_fails(cluster, batches_of_one):
    workloads = two_that_fit(cluster)

    def decide_then_crash(snapshot, **options):
        decide(snapshot, **options)
        raise RuntimeError("core bug")

    run = run_once(decider=decide_then_crash)

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert (cycle.outcome, cycle.detail) == (SchedulingCycle.Outcome.FAILED, "decide: RuntimeError: core bug")
    assert_nothing_admitted(workloads)


@pytest.mark.parametrize("batch", [1, admissions.ADMISSION_BATCH], ids=["while deciding", "after deciding"])
def test_it_fails_the_commit_not_the_decision_when_a_batch_cannot_be_built(cluster, batch, monkeypatch):
    monkeypatch.setattr(admissions, "FIRST_ADMISSION_BATCH", batch)
    monkeypatch.setattr(admissions, "ADMISSION_BATCH", batch)
    workloads = two_that_fit(cluster)

    def broken(admission):
        raise RuntimeError("out of ink")

    monkeypatch.setattr(admissions, "admitted_message", broken)

    run = run_once()

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert (cycle.outcome, cycle.detail) == (SchedulingCycle.Outcome.FAILED, "RuntimeError: out of ink")
    assert_nothing_admitted(workloads)


def test_it_refuses_to_write_an_admission_the_result_does_not_hold(cluster, batches_of_one):
    workloads = two_that_fit(cluster)

    def decide_then_drop_one(snapshot, **options):
        result = decide(snapshot, **options)
        return type(result)(admissions=result.admissions[1:], preemptions=result.preemptions, pending=result.pending)

    run = run_once(decider=decide_then_drop_one)

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert cycle.outcome == SchedulingCycle.Outcome.FAILED
    assert "admissions that its result does not hold" in cycle.detail
    assert_nothing_admitted(workloads)
