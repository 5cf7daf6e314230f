"""The top workloads' pieces are read on a connection of their own while the report loads the rest (issue
29, reports as fast as pages): in the report's own snapshot, so a row committed meanwhile is in neither,
and the report is the one read on a single connection."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections

from broker.costs import checkpoint, held, report
from broker.costs.report import allocation_report
from tests.costs.helpers import NOV, hold, submit
from tests.costs.test_checkpoint import assert_same, postgresql_only
from tests.costs.test_lifecycle import devices
from tests.costs.test_rollup import busy_history

pytestmark = [postgresql_only, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

H = timedelta(hours=1)


def elsewhere(write):
    """Run `write` on another connection, committed before this returns."""
    failures = []

    def run():
        try:
            write()
        except Exception as error:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(error)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


def pieces_of(beside):
    """([{workload id: device-microseconds}], [{workload id: raw cost}]) per hour of NOV's first 4 h."""
    return report.Pieces(report.PiecesWindow(NOV, NOV + 4 * H, "hour", NOV + 3 * H), beside).result()


def workloads_in(amounts):
    device_us, raw = amounts
    assert [step.keys() for step in device_us] == [step.keys() for step in raw]
    return {workload_id for step in device_us for workload_id in step}


def test_it_reads_the_pieces_beside_in_the_reports_snapshot(cluster):
    early = submit(cluster.queue_a, name="early", at=NOV)
    hold(early, devices(cluster, 0, 2), cluster.h100, NOV)
    late = submit(cluster.queue_b, name="late", at=NOV)
    with checkpoint.one_snapshot():
        assert connection.in_atomic_block
        alone = pieces_of(beside=False)  # the snapshot is taken here
        elsewhere(lambda: hold(late, devices(cluster, 1, 3), cluster.h100, NOV + H))
        beside = pieces_of(beside=True)
    assert beside == alone
    assert workloads_in(beside) == {early.pk}
    assert workloads_in(pieces_of(beside=False)) == {early.pk, late.pk}
    device_us, _ = beside
    assert [step.get(early.pk) for step in device_us] == [2 * 3_600_000_000 * 10**6] * 3 + [None]


def test_it_reports_the_top_workloads_read_beside_as_read_alone(cluster, monkeypatch):
    busy_history(cluster)
    beside = []
    alone = []
    pieces = report.Pieces

    def watched(window, beside_flag):
        (beside if beside_flag else alone).append(window)
        return pieces(window, beside_flag)

    monkeypatch.setattr(report, "Pieces", watched)

    def ranked():
        return [
            allocation_report(NOV, NOV + 12 * H, aggregate=("workload",), step=step, now=NOV + 30 * H, top=top)
            for step in ("hour", "day")
            for top in (1, 2, 50)
        ]

    read_beside = ranked()
    assert len(beside) == 6 and not alone
    with checkpoint.one_snapshot():  # a caller's transaction: no other connection may read for it
        read_alone = ranked()
    assert len(alone) == 6
    assert_same(read_beside, read_alone)
    assert read_beside[1]["workloads"]


def test_it_raises_what_the_read_beside_raises(cluster, monkeypatch):
    def failing(since, keep):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")

    monkeypatch.setattr(held, "groups", failing)
    with checkpoint.one_snapshot():
        running = report.Pieces(report.PiecesWindow(NOV, NOV + H, "hour", NOV + H), beside=True)
        with pytest.raises(Exception, match="division by zero"):
            running.result()
