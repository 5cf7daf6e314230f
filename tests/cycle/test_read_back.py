"""After a cycle that wrote many workloads, the process that ran it reads them back (runner.read_back), so
the next cycle's load finds their records built."""

import pytest
from django.db import connection
from django.utils import timezone

from broker.cycle import loader
from broker.cycle import runner as runner_module
from broker.cycle.loader import load_snapshot
from broker.cycle.locks import reading_snapshot
from broker.cycle.runner import run_once, worth_reading_back
from broker.workloads.models import SchedulingCycle, Workload
from broker.workloads.states import State
from tests.cycle.helpers import pending

# Committed as a worker commits: the cycle's hooks (the executor's start) run before the read-back.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def kept_running():
    """{workload pk: (source rows, record)} the loader keeps for running work."""
    return loader.RUNNING_RECORDS.previous(loader.RUNNING_RECORDS._scope)


def submit_fitting(cluster, count):
    return [
        pending(cluster.queue_a, f"fits-{index}", devices_per_pod=1, resource_class=cluster.training)
        for index in range(count)
    ]


def test_it_reads_back_what_a_large_cycle_wrote_once_the_executor_started_it(committed_cluster, settings):
    settings.CYCLE_READ_BACK_MIN_WORKLOADS = 3
    workloads = submit_fitting(committed_cluster, 3)

    run = run_once()

    assert run.outcome == SchedulingCycle.Outcome.COMMITTED and len(run.admitted) == 3
    kept = kept_running()
    assert set(kept) == {w.pk for w in workloads}
    # Each record was built from the row as the executor's start left it, not as the cycle admitted it.
    assert {source[1][4] for source, _ in kept.values()} == {State.RUNNING}
    assert set(Workload.objects.values_list("state", flat=True)) == {State.RUNNING}

    with reading_snapshot():
        snapshot, loaded = load_snapshot(timezone.now())
    assert [record.id for record in snapshot.running] == [str(w.pk) for w in workloads]
    assert all(record is kept[int(record.id)][1] for record in snapshot.running), "built once, by the read-back"
    if connection.vendor == "postgresql":
        assert loaded.patched == {"pending": 0, "running": 0}, "nothing written since the read-back"


def test_it_leaves_a_small_cycles_writes_to_the_next_load(committed_cluster, settings):
    settings.CYCLE_READ_BACK_MIN_WORKLOADS = 4
    submit_fitting(committed_cluster, 3)

    run = run_once()

    assert len(run.admitted) == 3
    assert kept_running() == {}, "the cycle's own load kept the running work as it was before it: none"


def test_it_never_reads_back_when_turned_off_nor_after_a_cycle_that_did_not_commit(settings):
    committed = SchedulingCycle.Outcome.COMMITTED
    many = runner_module.CycleRun(1, committed, admitted=tuple(range(5)), preempted=(7, 8))
    settings.CYCLE_READ_BACK_MIN_WORKLOADS = 7
    assert worth_reading_back(many)
    assert not worth_reading_back(runner_module.CycleRun(1, committed, admitted=tuple(range(6))))
    assert not worth_reading_back(runner_module.CycleRun(1, SchedulingCycle.Outcome.REFUSED, admitted=tuple(range(9))))
    assert not worth_reading_back(None), "another cycle held the lock"
    settings.CYCLE_READ_BACK_MIN_WORKLOADS = 0
    assert not worth_reading_back(many)


def test_it_keeps_the_cycle_when_the_read_back_fails(committed_cluster, settings, monkeypatch, caplog):
    settings.CYCLE_READ_BACK_MIN_WORKLOADS = 1
    submit_fitting(committed_cluster, 2)
    loads = []

    def load_then_fail(now, config=None):
        loads.append(now)
        if len(loads) > 1:
            raise RuntimeError("the database went away")
        return load_snapshot(now, config)

    monkeypatch.setattr(runner_module, "load_snapshot", load_then_fail)
    run = run_once()

    assert len(loads) == 2
    assert run.outcome == SchedulingCycle.Outcome.COMMITTED and len(run.admitted) == 2
    assert "reading back a cycle's writes failed" in caplog.text
    assert set(Workload.objects.values_list("state", flat=True)) == {State.RUNNING}


def test_it_reads_back_in_a_transaction_that_writes_nothing(committed_cluster):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no read-only transactions")
    from django.db import DatabaseError

    with pytest.raises(DatabaseError, match="read-only transaction"), reading_snapshot():
        Workload.objects.filter(pk=0).update(priority=1)


def test_it_reads_back_and_warms_up_on_a_database_no_inventory_write_has_touched_yet(committed_cluster, settings):
    """A new worker warms up before anything bumped the cluster's generation (the e2e worker did): the
    snapshot's reads must not create that row, in a transaction that may not write."""
    from broker.cycle.runner import read_back, warm_up
    from broker.inventory.models import ClusterState

    ClusterState.objects.all().delete()
    assert ClusterState.current_generation() == 0
    assert not ClusterState.objects.exists(), "reading the generation wrote nothing"

    assert warm_up() is not None
    assert read_back() is not None
    ClusterState.bump()
    assert ClusterState.current_generation() == 1
