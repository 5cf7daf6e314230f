"""Database work the commit runs while it builds its next rows (bulk.Background), and what uses it: the
admission's state change (executor.Moves) and the rows a COPY takes as they are made (insert_rows)."""

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from broker.cycle.bulk import Background, insert_rows
from broker.cycle.executor import Moves
from broker.workloads.models import Workload, WorkloadTransition
from broker.workloads.states import State
from tests.cycle.helpers import pending

TRANSITION_COLUMNS = ("workload_id", "from_state", "to_state", "at", "reason")
LOCK_KEY = 824_613


def test_it_gives_back_what_the_work_returned(db):
    work = Background(lambda cursor: cursor.execute("SELECT 40 + 2").fetchone()[0])

    assert work.result() == 42


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite runs the work at once, by design")
def test_it_runs_the_work_while_the_caller_goes_on(db):
    def work(cursor):
        # Run here instead, the work would fail after this wait instead of hanging the test.
        cursor.execute("SET LOCAL lock_timeout = '10s'")
        cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
        return "done"

    # A second session on the test database (the test's own is inside its transaction).
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        # The work waits for the lock the other session holds: had it run here, this line would never end.
        sent = Background(work)
        assert not sent.done
        holder.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])

    assert sent.result() == "done"
    assert sent.done


def test_it_raises_the_work_error_as_the_database_layer_does_and_the_transaction_goes_on(cluster):
    with pytest.raises(DatabaseError, match="no_such_table"), transaction.atomic():  # Django's, not the driver's
        Background(lambda cursor: cursor.execute("SELECT * FROM no_such_table")).result()

    assert Workload.objects.count() == 0
    assert Background(lambda cursor: cursor.execute("SELECT 2").fetchone()[0]).result() == 2


def test_it_moves_each_batch_with_its_own_fields_and_reports_what_moved(cluster):
    first = [pending(cluster.queue_a, f"a{i}") for i in range(2)]
    second = [pending(cluster.queue_b, f"b{i}") for i in range(2)]
    gone = pending(cluster.queue_b, "gone", state=State.CANCELLED)
    now = timezone.now()

    moves = Moves(
        [([w.pk for w in first], {"chosen_device_class_id": cluster.h100.pk, "admitted_at": now}),
         ([w.pk for w in (*second, gone)], {"chosen_device_class_id": None, "admitted_at": now}), ([], {})],
        State.PENDING, State.ADMITTED, now, "admitted in cycle 3",
    )  # fmt: skip
    moved = moves.finish()

    assert [sorted(ids) for ids in moved] == [sorted(w.pk for w in first), sorted(w.pk for w in second), []]
    classes = dict(Workload.objects.filter(state=State.ADMITTED).values_list("pk", "chosen_device_class_id"))
    assert classes == {**{w.pk: cluster.h100.pk for w in first}, **{w.pk: None for w in second}}
    assert set(WorkloadTransition.objects.values_list("workload_id", flat=True)) == {w.pk for w in (*first, *second)}
    assert Workload.objects.get(pk=gone.pk).state == State.CANCELLED


def test_it_writes_no_transition_for_moves_it_abandons(cluster):
    workload = pending(cluster.queue_a, "w")

    moves = Moves([([workload.pk], {})], State.PENDING, State.ADMITTED, timezone.now(), "admitted")
    moves.abandon()

    assert not WorkloadTransition.objects.exists()


def test_it_refuses_an_impossible_transition_before_sending_anything(cluster):
    workload = pending(cluster.queue_a, "w")

    with pytest.raises(ValueError, match="Pending -> Succeeded"):
        Moves([([workload.pk], {})], State.PENDING, State.SUCCEEDED, timezone.now(), "no")

    assert Workload.objects.get(pk=workload.pk).state == State.PENDING


def test_it_inserts_the_rows_of_a_generator_and_counts_them(cluster):
    workloads = [pending(cluster.queue_a, f"w{i}") for i in range(3)]
    at = timezone.now()
    made = []

    def rows():
        for workload in workloads:
            made.append(workload.pk)
            yield (workload.pk, State.PENDING, State.ADMITTED, at, "streamed")

    assert insert_rows(WorkloadTransition, TRANSITION_COLUMNS, rows()) == 3
    assert insert_rows(WorkloadTransition, TRANSITION_COLUMNS, iter(())) == 0

    assert made == [w.pk for w in workloads]
    stored = WorkloadTransition.objects.order_by("workload_id").values_list("workload_id", "reason")
    assert list(stored) == [(w.pk, "streamed") for w in workloads]


def test_it_fetches_in_the_background_the_rows_a_fetch_here_gives(cluster):
    from broker.cycle.loader import fetch_in_background, fetch_rows, holder_rows

    pending(cluster.queue_a, "waiting")
    pending(cluster.queue_b, "admitted", state=State.ADMITTED)
    holders = holder_rows(Workload.objects.filter(state__in=(State.ADMITTED, State.RUNNING)))
    names = Workload.objects.order_by("name").values_list("name", "state")

    fetched = fetch_in_background(holders, names).result()

    assert fetched == [fetch_rows(holders), fetch_rows(names)]
    assert [list(rows) for rows in fetched[1:]] == [[("admitted", State.ADMITTED), ("waiting", State.PENDING)]]


def test_it_moves_nothing_without_a_statement_or_a_thread_when_given_no_ids(cluster, monkeypatch):
    from broker.cycle import executor

    def no_background(work):
        raise AssertionError("no background work for nothing to move")

    monkeypatch.setattr(executor, "Background", no_background)

    moves = Moves([([], {})], State.ADMITTED, State.RUNNING, timezone.now(), "started")

    assert moves.finish() == [[]]
    assert not WorkloadTransition.objects.exists()


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite runs the work at once, by design")
def test_it_runs_works_sent_one_after_another_in_order_and_none_after_a_failure(cluster):
    ran = []

    def work(name, sql):
        def run(cursor):
            ran.append(name)
            cursor.execute(sql)
            return name

        return run

    with pytest.raises(DatabaseError, match="no_such_table"), transaction.atomic():
        first = Background(work("first", "SELECT pg_sleep(0.2)"))
        second = Background(work("second", "SELECT * FROM no_such_table"), after=first)
        third = Background(work("third", "SELECT 1"), after=second)
        third.wait()
        assert ran == ["first", "second"]
        assert (first.failed, second.failed, third.failed) == (False, True, True)
        assert first.result() == "first"
        second.result()

    assert third.result() is None
