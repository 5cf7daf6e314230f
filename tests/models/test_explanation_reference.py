"""An explanation's workload is checked by triggers, not a foreign key (migration workloads 0017)."""

import threading

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from broker.cycle.bulk import insert_rows
from broker.cycle.commit import STORED_EXPLANATION_COLUMNS
from broker.workloads.models import Explanation, Workload
from tests.builders import make_workload

MISSING = 10**9

postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="SQLite: no triggers on the workload table (migration workloads 0017)"
)


def raw(sql, params=()):
    """A statement as any writer might send it, past the ORM."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def delete_workload_past_the_orm(execute, workload_id):
    """The workload's rows as a plain SQL writer deletes them, with `execute(sql, params)`: its pod sets
    (still a foreign key), then the workload, leaving its explanation to the database."""
    execute("DELETE FROM workloads_podset WHERE workload_id = %s", [workload_id])
    execute("DELETE FROM workloads_workload WHERE id = %s", [workload_id])


def explanation_row(workload_id):
    values = {
        "workload_id": workload_id,
        "reason": "QuotaExceeded",
        "secondary": "[]",
        "message": "waits for quota",
        "details": "{}",
        "position_in_queue": 1,
        "position_in_cluster": 1,
        "estimated_start": None,
        "suggestions": "[]",
        "updated_at": timezone.now(),
        "cycle_id": None,
        "fingerprint": "",
    }
    return tuple(values[column] for column in STORED_EXPLANATION_COLUMNS)


def test_it_refuses_an_explanation_of_a_missing_workload_in_the_database(cluster):
    with pytest.raises(IntegrityError, match="does not exist"), transaction.atomic():
        Explanation.objects.bulk_create([Explanation(workload_id=MISSING, reason="QuotaExceeded", message="m")])

    assert not Explanation.objects.exists()


def test_it_checks_every_row_of_a_bulk_insert_in_the_database(cluster):
    first = make_workload(cluster.queue_a, name="first")
    second = make_workload(cluster.queue_a, name="second")
    rows = [explanation_row(first.pk), explanation_row(MISSING), explanation_row(second.pk)]

    expected = f"workload {MISSING}, which does not exist" if connection.vendor == "postgresql" else "does not exist"
    with pytest.raises(IntegrityError, match=expected), transaction.atomic():
        insert_rows(Explanation, STORED_EXPLANATION_COLUMNS, rows)

    assert not Explanation.objects.exists()


def test_it_takes_a_bulk_insert_of_existing_workloads(cluster):
    workloads = [make_workload(cluster.queue_a, name=f"w{index}") for index in range(3)]

    insert_rows(Explanation, STORED_EXPLANATION_COLUMNS, [explanation_row(w.pk) for w in workloads])

    assert sorted(Explanation.objects.values_list("workload_id", flat=True)) == sorted(w.pk for w in workloads)


def test_it_refuses_moving_an_explanation_to_a_missing_workload_in_the_database(cluster):
    workload = make_workload(cluster.queue_a)
    explanation = Explanation.objects.create(workload=workload, reason="QuotaExceeded", message="m")

    with pytest.raises(IntegrityError, match="does not exist"), transaction.atomic():
        raw("UPDATE workloads_explanation SET workload_id = %s WHERE id = %s", [MISSING, explanation.pk])
    raw("UPDATE workloads_explanation SET message = 'still here' WHERE id = %s", [explanation.pk])

    explanation.refresh_from_db()
    assert (explanation.workload_id, explanation.message) == (workload.pk, "still here")


def test_it_deletes_the_explanation_with_its_workload(cluster):
    workload = make_workload(cluster.queue_a, name="gone")
    kept = make_workload(cluster.queue_a, name="kept")
    for each in (workload, kept):
        Explanation.objects.create(workload=each, reason="QuotaExceeded", message="m")

    workload.delete()

    assert list(Explanation.objects.values_list("workload_id", flat=True)) == [kept.pk]


@postgresql_only
def test_it_deletes_the_explanations_a_plain_delete_leaves_in_the_database(cluster):
    """The trigger is the cascade for a writer past Django's collector (and for what committed between
    the collector's delete and the workload's)."""
    workload = make_workload(cluster.queue_a, name="gone")
    kept = make_workload(cluster.queue_a, name="kept")
    for each in (workload, kept):
        Explanation.objects.create(workload=each, reason="QuotaExceeded", message="m")

    delete_workload_past_the_orm(raw, workload.pk)

    assert list(Explanation.objects.values_list("workload_id", flat=True)) == [kept.pk]


@postgresql_only
def test_it_refuses_changing_the_id_of_an_explained_workload_in_the_database(cluster):
    workload = make_workload(cluster.queue_a)
    Explanation.objects.create(workload=workload, reason="QuotaExceeded", message="m")

    with pytest.raises(IntegrityError, match="is named by an explanation"), transaction.atomic():
        raw("UPDATE workloads_workload SET id = %s WHERE id = %s", [MISSING, workload.pk])

    assert Workload.objects.filter(pk=workload.pk).exists()


@postgresql_only
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_makes_a_deletion_wait_for_an_explanation_being_written_and_then_take_it_along(cluster):
    """The insert trigger share-locks the explained workload as the foreign key did: a deletion that
    starts meanwhile waits for the writer's commit, then its own trigger deletes what was written."""
    import psycopg

    from tests.cycle.test_cycle import waits_for_a_lock

    workload = make_workload(cluster.queue_a, name="explained")
    params = connection.get_connection_params()
    outcome = {}

    def delete():
        try:
            with psycopg.connect(**params) as deleter:
                deleter.execute("SET lock_timeout = '20s'")
                delete_workload_past_the_orm(deleter.execute, workload.pk)
            outcome["deleted"] = True
        except psycopg.Error as error:
            outcome["refused"] = error

    deleter = threading.Thread(target=delete)
    with transaction.atomic():
        insert_rows(Explanation, STORED_EXPLANATION_COLUMNS, [explanation_row(workload.pk)])
        deleter.start()
        assert waits_for_a_lock(params, "DELETE FROM workloads_workload"), "the deletion did not wait"
    deleter.join(30)

    assert outcome == {"deleted": True}
    assert not Workload.objects.filter(pk=workload.pk).exists()
    assert not Explanation.objects.exists()
