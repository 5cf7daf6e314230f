"""What the commit writes for admissions and nominations, whichever statements it uses to write it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from broker.cycle.bulk import column_in, pk_in
from broker.cycle.runner import run_once
from broker.inventory.models import Device
from broker.workloads.models import Workload
from broker.workloads.states import State
from tests.cycle.helpers import pending, running


def test_it_clears_the_nomination_and_eviction_record_of_an_admitted_workload(cluster):
    devices = list(Device.objects.order_by("pk")[:4])
    preemptor = pending(cluster.queue_b, "preemptor", state=State.SUCCEEDED)
    # A requeued victim: it still carries its last eviction and a nomination.
    requeued = pending(
        cluster.queue_a, "requeued", replicas=1, devices_per_pod=4, resource_class=cluster.training,
        nominated_devices=[device.pk for device in devices], eviction_requested_at=timezone.now() - timedelta(1),
        evicted_for=preemptor, eviction_rule="WithinQueue", eviction_message="made room",
    )  # fmt: skip
    untouched = pending(
        cluster.queue_b, "too-big", replicas=3, devices_per_pod=4, resource_class=cluster.training,
        eviction_rule="Reclaim", eviction_message="from an earlier life",
    )  # fmt: skip

    run = run_once()

    assert run.admitted == (requeued.pk,)
    requeued.refresh_from_db()
    assert requeued.nominated_devices == []
    assert requeued.eviction_requested_at is None
    assert requeued.evicted_for is None
    assert (requeued.eviction_rule, requeued.eviction_message) == ("", "")
    untouched.refresh_from_db()
    assert (untouched.eviction_rule, untouched.eviction_message) == ("Reclaim", "from an earlier life")


def test_it_clears_a_nomination_that_no_longer_helps_a_pending_workload(cluster):
    devices = list(Device.objects.order_by("pk"))
    running(cluster.queue_a, "hog", devices, cluster.h100)
    stale = pending(cluster.queue_b, "stale", nominated_devices=[devices[0].pk])
    plain = pending(cluster.queue_b, "plain")

    run_once()

    stale.refresh_from_db()
    plain.refresh_from_db()
    assert (stale.state, stale.nominated_devices) == ("Pending", [])
    assert plain.nominated_devices == []


@pytest.mark.parametrize("absent", [0, 1, 20_000])
def test_it_selects_exactly_the_given_ids_with_the_bulk_filters(cluster, absent):
    first, second, third = (pending(cluster.queue_a, f"w{i}") for i in range(3))
    pending(cluster.queue_b, "elsewhere")
    wanted = [first.pk, third.pk, *range(10**9, 10**9 + absent)]

    assert set(Workload.objects.filter(**pk_in(wanted)).values_list("pk", flat=True)) == {first.pk, third.pk}
    assert set(Workload.objects.filter(**column_in("queue", [cluster.queue_a.pk])).values_list("pk", flat=True)) == {
        first.pk,
        second.pk,
        third.pk,
    }
    assert not Workload.objects.filter(**pk_in([])).exists()


def test_it_copies_rows_of_plain_columns_in_binary_and_reads_them_back(cluster):
    from django.db import connection

    from broker.cycle.bulk import binary_types, insert_rows
    from broker.workloads.models import Allocation, Explanation, WorkloadTransition

    allocation_fields = [Allocation._meta.get_field(name) for name in ("workload", "device", "pod_set", "released_at")]
    explanation_fields = [Explanation._meta.get_field(name) for name in ("workload", "details")]
    if connection.vendor == "postgresql":
        assert binary_types(allocation_fields) == ["int8", "int8", "text", "timestamptz"]
        assert binary_types(explanation_fields) == ["int8", "json"]
    workload = pending(cluster.queue_a, "moved", replicas=1, devices_per_pod=1)
    at = timezone.now()

    insert_rows(
        WorkloadTransition,
        ("workload_id", "from_state", "to_state", "at", "reason"),
        [(workload.pk, State.PENDING, State.ADMITTED, at, "admitted in cycle 7: é ünïcode\ttab")],
    )

    (row,) = WorkloadTransition.objects.filter(workload=workload, to_state=State.ADMITTED)
    assert (row.from_state, row.at, row.reason) == (State.PENDING, at, "admitted in cycle 7: é ünïcode\ttab")


def test_it_copies_encoded_json_in_binary_as_the_orm_would_store_it(cluster):
    import json

    from broker.cycle.bulk import JsonText, insert_rows
    from broker.workloads.models import Explanation, SchedulingCycle

    workloads = [pending(cluster.queue_a, f"w{index}") for index in range(2)]
    cycle = SchedulingCycle.objects.create()
    details = {"text": 'tab\t"quote" \\ ü 🚀', "n": [1, 2.5, None, True], "nested": {"b": 1, "a": {}}}
    columns = ("workload_id", "cycle_id", "updated_at", "reason", "message", "details", "secondary", "suggestions")
    at = timezone.now()
    rows = [
        (workloads[0].pk, cycle.pk, at, "Reason", "m", JsonText(json.dumps(details)), JsonText("[]"), JsonText("[]")),
        (workloads[1].pk, cycle.pk, at, "Reason", "m", details, ["Quota"], []),  # not encoded by the caller
    ]

    insert_rows(Explanation, columns, rows)

    encoded, plain = (Explanation.objects.get(workload=workload) for workload in workloads)
    assert encoded.details == plain.details == details
    assert (encoded.secondary, plain.secondary, plain.suggestions) == ([], ["Quota"], [])


def test_it_records_a_transition_for_each_workload_it_moved_and_only_those(cluster):
    from broker.cycle.executor import move
    from broker.workloads.models import WorkloadTransition

    moving = [pending(cluster.queue_a, f"w{i}") for i in range(3)]
    gone = pending(cluster.queue_b, "cancelled-meanwhile", state=State.CANCELLED)
    now = timezone.now()

    moved = move([w.pk for w in (*moving, gone)], State.PENDING, State.ADMITTED, now, "admitted in cycle 9",
                 admitted_at=now)  # fmt: skip

    assert moved == 3
    rows = WorkloadTransition.objects.order_by("workload_id").values_list(
        "workload_id", "from_state", "to_state", "at", "reason", "actor_id"
    )
    assert list(rows) == [(w.pk, State.PENDING, State.ADMITTED, now, "admitted in cycle 9", None) for w in moving]
    assert set(Workload.objects.filter(state=State.ADMITTED, admitted_at=now).values_list("pk", flat=True)) == {
        w.pk for w in moving
    }
    assert Workload.objects.get(pk=gone.pk).state == State.CANCELLED


def test_it_writes_what_each_admission_got_in_its_history(cluster):
    from broker.workloads.models import ExplanationChange

    gang = pending(cluster.queue_a, "gang", replicas=2, devices_per_pod=4, resource_class=cluster.training)
    single = pending(cluster.queue_b, "single", replicas=1, devices_per_pod=2, resource_class=cluster.training)

    run_once()

    history = dict(ExplanationChange.objects.filter(reason="Admitted").values_list("workload_id", "message"))
    racks = ("r1", "r2")
    assert history[gang.pk] in {f"admitted: 2 pods, 8 h100 devices in zone z1, block b1, rack {r}" for r in racks}
    assert history[single.pk].startswith("admitted: 1 pods, 2 h100 devices in zone z1, block b1, rack r")


def test_it_updates_rows_from_their_values_each_its_own_and_leaves_the_others(cluster):
    from broker.cycle.bulk import update_rows

    preemptor = pending(cluster.queue_b, "preemptor")
    first, second, untouched = (pending(cluster.queue_a, name, eviction_rule="Old") for name in ("a", "b", "c"))
    at = timezone.now()

    updated = update_rows(
        Workload,
        ("eviction_requested_at", "evicted_for_id", "eviction_rule", "eviction_message"),
        [(first.pk, at, preemptor.pk, "WithinQueue", 'tab\t"quote" ü'), (second.pk, None, None, "", "none")],
    )

    assert updated == 2
    first, second, untouched = (Workload.objects.get(pk=w.pk) for w in (first, second, untouched))
    assert (first.eviction_requested_at, first.evicted_for, first.eviction_rule) == (at, preemptor, "WithinQueue")
    assert first.eviction_message == 'tab\t"quote" ü'
    assert (second.eviction_requested_at, second.evicted_for_id, second.eviction_rule) == (None, None, "")
    assert (untouched.eviction_rule, untouched.eviction_message) == ("Old", "")
    update_rows(Workload, ("eviction_requested_at",), [(untouched.pk, at - timedelta(hours=1))])
    assert Workload.objects.get(pk=untouched.pk).eviction_requested_at == at - timedelta(hours=1)
    assert update_rows(Workload, ("eviction_rule",), []) == 0
    with pytest.raises(ValueError, match="JSON"):
        update_rows(Workload, ("nominated_devices",), [(first.pk, [1])])
