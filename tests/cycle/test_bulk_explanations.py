"""The PostgreSQL fast path for explanations (COPY into a temporary table, one INSERT ... ON CONFLICT)
stores exactly what Django's bulk_create(update_conflicts=True) stores, for new rows and for updates."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from broker.cycle import bulk
from broker.cycle.commit import EXPLANATION_COLUMNS, EXPLANATION_FIELDS
from broker.workloads.models import Explanation, SchedulingCycle
from tests.cycle.helpers import pending

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the fast path is PostgreSQL's")

AWKWARD = "tab\there, newline\nthere, back\\slash, \\N, quote \" and ' , ü€ 🚀, \r end"


def values(index, variant):
    """Explanation content with the shapes COPY could mangle: escapes, unicode, nested JSON, nulls."""
    return {
        "reason": ["Capacity", "QuotaExceeded", "Topology"][(index + variant) % 3],
        "secondary": [] if index % 4 == 0 else [f"Secondary{variant}", AWKWARD, None, 1.5, 10**15, True],
        "message": f"{AWKWARD} #{index} v{variant}",
        "details": {} if index % 5 == 0 else {
            "estimate": f"unknown: {index} running workload(s) have no expected duration",
            "nested": {"list": [1, 2.25, "x\ty", {"deep": None}], "empty": {}, "text": AWKWARD},
            "variant": variant,
        },
        "position_in_queue": None if index % 3 == 0 else index + variant,
        "position_in_cluster": None if index % 2 else index * 2 + variant,
        "estimated_start": None if index % 6 == 0 else datetime(
            2026, 11, 30, 8, 0, index % 60, 123456 * variant % 10**6, tzinfo=UTC
        ),
        "suggestions": [] if index % 2 else [
            {"kind": "shrink", "description": AWKWARD, "change": {"replicas": index, "v": variant}}
        ],
    }  # fmt: skip


def row(workload, cycle, at, index, variant):
    content = values(index, variant)
    return (workload.pk, cycle.pk, at, *(content[name] for name in EXPLANATION_FIELDS))


def orm_write(rows):
    """What commit.explain wrote before the fast path."""
    Explanation.objects.bulk_create(
        [Explanation(**dict(zip(EXPLANATION_COLUMNS, r, strict=True))) for r in rows],
        batch_size=2000,
        update_conflicts=True,
        unique_fields=["workload"],
        update_fields=[*EXPLANATION_FIELDS, "cycle", "updated_at"],
    )


def fast_write(rows):
    bulk.upsert_rows(
        Explanation, EXPLANATION_COLUMNS, rows, unique_fields=["workload_id"], update_fields=EXPLANATION_COLUMNS[1:]
    )


def stored(workloads):
    """Each workload's explanation, every column but the id, in the order of `workloads`."""
    by_workload = {e.workload_id: e for e in Explanation.objects.filter(workload__in=workloads)}
    return [
        {name: getattr(by_workload[w.pk], name) for name in EXPLANATION_COLUMNS if name != "workload_id"}
        for w in workloads
    ]


@pytest.fixture
def twins(cluster):
    """Two equal sets of pending workloads: one written by the ORM, one by the fast path."""
    orm = [pending(cluster.queue_a, f"orm-{i}") for i in range(30)]
    fast = [pending(cluster.queue_a, f"fast-{i}") for i in range(30)]
    return orm, fast


def test_the_fast_path_inserts_and_updates_what_the_orm_would(twins):
    orm, fast = twins
    first = SchedulingCycle.objects.create()
    second = SchedulingCycle.objects.create()
    at = timezone.now()

    orm_write([row(w, first, at, i, 1) for i, w in enumerate(orm)])
    fast_write([row(w, first, at, i, 1) for i, w in enumerate(fast)])
    inserted = stored(fast)
    assert inserted == stored(orm)
    assert inserted[7]["secondary"][1] == AWKWARD
    assert inserted[7]["details"]["nested"]["text"] == AWKWARD
    assert inserted[7]["estimated_start"] == datetime(2026, 11, 30, 8, 0, 7, 123456, tzinfo=UTC)

    # Updates for the first half, new rows (after deleting them) for the rest, in one call.
    later = at + timedelta(seconds=3, microseconds=17)
    Explanation.objects.filter(workload__in=orm[15:] + fast[15:]).delete()
    orm_write([row(w, second, later, i, 2) for i, w in enumerate(orm)])
    fast_write([row(w, second, later, i, 2) for i, w in enumerate(fast)])
    updated = stored(fast)
    assert updated == stored(orm)
    for name in updated[0]:  # every updated column changed somewhere, so the comparison covers it
        assert [e[name] for e in updated] != [e[name] for e in inserted], name
    assert all(e["cycle_id"] == second.pk and e["updated_at"] == later for e in updated)
    assert Explanation.objects.filter(workload__in=fast).count() == len(fast)
    # Also as the database sees it, not only after Django decoded it: as jsonb, since the columns keep
    # each writer's text (key order, escapes) as it came.
    query = (
        "SELECT secondary::jsonb::text, details::jsonb::text, suggestions::jsonb::text, estimated_start, "
        "updated_at FROM workloads_explanation WHERE workload_id = ANY(%s) ORDER BY workload_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(query, [[w.pk for w in orm]])
        raw_orm = cursor.fetchall()
        cursor.execute(query, [[w.pk for w in fast]])
        assert cursor.fetchall() == raw_orm


def test_the_fallback_path_stores_the_same(twins, monkeypatch):
    orm, fast = twins
    cycle = SchedulingCycle.objects.create()
    at = timezone.now()
    for variant in (1, 2):
        orm_write([row(w, cycle, at, i, variant) for i, w in enumerate(orm)])
        with monkeypatch.context() as patch:
            patch.setattr(bulk, "is_postgresql", lambda: False)
            fast_write([row(w, cycle, at, i, variant) for i, w in enumerate(fast)])
        assert stored(fast) == stored(orm)


def test_a_refused_upsert_is_a_django_database_error_and_leaves_nothing_behind(twins):
    _, fast = twins
    cycle = SchedulingCycle.objects.create()
    at = timezone.now()
    twice = [row(fast[0], cycle, at, 0, 1), row(fast[0], cycle, at, 1, 2)]
    with pytest.raises(DatabaseError), transaction.atomic():
        fast_write(twice)
    assert not Explanation.objects.filter(workload=fast[0]).exists()
    # The temporary table went with the failure: the next upsert in this transaction creates it again.
    fast_write(twice[:1])
    fast_write(twice[1:])
    assert Explanation.objects.get(workload=fast[0]).message == twice[1][EXPLANATION_COLUMNS.index("message")]
