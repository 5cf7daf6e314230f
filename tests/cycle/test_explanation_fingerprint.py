"""The commit compares explanations by a stored fingerprint: it must see every change `unchanged` sees,
and nothing it does not."""

import dataclasses
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.utils import timezone

from broker.cycle import bulk
from broker.cycle.commit import EXPLANATION_FIELDS, explanation_content, fingerprint, plain, stored_row
from broker.cycle.runner import run_once
from broker.scheduler.cycle import decide
from broker.scheduler.snapshot import PendingDecision, Suggestion
from broker.workloads.models import Explanation, ExplanationChange, SchedulingCycle
from tests.cycle.helpers import pending

DECISION = PendingDecision(
    workload_id="7",
    reason="InsufficientCapacity",
    secondary=("QuotaExceeded",),
    message="needs 4 h100, 0 free",
    details={
        "free": 0,
        "needed": {"devices": 4},
        "estimate": "unknown: 3 running workload(s) have no expected duration",
    },
    position_in_queue=1,
    position_in_cluster=2,
    estimated_start=1_800_000_000.2,
    suggestions=(Suggestion(kind="ShrinkGang", description="run 2 pods", change={"replicas": 2}),),
)
CHANGES = {
    "reason": "QuotaExceeded",
    "secondary": ("QuotaExceeded", "Topology"),
    "message": "needs 4 h100, 1 free",
    "details": {**DECISION.details, "needed": {"devices": 5}},
    "position_in_queue": 2,
    "position_in_cluster": None,
    "suggestions": (Suggestion(kind="ShrinkGang", description="run 2 pods", change={"replicas": 3}),),
}


def digest(decision):
    return fingerprint(explanation_content(decision))


def test_it_covers_every_compared_field():
    assert set(CHANGES) == set(EXPLANATION_FIELDS) - {"estimated_start"}, "a new field needs a case here"
    for name, value in CHANGES.items():
        assert digest(dataclasses.replace(DECISION, **{name: value})) != digest(DECISION), name


def test_it_ignores_what_unchanged_ignores():
    same = [
        dataclasses.replace(DECISION, estimated_start=DECISION.estimated_start + 3600),  # compared beside it
        dataclasses.replace(
            DECISION,
            details={**DECISION.details, "estimate": "unknown: 41 running workload(s) have no expected duration"},
        ),
        dataclasses.replace(DECISION, details=dict(reversed(DECISION.details.items()))),  # key order
        dataclasses.replace(DECISION, secondary=list(DECISION.secondary)),  # a list is stored as the tuple is
    ]
    assert {digest(decision) for decision in same} == {digest(DECISION)}
    reworded = dataclasses.replace(DECISION, details={**DECISION.details, "estimate": "from the expected ends"})
    assert digest(reworded) != digest(DECISION)


def test_it_tells_a_number_from_its_text():
    as_text = dataclasses.replace(DECISION, details={**DECISION.details, "free": "0"})
    assert digest(as_text) != digest(DECISION)


def rewriting(change):
    """A decider that decides, then applies `change` to every pending decision."""

    def decider(snapshot, **options):
        result = decide(snapshot, **options)
        return dataclasses.replace(result, pending=tuple(change(d) for d in result.pending))

    return decider


def stored(workload):
    return Explanation.objects.values("cycle_id", "details", "fingerprint").get(workload=workload)


@pytest.fixture
def waiting(cluster):
    workload = pending(cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training)
    run_once()
    return workload


def test_it_rewrites_an_explanation_when_only_its_details_changed(waiting):
    first = stored(waiting)
    assert len(first["fingerprint"]) == 32

    run = run_once(decider=rewriting(lambda d: dataclasses.replace(d, details={**d.details, "free": 99})))

    second = stored(waiting)
    assert second["cycle_id"] == run.cycle_id
    assert second["details"]["free"] == 99
    assert second["fingerprint"] != first["fingerprint"]
    assert ExplanationChange.objects.filter(workload=waiting).count() == 1, "same reason and message: no history"


