"""The allocation groups a process keeps between top-workload reports (held.py, issue 29): after any
committed write, what a report reads from them is what it would read whole, and it reads again only the
workloads written since."""

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction

from broker.costs import checkpoint, held
from broker.costs.report import allocation_report
from broker.workloads.models import Allocation, Workload
from tests.costs.helpers import NOV, hold, release, submit
from tests.costs.test_checkpoint import assert_same, postgresql_only
from tests.costs.test_costliest_beside import elsewhere
from tests.costs.test_lifecycle import devices
from tests.costs.test_rollup import busy_history
from tests.costs.test_shared_devices import share, sliced  # noqa: F401 - the fixture

pytestmark = [postgresql_only, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

H = timedelta(hours=1)


@pytest.fixture
def reads(monkeypatch):
    """The workload ids of every read of the groups: None for a read of all of them."""
    seen = []
    read_rows = held.read_rows

    def watched(since, workload_ids=None):
        seen.append(None if workload_ids is None else set(workload_ids))
        return read_rows(since, workload_ids)

    monkeypatch.setattr(held, "read_rows", watched)
    return seen


@contextmanager
def transaction_open_elsewhere():
    """A transaction with an id, open on another connection until the block ends (then rolled back)."""
    started, done = threading.Event(), threading.Event()

    def stay_open():
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_current_xact_id()")
                started.set()
                done.wait(60)
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    thread = threading.Thread(target=stay_open)
    thread.start()
    assert started.wait(60)
    try:
        yield
    finally:
        done.set()
        thread.join()


def kept_and_whole(since=NOV):
    """(the groups as read through what is kept, as read whole), in one report's snapshot."""
    with checkpoint.one_snapshot():
        kept = held.groups(since, keep=True)
        kept = {group: dict(holders) for group, holders in kept.items()}
        return kept, held.groups(since, keep=False)


def test_it_reads_again_only_the_workloads_written_since(cluster, reads):
    first = submit(cluster.queue_a, name="first", at=NOV)
    firsts = hold(first, devices(cluster, 0, 2), cluster.h100, NOV)
    second = submit(cluster.queue_b, name="second", at=NOV)
    kept, whole = kept_and_whole()
    assert kept == whole and reads[0] is None

    hold(second, devices(cluster, 1, 3), cluster.h100, NOV + H)
    reads.clear()
    kept, whole = kept_and_whole()
    assert kept == whole
    # The kept read, then the whole one to compare with. The log may name workloads seen already (those
    # of transactions that committed while another was open: the horizon is the oldest one open).
    assert len(reads) == 2 and second.pk in reads[0] and reads[1] is None

    release(firsts[:1], NOV + 2 * H)
    reads.clear()
    kept, whole = kept_and_whole()
    assert kept == whole
    assert reads[0] is not None and first.pk in reads[0]

    Allocation.objects.filter(workload=second).delete()
    kept, whole = kept_and_whole()
    assert kept == whole
    assert all(second.pk not in holders for holders in kept.values())

    reads.clear()
    kept, whole = kept_and_whole()
    # Nothing written: the kept read reads nothing, or (with transactions open elsewhere holding the
    # horizon back) the workloads seen already, never all of them.
    assert kept == whole and reads[-1] is None and None not in reads[:-1]


def test_it_keeps_the_shares_of_shared_devices_apart(sliced, reads):  # noqa: F811 - the fixture
    share(sliced, "small", sliced.queue_a, "20Gi", NOV)
    kept, whole = kept_and_whole()
    share(sliced, "large", sliced.queue_b, "40Gi", NOV + H)
    kept, whole = kept_and_whole()
    assert kept == whole
    # Keyed by the share each takes of the 80Gi device, fixed when it was allocated (in millionths).
    assert sorted(group[2] for group in kept) == ["250000", "500000"]


def test_it_reads_whole_for_a_window_that_starts_before_what_it_kept(cluster, reads):
    early = submit(cluster.queue_a, name="early", at=NOV)
    hold(early, devices(cluster, 0, 1), cluster.h100, NOV, NOV + H)
    kept_and_whole(since=NOV + 2 * H)
    reads.clear()
    kept, whole = kept_and_whole(since=NOV)
    assert kept == whole and reads == [None, None]
    assert any(early.pk in holders for holders in kept.values())


def test_it_drops_the_groups_released_before_a_window_that_moved_on(cluster):
    done = submit(cluster.queue_a, name="done", at=NOV)
    hold(done, devices(cluster, 0, 1), cluster.h100, NOV, NOV + H)
    running = submit(cluster.queue_b, name="running", at=NOV)
    hold(running, devices(cluster, 1, 1), cluster.h100, NOV)
    kept_and_whole(since=NOV)
    later = NOV + held.DROP_RELEASED_AFTER + 2 * H
    kept, whole = kept_and_whole(since=later)
    assert kept == whole
    assert [set(holders) for holders in kept.values()] == [{running.pk}]


def test_it_reports_the_top_workloads_from_the_kept_groups_as_read_whole(cluster):
    """Reports in transactions of their own (kept groups) between writes, against the same reports in a
    caller's transaction (groups read whole)."""
    busy_history(cluster)

    def ranked():
        return [
            allocation_report(NOV, NOV + 12 * H, aggregate=("workload",), step=step, now=NOV + 30 * H, top=top)
            for step in ("hour", "day")
            for top in (1, 50)
        ]

    def whole():
        with checkpoint.one_snapshot():
            return ranked()

    assert_same(ranked(), whole())
    late = submit(cluster.queue_b, name="late", at=NOV + 10 * H)
    allocations = hold(late, devices(cluster, 3, 2), cluster.h100, NOV + 10 * H)
    assert_same(ranked(), whole())
    release(allocations, NOV + 11 * H)
    kept = ranked()
    assert_same(kept, whole())
    assert "team-b/late" in kept[1]["workloads"]  # hourly steps, the top 50


def test_it_reads_whole_for_a_snapshot_that_misses_what_it_kept(cluster, reads):
    """Two reports at once: the one that took its snapshot first reaches the groups last. What the later
    one kept includes a workload the earlier snapshot must not see."""
    early = submit(cluster.queue_a, name="early", at=NOV)
    hold(early, devices(cluster, 0, 1), cluster.h100, NOV)
    # A transaction open meanwhile keeps both snapshots' horizon (their xmin) the same.
    with transaction_open_elsewhere(), checkpoint.one_snapshot():
        held.groups(NOV, keep=False)  # the earlier report's snapshot is taken here
        late = []

        def hold_late():
            late.append(submit(cluster.queue_b, name="late", at=NOV).pk)
            hold(Workload.objects.get(pk=late[0]), devices(cluster, 1, 1), cluster.h100, NOV)

        elsewhere(hold_late)
        elsewhere(kept_and_whole)  # the later report keeps what its snapshot saw, the late one included
        reads.clear()
        older = held.groups(NOV, keep=True)
        assert reads == [None]
        assert {w for holders in older.values() for w in holders} == {early.pk}
    kept, whole = kept_and_whole()  # the later report's kept groups stayed
    assert kept == whole and {w for holders in kept.values() for w in holders} == {early.pk, *late}
