import gc
import threading

import pytest
from django.db import connection
from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.cycle import commit as commit_module
from broker.cycle import runner as runner_module
from broker.cycle.commit import StaleSnapshot, commit_result, decide_and_commit
from broker.cycle.loader import load_snapshot
from broker.cycle.runner import run_once
from broker.inventory.models import ClusterState, Device, Health
from broker.scheduler.cycle import decide
from broker.workloads.models import Allocation, Explanation, ExplanationChange, SchedulingCycle, Workload
from broker.workloads.states import State
from tests.cycle.helpers import pending, preempting_within, rack_devices, running


def test_it_admits_a_fitting_gang_and_explains_one_that_cannot_fit(cluster):
    fits = pending(cluster.queue_a, "fits", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    too_big = pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)

    run = run_once()

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert cycle.outcome == SchedulingCycle.Outcome.COMMITTED
    assert (cycle.admitted_count, cycle.pending_count) == (1, 2)
    assert run.admitted == (fits.pk,)
    fits.refresh_from_db()
    assert fits.state == State.ADMITTED
    assert fits.chosen_device_class == cluster.h100
    allocations = Allocation.objects.filter(workload=fits, released_at__isnull=True)
    assert allocations.count() == 8
    racks = {allocation.device.node.domain.name for allocation in allocations}
    assert len(racks) == 1, "rack required: the whole gang in one rack"
    assert sorted({a.pod_index for a in allocations}) == [0, 1]
    assert fits.transitions.filter(from_state=State.PENDING, to_state=State.ADMITTED).exists()

    too_big.refresh_from_db()
    assert too_big.state == State.PENDING
    explanation = Explanation.objects.get(workload=too_big)
    assert explanation.reason == "InvalidRequest"
    assert explanation.message
    assert explanation.cycle == cycle
    assert ExplanationChange.objects.filter(workload=too_big).count() == 1


def test_it_appends_explanation_history_only_when_the_reason_or_message_changes(cluster):
    waiting = pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)
    run_once()
    run_once()
    assert ExplanationChange.objects.filter(workload=waiting).count() == 1