def test_it_rewrites_an_explanation_without_a_fingerprint_once(waiting):
    Explanation.objects.filter(workload=waiting).update(fingerprint="")  # as the migration leaves old rows

    run = run_once()
    again = run_once()

    assert run.cycle_id != again.cycle_id
    assert stored(waiting)["cycle_id"] == run.cycle_id
    assert stored(waiting)["fingerprint"]
    assert ExplanationChange.objects.filter(workload=waiting).count() == 1


def test_it_rewrites_an_explanation_another_writer_saved(waiting):
    explanation = Explanation.objects.get(workload=waiting)
    said = explanation.message
    Explanation.objects.update_or_create(
        workload=waiting, defaults={"reason": "AwaitingApproval", "message": "window opens later", "details": {}}
    )
    assert Explanation.objects.get(workload=waiting).fingerprint == ""

    run = run_once()

    explanation.refresh_from_db()
    assert (explanation.cycle_id, explanation.message) == (run.cycle_id, said)
    assert ExplanationChange.objects.filter(workload=waiting).count() == 2


def test_it_stores_encoded_json_as_the_orm_stores_the_value(cluster):
    workloads = [pending(cluster.queue_a, f"w{i}") for i in range(2)]
    cycle = SchedulingCycle.objects.create()
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    content = explanation_content(
        dataclasses.replace(DECISION, details={**DECISION.details, "text": 'tab\t"quote" \\ ü 🚀', "at": at})
    )
    fast_row = stored_row(workloads[0].pk, cycle.pk, timezone.now(), content)[:-1]  # the fingerprint aside
    assert isinstance(fast_row[6], bulk.JsonText)  # details
    orm_values = {**content, **plain_json(content)}
    rows = [fast_row, (workloads[1].pk, cycle.pk, timezone.now(), *(orm_values[name] for name in EXPLANATION_FIELDS))]

    bulk.upsert_rows(
        Explanation,
        ("workload_id", "cycle_id", "updated_at", *EXPLANATION_FIELDS),
        rows,
        unique_fields=["workload_id"],
        update_fields=["cycle_id"],
    )

    fast, orm = (Explanation.objects.get(workload=w) for w in workloads)
    for name in ("secondary", "details", "suggestions"):
        assert getattr(fast, name) == getattr(orm, name), name
    assert fast.details["text"] == 'tab\t"quote" \\ ü 🚀'
    assert fast.details["at"] == str(at)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                # As jsonb: the column keeps each writer's text (key order, escapes) as it came.
                "SELECT details::jsonb::text FROM workloads_explanation WHERE workload_id IN (%s, %s) "
                "ORDER BY workload_id",
                [w.pk for w in workloads],
            )
            first, second = cursor.fetchall()
        assert first == second


def plain_json(content):
    return {name: plain(content[name]) for name in ("secondary", "details", "suggestions")}


def test_it_inserts_new_explanations_and_rewrites_changed_ones_in_one_cycle(cluster, waiting):
    newcomer = pending(cluster.queue_b, "newcomer", replicas=3, devices_per_pod=4, resource_class=cluster.training)

    run = run_once(
        decider=rewriting(lambda d: dataclasses.replace(d, position_in_cluster=(d.position_in_cluster or 0) + 7))
    )

    rows = {e.workload_id: e for e in Explanation.objects.filter(workload__in=[waiting, newcomer])}
    assert {pk: e.cycle_id for pk, e in rows.items()} == {waiting.pk: run.cycle_id, newcomer.pk: run.cycle_id}
    assert all(len(e.fingerprint) == 32 and e.position_in_cluster >= 7 for e in rows.values())
    assert ExplanationChange.objects.filter(workload=newcomer).count() == 1
    assert ExplanationChange.objects.filter(workload=waiting).count() == 1
