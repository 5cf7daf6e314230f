"""A cycle rewrites a pending workload's explanation only when what it says changed."""

from datetime import UTC, datetime, timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.cycle.commit import unchanged
from broker.cycle.runner import run_once
from broker.inventory.models import Device
from broker.workloads.models import Explanation, ExplanationChange
from tests.cycle.helpers import pending, running


def explanation_writes(queries):
    return [
        query["sql"]
        for query in queries
        if "workloads_explanation" in query["sql"] and not query["sql"].lstrip().upper().startswith("SELECT")
    ]


def stored():
    return {row[0]: row[1:] for row in Explanation.objects.values_list("workload_id", "updated_at", "cycle_id")}


def test_an_unchanged_second_cycle_writes_no_explanation_rows(cluster):
    now = timezone.now()
    devices = list(Device.objects.order_by("node__name", "name"))
    running(
        cluster.queue_a, "hog", devices[:12], cluster.h100, started_at=now - timedelta(seconds=30),
        expected_duration_seconds=3600,
    )  # fmt: skip
    running(cluster.queue_a, "rest", devices[12:], cluster.h100, started_at=now, expected_duration_seconds=7200)
    waiting = pending(cluster.queue_b, "waiting", replicas=1, devices_per_pod=4, resource_class=cluster.training)
    too_big = pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)

    run_once(now)
    first = stored()
    assert set(first) == {waiting.pk, too_big.pk}
    assert Explanation.objects.get(workload=waiting).estimated_start is not None

    with CaptureQueriesContext(connection) as queries:
        run_once(now + timedelta(seconds=5))

    assert explanation_writes(queries.captured_queries) == []
    assert stored() == first
    assert ExplanationChange.objects.filter(workload__in=[waiting, too_big]).count() == 2


def values(**changes):
    base = {
        "reason": "InsufficientCapacity",
        "secondary": [],
        "message": "needs 4 h100, 0 free",
        "details": {"free": 0, "estimate": "unknown: 3 running workload(s) have no expected duration"},
        "position_in_queue": 1,
        "position_in_cluster": 2,
        "estimated_start": datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
        "suggestions": [],
    }
    return {**base, **changes}


def test_small_estimate_drift_and_the_notes_counts_are_not_news(settings):
    settings.EXPLANATION_ESTIMATE_TOLERANCE_SECONDS = 60
    stored = values()
    start = stored["estimated_start"]
    assert unchanged(stored, values(), 60)
    assert unchanged(stored, values(estimated_start=start + timedelta(seconds=59)), 60)
    assert not unchanged(stored, values(estimated_start=start + timedelta(seconds=61)), 60)
    assert not unchanged(stored, values(estimated_start=None), 60)
    assert not unchanged(values(estimated_start=None), values(), 60)
    note = {"free": 0, "estimate": "unknown: 4 running workload(s) have no expected duration"}
    assert unchanged(stored, values(details=note), 60)
    assert not unchanged(stored, values(details={**note, "free": 1}), 60)
    assert not unchanged(stored, values(details={"free": 0, "estimate": "from the expected ends"}), 60)
    assert not unchanged(stored, values(position_in_cluster=3), 60)
    assert not unchanged(stored, values(message="needs 4 h100, 1 free"), 60)
    assert not unchanged(None, values(), 60)
