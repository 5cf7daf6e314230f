"""The change log (workloads migration 0018, broker.workloads.changes) and the loads that patch their kept
records with it: the triggers log what each write touched, a load reads the rows of those workloads only,
and whatever was written, the snapshot equals the one a worker that just started would read."""

import random
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from broker.cycle import loader
from broker.cycle.loader import BuiltFromRows, load_snapshot
from broker.cycle.runner import run_once
from broker.governance.models import ApprovalRequest
from broker.inventory.models import Device
from broker.policy.models import Queue
from broker.workloads import changes
from broker.workloads.models import Allocation, ApprovalState, PodSet, Workload
from broker.workloads.states import State
from tests.cycle.helpers import pending, running

pytestmark = [
    pytest.mark.skipif(
        settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
        reason="the change log is PostgreSQL's; SQLite reads every workload each load",
    ),
    # Every write committed on its own, as the API, the executor and the cycle write.
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
    # Horizons are the server's oldest open transaction: nothing else may hold one (cycle/conftest.py).
    pytest.mark.usefixtures("quiet_server"),
]


def log_rows():
    """Every log row, oldest first: a sorted tuple of ids, or None for "everything"."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT workload_ids FROM workloads_change_log ORDER BY xid, written_at")
        return [None if ids is None else tuple(sorted(ids)) for (ids,) in cursor.fetchall()]


def clear_log():
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM workloads_change_log")


@pytest.fixture
def patch_anything(monkeypatch):
    """Patch however much was written, as a load does when it keeps tens of thousands of records."""
    monkeypatch.setattr(loader, "LARGEST_RECORDS_PATCH", 10**9)


# --- the triggers --------------------------------------------------------------------------------------


def test_it_logs_the_workloads_each_statement_writes(committed_cluster):
    clear_log()
    first = pending(committed_cluster.queue_a, "first")  # the workload, then its pod set
    second = pending(committed_cluster.queue_a, "second")
    Workload.objects.filter(pk__in=[first.pk, second.pk]).update(priority=5)
    device = Device.objects.order_by("pk").first()
    Allocation.objects.create(
        workload=first, device=device, device_class=committed_cluster.h100, pod_set="main", pod_index=0
    )
    Allocation.objects.filter(workload=first).update(released_at=timezone.now())
    PodSet.objects.filter(workload=second).update(replicas=3)
    Workload.objects.filter(pk=second.pk).delete()  # its pod set first (cascade), then the row

    assert log_rows() == [
        (first.pk,),
        (first.pk,),
        (second.pk,),
        (second.pk,),
        (first.pk, second.pk),
        (first.pk,),
        (first.pk,),
        (second.pk,),
        (second.pk,),
        (second.pk,),
    ]


def test_it_logs_an_approval_request_under_its_workload(committed_cluster):
    waiting = pending(committed_cluster.queue_a, "big", resource_class=committed_cluster.reserved)
    clear_log()

    request = ApprovalRequest.objects.create(workload=waiting, due_at=timezone.now())
    ApprovalRequest.objects.filter(pk=request.pk).update(not_before=timezone.now())

    assert log_rows() == [(waiting.pk,), (waiting.pk,)]


def test_it_logs_everything_for_a_rename_the_loaded_rows_carry(committed_cluster):
    clear_log()

    Queue.objects.filter(pk=committed_cluster.queue_a.pk).update(nominal_quota={"h100": 4})
    assert log_rows() == []  # a quota edit changes no workload row the loader reads
    Queue.objects.filter(pk=committed_cluster.queue_a.pk).update(name="team-a-renamed")
    committed_cluster.training.name = "training-renamed"
    committed_cluster.training.save()

    assert log_rows() == [None, None]


def test_it_logs_everything_for_a_truncate(committed_cluster):
    pending(committed_cluster.queue_a, "gone")
    clear_log()

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workloads_workload, workloads_podset CASCADE")

    assert None in log_rows()


def test_it_logs_nothing_for_a_statement_that_writes_no_row(committed_cluster):
    clear_log()

    Workload.objects.filter(pk=-1).update(priority=1)

    assert log_rows() == []


def test_it_stores_the_ids_uncompressed(committed_cluster):
    """An admission logs 20,000 ids in one array: compressed, it cost 40 ms of the commit; stored as is, 6."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = 'workloads_change_log'::regclass "
            "AND attname = 'workload_ids'"
        )
        assert cursor.fetchone() == ("e",)


# --- reading it ----------------------------------------------------------------------------------------


def test_it_reads_what_was_written_after_the_horizon(committed_cluster):
    before = pending(committed_cluster.queue_a, "before")
    horizon = changes.current_horizon()
    after = pending(committed_cluster.queue_a, "after")
    Workload.objects.filter(pk=before.pk).update(priority=3)

    written = changes.written_since(horizon, changes.current_horizon())

    assert written == {after.pk, before.pk}


