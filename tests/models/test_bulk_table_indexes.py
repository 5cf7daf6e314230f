"""The tables a cycle writes thousands of rows to keep only the indexes something reads: every index is
one more entry per row inside the cycle's transaction (docs/benchmarks.md, the refill cycle)."""

import pytest
from django.db import connection

from broker.workloads.models import Allocation, Explanation, ExplanationChange, Workload, WorkloadTransition
from broker.workloads.states import WAITING_STATES, State

pytestmark = pytest.mark.django_db


def indexes_of(model):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return {
        name: spec["columns"]
        for name, spec in constraints.items()
        if spec["index"] or spec["primary_key"] or (spec["unique"] and not spec["foreign_key"])
    }


def test_it_indexes_explanations_by_workload_and_reason_only():
    columns = sorted(tuple(cols) for cols in indexes_of(Explanation).values())
    assert columns == [("id",), ("reason",), ("workload_id",)]


def test_it_keeps_no_pattern_copy_of_the_reason_index():
    if connection.vendor != "postgresql":
        pytest.skip("pattern-ops copies are PostgreSQL's")  # CI runs this on PostgreSQL (tests/conftest.py)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename IN (%s, %s)",
            [Explanation._meta.db_table, Workload._meta.db_table],
        )
        definitions = [row[0] for row in cursor.fetchall()]
    assert definitions and not [d for d in definitions if "pattern_ops" in d]


def test_it_does_not_index_a_workloads_state_changes_beyond_the_queue_lists():
    # Each admission rewrites its row: any index is one more entry per admitted workload.
    columns = sorted(tuple(cols) for cols in indexes_of(Workload).values())
    assert columns == sorted(
        [
            ("id",),
            ("team_id", "name"),
            ("name",),
            ("queue_id", "state"),
            ("state", "submitted_at", "id"),
            ("eviction_requested_at",),
            ("submitted_at",),
            ("submitted_at", "id"),
        ]
    )
    if connection.vendor == "postgresql":  # CI: PostgreSQL (tests/conftest.py)
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [Workload._meta.db_table])
            definitions = [row[0] for row in cursor.fetchall()]
        # The waiting ones' list in submission order: an admitted (or running, or ended) row has no entry.
        (waiting,) = [d for d in definitions if "(submitted_at, id)" in d]
        assert "WHERE" in waiting and all(f"'{state}'" in waiting for state in WAITING_STATES)
        assert not [state for state in State if state not in WAITING_STATES and f"'{state}'" in waiting]


def test_it_indexes_allocations_by_what_reads_them_only():
    # An admission inserts one allocation per device: 25,000 rows in a 20,000-admission commit.
    columns = sorted(tuple(cols) for cols in indexes_of(Allocation).values())
    # The device's two: its foreign key's and the active shares' (partial); and the one whole holder per
    # device, keyed (device, 0 or the share's id), which introspection reads as (device_id, None). On
    # PostgreSQL a BRIN index on allocated_at finds the rows written after the cost checkpoint: a summary
    # per block range, so an insert adds no entry until the range is summarised.
    brin = [("allocated_at",)] if connection.vendor == "postgresql" else []
    assert columns == sorted(
        [
            *brin,
            ("id",),
            ("device_id",),
            ("device_id",),
            ("device_id", None),
            ("workload_id",),
            ("released_at",),
            ("eviction_requested_at",),
        ]
    )
    if connection.vendor == "postgresql":  # CI: PostgreSQL (tests/conftest.py)
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [Allocation._meta.db_table])
            definitions = [row[0] for row in cursor.fetchall()]
        # A new (active) allocation has an entry in the unique index and the workload's and device's only.
        assert [d for d in definitions if "(released_at)" in d] == [
            d for d in definitions if "(released_at) WHERE (released_at IS NOT NULL)" in d
        ]
        # A whole device's allocation has no entry in the active shares' index either.
        (shares,) = [d for d in definitions if "allocation_active_shares" in d]
        assert "consumed_capacity IS NOT NULL" in shares


def test_it_indexes_transitions_by_actor_only_where_a_person_acted():
    if connection.vendor != "postgresql":
        pytest.skip("partial-index predicates are read from PostgreSQL's catalog")  # CI: PostgreSQL
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [WorkloadTransition._meta.db_table])
        definitions = sorted(row[0] for row in cursor.fetchall())
    # The fourth is the cost checkpoint's BRIN index on `at` (no entry per insert).
    assert len(definitions) == 4
    assert [d for d in definitions if "USING brin (at)" in d]
    assert [d for d in definitions if "(actor_id)" in d and "WHERE (actor_id IS NOT NULL)" in d]
    assert [d for d in definitions if "(workload_id)" in d]


def foreign_keys_of(model):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
    return sorted(
        (tuple(spec["columns"]), spec["foreign_key"][0]) for spec in constraints.values() if spec["foreign_key"]
    )


def test_it_checks_in_the_database_only_the_references_nothing_else_guarantees():
    """A foreign key checks a cycle's bulk rows one by one. What an allocation is (its workload and device)
    and an explanation's workload are checked per statement by triggers instead
    (tests/models/test_allocation.py, test_explanation_reference.py); the logs, written beside a change of
    the row they name, and the classes and cycles, read from the snapshot, are not checked (see the
    models' comments)."""
    assert foreign_keys_of(Allocation) == []
    assert foreign_keys_of(Explanation) == []
    assert foreign_keys_of(ExplanationChange) == []
    assert foreign_keys_of(WorkloadTransition) == [(("actor_id",), "auth_user")]
    assert ("chosen_device_class_id",) not in dict(foreign_keys_of(Workload))