def test_it_refuses_a_result_when_a_device_went_unhealthy_after_the_load(cluster):
    workload = pending(cluster.queue_a, "fits", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    (admission,) = result.admissions
    node, name = admission.pods[0].device_ids[0].split("/")
    # A plain UPDATE: no signal, no generation bump; the commit's own device check must catch it.
    Device.objects.filter(node__name=node, name=name).update(health=Health.UNHEALTHY)
    cycle = SchedulingCycle.objects.create()

    with pytest.raises(StaleSnapshot, match="Unhealthy"):
        commit_result(result, loaded, cycle)

    cycle.refresh_from_db()
    assert cycle.outcome == SchedulingCycle.Outcome.REFUSED
    assert not Allocation.objects.exists()
    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert not ExplanationChange.objects.exists()


def test_it_refuses_a_result_when_the_inventory_generation_moved(cluster):
    pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    ClusterState.bump()
    cycle = SchedulingCycle.objects.create()

    with pytest.raises(StaleSnapshot, match="generation"):
        commit_result(result, loaded, cycle)
    assert not Allocation.objects.exists()


def test_it_refuses_a_result_placing_a_device_another_writer_allocated_meanwhile(cluster):
    """The unique index on active allocations refuses it; on PostgreSQL the refusal names the device."""
    workload = pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    other = pending(cluster.queue_b, "by-hand", replicas=1, devices_per_pod=1, resource_class=cluster.training)
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    (admission,) = [a for a in result.admissions if a.workload_id == str(workload.pk)]
    taken = admission.pods[0].device_ids[-1]
    Allocation.objects.create(
        workload=other, device_id=loaded.device_pks[taken], device_class=cluster.h100, pod_set="main", pod_index=0
    )
    cycle = SchedulingCycle.objects.create()

    expected = f"device {taken} was allocated meanwhile" if connection.vendor == "postgresql" else "refused a write"
    with pytest.raises(StaleSnapshot, match=expected):
        commit_result(result, loaded, cycle)

    cycle.refresh_from_db()
    assert cycle.outcome == SchedulingCycle.Outcome.REFUSED
    assert list(Allocation.objects.values_list("workload_id", flat=True)) == [other.pk]
    workload.refresh_from_db()
    assert workload.state == State.PENDING


def test_it_refuses_a_result_for_a_workload_that_was_cancelled_meanwhile(cluster):
    workload = pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    snapshot, loaded = load_snapshot(timezone.now())
    result = decide(snapshot)
    Workload.objects.filter(pk=workload.pk).update(state=State.CANCELLED)

    with pytest.raises(StaleSnapshot, match="Cancelled"):
        commit_result(result, loaded, SchedulingCycle.objects.create())
    assert not Allocation.objects.exists()


def test_it_leaves_nothing_applied_when_the_commit_fails_midway(cluster, monkeypatch):
    workload = pending(cluster.queue_a, "fits", replicas=2, devices_per_pod=4, resource_class=cluster.training)

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    # Allocations and the state change are written before explanations: all must roll back.
    monkeypatch.setattr(commit_module, "explain", broken)
    run = run_once()

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert cycle.outcome == SchedulingCycle.Outcome.FAILED
    assert "disk on fire" in cycle.detail
    assert not Allocation.objects.exists()
    workload.refresh_from_db()
    assert workload.state == State.PENDING
    assert not workload.transitions.filter(to_state=State.ADMITTED).exists()


def test_it_evicts_victims_gracefully_and_admits_the_preemptor_once_they_are_gone(cluster, settings):
    from datetime import timedelta

    from broker.cycle.executor import SimulatedExecutor

    settings.EVICTION_GRACE_SECONDS = 60  # one second of wall time at 60x
    preempting_within(cluster.queue_a)
    rack_1, rack_2 = rack_devices("r1"), rack_devices("r2")
    hog = running(cluster.queue_a, "hog", rack_1, cluster.h100, resource_class=cluster.training, priority=1)
    running(cluster.queue_a, "steady", rack_2, cluster.h100, priority=500, preemptible=False)
    claimant = pending(
        cluster.queue_a, "claimant", replicas=2, devices_per_pod=4, resource_class=cluster.training, priority=100
    )
    start = timezone.now()

    # 1. The cycle chooses the victim: it is asked to leave and keeps its devices meanwhile.
    run = run_once(now=start)

    assert run.preempted == (hog.pk,)
    hog.refresh_from_db()
    assert hog.state == State.RUNNING and hog.evicting
    assert (hog.evicted_for, hog.eviction_rule) == (claimant, "WithinQueue")
    assert Allocation.objects.filter(workload=hog, released_at__isnull=True).count() == 8
    event = AuditEvent.objects.get(action="workload.preempt", target_id=str(hog.pk))
    assert event.reason.startswith("WithinQueue")
    assert event.after["preemptor"] == claimant.pk
    told = ExplanationChange.objects.get(workload=hog, reason="Preempted").message
    assert told.startswith("Preempted by team-a/claimant (priority 100) under rule WithinQueue: ")
    claimant.refresh_from_db()
    assert claimant.nominated_devices == sorted(device.pk for device in rack_1)
    explanation = Explanation.objects.get(workload=claimant)
    assert explanation.reason == "PreemptionPending"
    assert f"waiting for 1 victim to leave: {hog} (WithinQueue, priority 1)" in explanation.message

    # 2. While it shuts down the core sees it evicting for the claimant: no new victims, still waiting.
    snapshot, _ = load_snapshot(start + timedelta(milliseconds=500))
    leaving = next(workload for workload in snapshot.running if workload.id == str(hog.pk))
    assert (leaving.evicting, leaving.evicted_for) == (True, str(claimant.pk))
    second = run_once(now=start + timedelta(milliseconds=500))
    assert (second.preempted, second.admitted) == ((), ())
    explanation = Explanation.objects.get(workload=claimant)
    assert explanation.reason == "PreemptionPending"
    assert f"{hog} (being evicted)" in explanation.message

    # 3. The executor stops it after the grace period: devices released, Preempted, requeued, audited.
    executor = SimulatedExecutor(speed=60)
    assert executor.advance(start + timedelta(milliseconds=900)).evicted == []
    assert executor.advance(start + timedelta(seconds=1)).evicted == [hog.pk]
    hog.refresh_from_db()
    assert hog.state == State.PENDING
    assert not Allocation.objects.filter(workload=hog, released_at__isnull=True).exists()
    assert list(hog.transitions.values_list("to_state", flat=True))[-2:] == [State.PREEMPTED, State.PENDING]
    evicted = AuditEvent.objects.get(action="workload.evicted", target_id=str(hog.pk))
    assert (evicted.after["rule"], evicted.after["preemptor"]) == ("WithinQueue", claimant.pk)
    assert hog.preemption_count == 1
    requeued = ExplanationChange.objects.get(workload=hog, reason="Requeued").message
    assert requeued.endswith("the restart from its last checkpoint loses about 60 s of 8 devices' work")

    # 4. A rival ordered first (its queue uses nothing) may not take the devices freed for the claimant.
    rival = pending(cluster.queue_b, "rival", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    third = run_once(now=start + timedelta(seconds=2))
    assert third.admitted == (claimant.pk,)
    assert Explanation.objects.get(workload=rival).reason != "PreemptionPending"
    claimant.refresh_from_db()
    assert claimant.nominated_devices == []
    assert set(Allocation.objects.filter(workload=claimant).values_list("device_id", flat=True)) == {
        device.pk for device in rack_1
    }


def test_it_no_longer_preempts_a_workload_preempted_as_often_as_the_bound_allows(cluster, settings):
    preempting_within(cluster.queue_a)
    hog = running(cluster.queue_a, "hog", rack_devices("r1"), cluster.h100, resource_class=cluster.training, priority=1)
    running(cluster.queue_a, "steady", rack_devices("r2"), cluster.h100, priority=500, preemptible=False)
    pending(cluster.queue_a, "claimant", replicas=2, devices_per_pod=4, resource_class=cluster.training, priority=100)
    Workload.objects.filter(pk=hog.pk).update(preemption_count=2)
    settings.PREEMPTION_MAX_PER_WORKLOAD = 2

    snapshot, _ = load_snapshot(timezone.now())
    assert next(w for w in snapshot.running if w.id == str(hog.pk)).preemptions == 2
    assert run_once().preempted == ()

    settings.PREEMPTION_MAX_PER_WORKLOAD = 3
    assert run_once().preempted == (hog.pk,)


def test_it_runs_a_whole_cycle_without_the_cyclic_collector_and_turns_it_back_on(cluster, monkeypatch):
    pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    seen = []

    def deciding(snapshot, **options):
        seen.append(("decide", gc.isenabled()))
        return decide(snapshot, **options)

    def committing(*args):
        seen.append(("commit", gc.isenabled()))
        return decide_and_commit(*args)

    monkeypatch.setattr(runner_module, "decide_and_commit", committing)
    monkeypatch.setattr(
        runner_module, "load_snapshot", lambda now: seen.append(("load", gc.isenabled())) or load_snapshot(now)
    )

    run_once(decider=deciding)

    assert seen == [("load", False), ("commit", False), ("decide", False)]
    assert gc.isenabled()


def test_it_broadcasts_a_compact_delta_after_commit(cluster, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr(commit_module, "broadcast", sent.append)
    fits = pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    waiting = pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)

    with django_capture_on_commit_callbacks(execute=True):
        run = run_once()

    assert sent == [
        {
            "type": "cycle.committed",
            "cycle": run.cycle_id,
            "admitted": [fits.pk],
            "preempted": [],
            "explanations": [waiting.pk],
        }
    ]


def test_it_broadcasts_to_the_cycle_group_on_the_channel_layer(settings):
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("cycle", channel)

    commit_module.broadcast({"type": "cycle.committed", "cycle": 7, "admitted": [], "preempted": []})

    assert async_to_sync(layer.receive)(channel)["cycle"] == 7


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_refuses_on_postgresql_when_a_row_changed_after_the_snapshot(cluster):
    """REPEATABLE READ: the cycle cannot see the other connection's change, the locking read fails."""
    if connection.vendor != "postgresql":
        pytest.skip("the REPEATABLE READ path is PostgreSQL's")
    workload = pending(cluster.queue_a, "fits", replicas=2, devices_per_pod=4, resource_class=cluster.training)

    def decide_then_break_a_device(snapshot, **options):
        result = decide(snapshot)
        node, name = result.admissions[0].pods[0].device_ids[0].split("/")
        in_another_connection(lambda: Device.objects.filter(node__name=node, name=name).update(health=Health.UNHEALTHY))
        return result

    run = run_once(decider=decide_then_break_a_device)

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert cycle.outcome == SchedulingCycle.Outcome.REFUSED
    assert "changed after the snapshot" in cycle.detail
    assert not Allocation.objects.exists()
    workload.refresh_from_db()
    assert workload.state == State.PENDING


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_refuses_when_a_workload_it_admits_changed_after_the_snapshot(cluster):
    """The admission's UPDATE runs in a helper thread (bulk.Background); its serialization failure is
    still the cycle's stale-snapshot refusal, and nothing it wrote stays."""
    if connection.vendor != "postgresql":
        pytest.skip("the REPEATABLE READ path is PostgreSQL's")
    workload = pending(cluster.queue_a, "fits", replicas=2, devices_per_pod=4, resource_class=cluster.training)

    def decide_then_reprioritise(snapshot, **options):
        result = decide(snapshot)
        in_another_connection(lambda: Workload.objects.filter(pk=workload.pk).update(priority=7))
        return result

    run = run_once(decider=decide_then_reprioritise)

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert (cycle.outcome, cycle.admitted_count) == (SchedulingCycle.Outcome.REFUSED, 0)
    assert "changed after the snapshot" in cycle.detail
    workload.refresh_from_db()
    assert (workload.state, workload.priority) == (State.PENDING, 7)
    assert not Allocation.objects.exists()
    assert not workload.transitions.exists()
    assert run_once().admitted == (workload.pk,)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_refuses_when_a_workload_it_explains_was_deleted_after_the_snapshot(cluster):
    """The explanation's insert trigger share-locks the workloads it names (migration workloads 0017):
    the locking read of one deleted since the REPEATABLE READ snapshot fails inside the commit, so the
    cycle row survives and says Refused, and no explanation of the deleted workload is left behind."""
    if connection.vendor != "postgresql":
        pytest.skip("the REPEATABLE READ path is PostgreSQL's")
    waiting = pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)

    def decide_then_delete_the_workload(snapshot, **options):
        result = decide(snapshot)
        assert [decision.workload_id for decision in result.pending] == [str(waiting.pk)]
        in_another_connection(lambda: Workload.objects.filter(pk=waiting.pk).delete())
        return result

    run = run_once(decider=decide_then_delete_the_workload)

    cycle = SchedulingCycle.objects.get(pk=run.cycle_id)
    assert cycle.outcome == SchedulingCycle.Outcome.REFUSED
    assert not Workload.objects.filter(pk=waiting.pk).exists()
    assert not Explanation.objects.exists()
    assert run_once().outcome == SchedulingCycle.Outcome.COMMITTED


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_runs_one_cycle_at_a_time(cluster):
    """While one cycle holds the lock (on its own connection), a second finds it held and does nothing."""
    pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    inside = threading.Event()
    release = threading.Event()
    outcome = {}

    def slow_decide(snapshot, **options):
        inside.set()
        release.wait(10)
        return decide(snapshot)

    def first():
        try:
            outcome["first"] = run_once(decider=slow_decide)
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    try:
        assert run_once() is None
    finally:
        release.set()
        thread.join(10)
    assert outcome["first"].outcome == SchedulingCycle.Outcome.COMMITTED
    assert SchedulingCycle.objects.count() == 1
    assert run_once() is not None, "the lock goes away with the first cycle's transaction"


def in_another_connection(action):
    def target():
        try:
            action()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(10)


def test_it_samples_capacity_for_finance_after_a_committed_cycle(cluster, django_capture_on_commit_callbacks):
    from broker.costs.models import CapacitySample

    pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    Device.objects.filter(pk=Device.objects.order_by("pk").last().pk).update(health=Health.UNHEALTHY)

    with django_capture_on_commit_callbacks(execute=True):
        run_once()

    sample = CapacitySample.objects.get(device_class=cluster.h100)
    assert sample.total == 16
    assert sample.unhealthy == 1


def frozen_calls(monkeypatch):
    from broker.cycle import runner

    calls = []
    monkeypatch.setattr(runner.gc, "collect", lambda *args: calls.append("collect"))
    monkeypatch.setattr(runner.gc, "freeze", lambda: calls.append("freeze"))
    return calls


def test_it_freezes_a_large_inventory_once_after_the_cycle_that_read_it(cluster, settings, monkeypatch):
    from broker.cycle.loader import forget_everything_loaded

    settings.GC_FREEZE_MIN_DEVICES = 16  # the small cluster counts as large here
    forget_everything_loaded()
    calls = frozen_calls(monkeypatch)

    run_once()
    after_first = list(calls)
    run_once()  # the same inventory: nothing new to freeze

    assert after_first == ["collect", "freeze"]
    assert calls == after_first


def test_it_leaves_the_collector_alone_for_a_small_inventory(cluster, settings, monkeypatch):
    from broker.cycle.loader import forget_everything_loaded

    settings.GC_FREEZE_MIN_DEVICES = 17  # one more than the cluster has
    forget_everything_loaded()
    calls = frozen_calls(monkeypatch)

    run_once()

    assert calls == []


STARTED = timezone.now() - timezone.timedelta(minutes=5)


def test_it_freezes_again_after_a_cycle_that_renewed_large_record_sets(cluster, settings, monkeypatch):
    from broker.cycle.loader import forget_everything_loaded

    settings.GC_FREEZE_MIN_DEVICES = 0  # the inventory alone never triggers it
    settings.GC_FREEZE_MIN_RECORDS = 4
    forget_everything_loaded()
    for index in range(2):
        pending(cluster.queue_a, f"w{index}", replicas=3, devices_per_pod=8)  # too big to be admitted
    # Started at a known time: a record of one that started "now" is built anew each load, not kept.
    running(cluster.queue_b, "holder", list(Device.objects.order_by("pk")[:1]), cluster.h100, started_at=STARTED)
    calls = frozen_calls(monkeypatch)

    run_once()  # two pending records and one running kept: three
    after_first = list(calls)
    pending(cluster.queue_a, "w2", replicas=3, devices_per_pod=8)
    run_once()  # the pending set renewed (three), the running one taken as it was
    after_second = list(calls)
    pending(cluster.queue_a, "w3", replicas=3, devices_per_pod=8)
    run_once()  # the pending set renewed: four
    after_third = list(calls)
    run_once()  # nothing changed: both sets taken as they were

    assert after_first == after_second == []
    assert after_third == ["collect", "freeze"]
    assert calls == after_third


def test_it_counts_the_records_of_the_sets_a_load_kept_anew(cluster):
    from broker.cycle.loader import PENDING_RECORDS, RUNNING_RECORDS, forget_everything_loaded

    forget_everything_loaded()
    pending(cluster.queue_a, "waiting", replicas=3, devices_per_pod=8)
    running(cluster.queue_b, "holder", list(Device.objects.order_by("pk")[:1]), cluster.h100, started_at=STARTED)

    load_snapshot(timezone.now())
    kept_first = (PENDING_RECORDS.take_renewed(), RUNNING_RECORDS.take_renewed())
    load_snapshot(timezone.now())
    kept_again = (PENDING_RECORDS.take_renewed(), RUNNING_RECORDS.take_renewed())
    pending(cluster.queue_a, "another", replicas=3, devices_per_pod=8)
    load_snapshot(timezone.now())
    kept_after_a_submission = (PENDING_RECORDS.take_renewed(), RUNNING_RECORDS.take_renewed())
    load_snapshot(timezone.now())
    forget_everything_loaded()

    assert kept_first == (1, 1)
    assert kept_again == (0, 0)
    assert kept_after_a_submission == (2, 0)
    assert (PENDING_RECORDS.take_renewed(), RUNNING_RECORDS.take_renewed()) == (0, 0)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("table", ["inventory_device", "workloads_workload"])
def test_it_makes_a_deletion_that_starts_during_its_commit_wait_and_then_fail(cluster, monkeypatch, table):
    """No foreign key share-locks the allocated rows (migration workloads 0016): the commit's own locks
    (the admitted workload's row, the inventory revision row) make the deletion wait, and the deletion
    check then sees the committed allocations."""
    import psycopg

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    workload = pending(cluster.queue_a, "fits", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    params = connection.get_connection_params()
    outcome = {}
    real_check = commit_module.check_constraints_now

    def delete(pk):
        try:
            with psycopg.connect(**params) as deleter:
                deleter.execute("SET lock_timeout = '20s'")
                deleter.execute(f"DELETE FROM {table} WHERE id = %s", [pk])
            outcome["deleted"] = True
        except psycopg.Error as error:
            outcome["refused"] = error

    def delete_while_committing():
        device_pk = Allocation.objects.filter(workload=workload).values_list("device_id", flat=True).first()
        deleter = threading.Thread(target=delete, args=[device_pk if table == "inventory_device" else workload.pk])
        deleter.start()
        outcome["thread"] = deleter
        assert waits_for_a_lock(params, f"DELETE FROM {table}"), "the deletion did not wait for the commit"
        real_check()

    monkeypatch.setattr(commit_module, "check_constraints_now", delete_while_committing)
    run = run_once()
    outcome["thread"].join(30)

    assert run.outcome == SchedulingCycle.Outcome.COMMITTED
    assert "deleted" not in outcome
    assert isinstance(outcome["refused"], psycopg.errors.ForeignKeyViolation)
    assert "is named by allocations" in str(outcome["refused"])
    assert Allocation.objects.filter(workload=workload, released_at__isnull=True).count() == 4
    assert Device.objects.filter(pk__in=Allocation.objects.values("device_id")).count() == 4


def waits_for_a_lock(params, statement, seconds=10):
    import time

    import psycopg

    with psycopg.connect(**params, autocommit=True) as watcher:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                [statement + "%"],
            ).fetchone()[0]
            if waiting:
                return True
            time.sleep(0.02)
    return False