def test_it_counts_the_transactions_own_writes_as_unseen(committed_cluster):
    with transaction.atomic():
        written_first = pending(committed_cluster.queue_a, "mine")
        horizon = changes.current_horizon()
        Workload.objects.filter(pk=written_first.pk).update(priority=4)
        assert written_first.pk in changes.written_since(horizon, changes.current_horizon())


def test_it_cannot_tell_without_a_horizon_or_across_logs(committed_cluster):
    now_at = changes.current_horizon()

    assert changes.written_since(None, now_at) is None
    assert changes.written_since(changes.Horizon("another-database", now_at.xid), now_at) is None


def test_it_names_the_database_and_the_server_run_in_the_horizon(committed_cluster):
    """A copy restored elsewhere carries the log's token, but its transaction ids are another server's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        oid = cursor.fetchone()[0]
        cursor.execute("SELECT token::text FROM workloads_change_log_state")
        token = cursor.fetchone()[0]

    parts = changes.current_horizon().token.split("/")

    assert parts[:2] == [token, str(oid)] and len(parts) == 3


def test_it_cannot_tell_once_the_log_was_pruned_past_the_horizon(committed_cluster):
    horizon = changes.current_horizon()
    pending(committed_cluster.queue_a, "old")

    pruned = changes.prune(timezone.now() + changes.KEPT_FOR + timedelta(seconds=1))

    assert pruned >= 2
    assert log_rows() == []
    assert changes.written_since(horizon, changes.current_horizon()) is None
    assert changes.written_since(changes.current_horizon(), changes.current_horizon()) == frozenset()


def test_it_keeps_what_is_newer_than_the_period(committed_cluster):
    pending(committed_cluster.queue_a, "recent")
    horizon = changes.current_horizon()
    recent = pending(committed_cluster.queue_a, "newer")

    assert changes.prune(timezone.now()) == 0
    assert changes.written_since(horizon, changes.current_horizon()) == {recent.pk}


def test_it_prunes_at_most_once_a_period_per_process(committed_cluster, monkeypatch):
    monkeypatch.setitem(changes._pruning, "due", None)
    now = timezone.now()

    assert changes.prune_when_due(now) is not None
    assert changes.prune_when_due(now + changes.PRUNE_EVERY / 2) is None
    assert changes.prune_when_due(now + changes.PRUNE_EVERY) is not None


# --- loads that patch ----------------------------------------------------------------------------------


def read_afresh(now):
    """load_snapshot(now) as a worker that kept nothing reads it, leaving this process's kept records
    as they were."""
    kept = loader.PENDING_RECORDS, loader.RUNNING_RECORDS
    loader.PENDING_RECORDS, loader.RUNNING_RECORDS = BuiltFromRows(), BuiltFromRows()
    try:
        with transaction.atomic():
            return load_snapshot(now)
    finally:
        loader.PENDING_RECORDS, loader.RUNNING_RECORDS = kept


def load(now):
    with transaction.atomic():
        return load_snapshot(now)


def assert_read_as_afresh(snapshot, loaded, now):
    fresh, fresh_loaded = read_afresh(now)
    assert snapshot.pending == fresh.pending
    assert snapshot.running == fresh.running
    assert loaded.pending_states == fresh_loaded.pending_states
    assert loaded.nominated_pending == fresh_loaded.nominated_pending
    assert loaded.running_ids == fresh_loaded.running_ids


def test_it_reads_no_workload_row_when_nothing_was_written(committed_cluster, patch_anything):
    pending(committed_cluster.queue_a, "waiting")
    devices = list(Device.objects.order_by("pk")[:2])
    running(committed_cluster.queue_b, "busy", devices, committed_cluster.h100, admitted_at=timezone.now())
    first, _ = load(timezone.now())

    second, loaded = load(timezone.now())

    assert loaded.patched == {"pending": 0, "running": 0}
    assert second.pending is first.pending and second.running is first.running


def test_it_patches_only_the_workloads_written(committed_cluster, patch_anything):
    steady = pending(committed_cluster.queue_a, "steady")
    moved = pending(committed_cluster.queue_a, "moved")
    devices = list(Device.objects.order_by("pk")[:2])
    busy = running(committed_cluster.queue_b, "busy", devices, committed_cluster.h100, admitted_at=timezone.now())
    first, _ = load(timezone.now())
    Workload.objects.filter(pk=moved.pk).update(priority=42)

    second, loaded = load(timezone.now())

    assert loaded.patched == {"pending": 1, "running": 1}
    before = {workload.id: workload for workload in first.pending}
    after = {workload.id: workload for workload in second.pending}
    assert after[str(steady.pk)] is before[str(steady.pk)]
    assert after[str(moved.pk)].priority == 42
    assert second.running == first.running and second.running[0].id == str(busy.pk)
    assert_read_as_afresh(second, loaded, timezone.now())


def test_it_reads_everything_when_the_log_cannot_tell(committed_cluster, patch_anything):
    pending(committed_cluster.queue_a, "waiting")
    load(timezone.now())
    Queue.objects.filter(pk=committed_cluster.queue_a.pk).update(name="renamed")

    snapshot, loaded = load(timezone.now())

    assert loaded.patched == {}
    assert snapshot.pending[0].queue == "renamed"


def test_it_reads_everything_when_much_of_it_was_written(committed_cluster, monkeypatch):
    monkeypatch.setattr(loader, "SMALL_PATCH", 0)
    workloads = [pending(committed_cluster.queue_a, f"job-{index}") for index in range(8)]
    load(timezone.now())
    Workload.objects.filter(pk__in=[w.pk for w in workloads[:3]]).update(priority=2)

    _, loaded = load(timezone.now())

    assert "pending" not in loaded.patched  # 3 of 8 records is past LARGEST_RECORDS_PATCH
    Workload.objects.filter(pk=workloads[0].pk).update(priority=3)
    _, loaded = load(timezone.now())
    assert loaded.patched["pending"] == 1


def test_it_lets_a_workload_in_and_out_as_its_approval_window_opens_and_shuts(committed_cluster, patch_anything):
    now = timezone.now()
    windowed = pending(
        committed_cluster.queue_a,
        "windowed",
        resource_class=committed_cluster.reserved,
        approval=ApprovalState.APPROVED,
    )
    ApprovalRequest.objects.create(
        workload=windowed, due_at=now, not_before=now + timedelta(hours=1), not_after=now + timedelta(hours=2)
    )
    before, _ = load(now)

    inside, loaded = load(now + timedelta(hours=1, minutes=1))
    after, _ = load(now + timedelta(hours=3))

    assert loaded.patched["pending"] == 1  # no row was written: the clock moved
    assert [workload.id for workload in before.pending] == []
    assert [workload.id for workload in inside.pending] == [str(windowed.pk)]
    assert [workload.id for workload in after.pending] == []


# A random run of what the API, the executor and the cycle write, each write committed, checked after
# every step against a load that kept nothing.


def submit(cluster, rng, step):
    resource_class = rng.choice([cluster.training, cluster.inference, None])
    pending(
        rng.choice([cluster.queue_a, cluster.queue_b]),
        f"job-{step}",
        replicas=rng.choice([1, 1, 2]),
        devices_per_pod=rng.choice([1, 2, 4]),
        resource_class=resource_class,
        priority=rng.randrange(10),
    )


def some(rng, **filters):
    workloads = list(Workload.objects.filter(**filters).order_by("pk").values_list("pk", flat=True))
    return rng.choice(workloads) if workloads else None


def start(cluster, rng, step):
    pk = some(rng, state=State.ADMITTED)
    if pk:
        Workload.objects.filter(pk=pk).update(state=State.RUNNING, started_at=timezone.now())


def complete(cluster, rng, step):
    pk = some(rng, state__in=[State.ADMITTED, State.RUNNING])
    if pk:
        with transaction.atomic():
            Allocation.objects.filter(workload_id=pk, released_at__isnull=True).update(released_at=timezone.now())
            Workload.objects.filter(pk=pk).update(state=State.SUCCEEDED, finished_at=timezone.now())


def cancel(cluster, rng, step):
    pk = some(rng, state=State.PENDING)
    if pk:
        Workload.objects.filter(pk=pk).update(state=State.CANCELLED)


def reprioritize(cluster, rng, step):
    pk = some(rng, state__in=[State.PENDING, State.RUNNING, State.ADMITTED])
    if pk:
        Workload.objects.filter(pk=pk).update(priority=rng.randrange(100))


def resize(cluster, rng, step):
    pk = some(rng, state=State.PENDING)
    if pk:
        PodSet.objects.filter(workload_id=pk).update(replicas=rng.choice([1, 2]))


def evict(cluster, rng, step):
    pk = some(rng, state=State.RUNNING)
    if pk:
        with transaction.atomic():
            Allocation.objects.filter(workload_id=pk, released_at__isnull=True).update(
                eviction_requested_at=timezone.now()
            )
            Workload.objects.filter(pk=pk).update(eviction_requested_at=timezone.now())


def delete(cluster, rng, step):
    pk = some(rng, state__in=[State.PENDING, State.CANCELLED])
    if pk:
        Workload.objects.filter(pk=pk).delete()


def cycle(cluster, rng, step):
    run_once()


STEPS = [submit, submit, submit, cycle, cycle, start, complete, cancel, reprioritize, resize, evict, delete]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_reads_after_every_kind_of_write_what_a_worker_that_kept_nothing_reads(
    committed_cluster, patch_anything, seed
):
    rng = random.Random(seed)
    for step in range(4):
        submit(committed_cluster, rng, f"seed-{step}")
    load(timezone.now())
    patched = 0
    for step in range(40):
        action = rng.choice(STEPS)
        action(committed_cluster, rng, step)
        now = timezone.now()
        snapshot, loaded = load(now)
        patched += len(loaded.patched) == 2
        assert_read_as_afresh(snapshot, loaded, now)
    # The log spoke for most loads (a cycle's own load, in its transaction, counts for the next one too).
    assert patched >= 30
