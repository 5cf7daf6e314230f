"""Approvals: who must approve what, deciding with a comment, windows, reservations, escalation."""

from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from broker.audit.models import AuditEvent
from broker.cycle.runner import run_once
from broker.governance import approvals, notify
from broker.governance.models import ApprovalPolicy, ApprovalRequest
from broker.policy.models import Reservation
from broker.workloads import services
from broker.workloads.models import Allocation, ApprovalState, Explanation
from broker.workloads.states import State
from tests.governance.helpers import submit


def test_it_holds_large_reserved_training_for_approval_with_a_due_time(cluster, alice, settings):
    settings.APPROVAL_ESCALATION_SECONDS = 600
    workload = submit(cluster, alice)

    assert (workload.state, workload.approval) == (State.AWAITING_APPROVAL, ApprovalState.REQUESTED)
    request = ApprovalRequest.objects.get(workload=workload)
    assert request.due_at - request.requested_at == timedelta(seconds=600)
    assert request.reasons == ["Large reserved training always needs approval."]
    assert request.cost_per_hour == Decimal("32.00")


def test_it_asks_for_approval_above_a_cost_threshold(cluster, alice):
    ApprovalPolicy.objects.create(resource_class=cluster.training, cost_threshold_per_hour=Decimal("20"))

    cheap = submit(cluster, alice, name="cheap", resource_class=cluster.training, replicas=1)
    dear = submit(cluster, alice, name="dear", resource_class=cluster.training, replicas=2)

    assert cheap.state == State.PENDING
    assert dear.state == State.AWAITING_APPROVAL
    assert "$32.00 per hour is more than the $20.00" in dear.approval_request.reasons[0]


def test_it_approves_with_a_comment_and_the_cycle_admits(cluster, alice, april):
    workload = submit(cluster, alice)
    assert run_once().admitted == ()
    assert Explanation.objects.get(workload=workload).reason == "AwaitingApproval"

    services.approve_workload(workload, april, "  capacity planned for this run ")

    workload.refresh_from_db()
    assert (workload.state, workload.approval) == (State.PENDING, ApprovalState.APPROVED)
    assert (workload.approval_decided_by, workload.approval_comment) == (april, "capacity planned for this run")
    assert run_once().admitted == (workload.pk,)
    event = AuditEvent.objects.get(action="workload.approve", target_id=str(workload.pk))
    assert (event.actor, event.reason) == (april, "capacity planned for this run")


@pytest.mark.parametrize("comment", ["", "   "])
def test_it_refuses_a_decision_without_a_comment(cluster, alice, april, comment):
    workload = submit(cluster, alice)
    with pytest.raises(ValidationError):
        services.approve_workload(workload, april, comment)
    with pytest.raises(ValidationError):
        services.reject_workload(workload, april, comment)
    workload.refresh_from_db()
    assert workload.approval == ApprovalState.REQUESTED


def test_it_refuses_self_approval_and_lets_another_approver_decide(cluster, paula, april):
    workload = submit(cluster, paula)

    with pytest.raises(PermissionDenied):
        services.approve_workload(workload, paula, "I promise it is fine")
    with pytest.raises(PermissionDenied):
        services.reject_workload(workload, paula, "never mind")
    workload.refresh_from_db()
    assert workload.approval == ApprovalState.REQUESTED
    assert not AuditEvent.objects.filter(action__in=["workload.approve", "workload.reject"]).exists()

    services.approve_workload(workload, april, "checked by a second approver")
    workload.refresh_from_db()
    assert workload.approval_decided_by == april


def test_it_never_schedules_a_rejected_request_and_takes_it_out_of_the_queue(cluster, alice, april):
    ahead = submit(cluster, alice, name="ahead")
    behind = submit(cluster, alice, name="behind")
    run_once()
    assert Explanation.objects.get(workload=behind).position_in_queue == 2

    services.reject_workload(ahead, april, "no budget this quarter")

    for _ in range(3):
        assert ahead.pk not in run_once().admitted
    ahead.refresh_from_db()
    assert (ahead.state, ahead.approval) == (State.REJECTED, ApprovalState.REJECTED)
    assert ahead.finished_at is not None
    assert ahead.transitions.last().to_state == State.REJECTED
    assert not Allocation.objects.filter(workload=ahead).exists()
    # It left the queue: the request behind it moved up, and the queue's counts leave it out.
    assert Explanation.objects.get(workload=behind).position_in_queue == 1
    with pytest.raises(services.ActionRefused):
        services.approve_workload(ahead, april, "changed my mind")


def test_it_refuses_to_approve_a_request_its_team_may_not_use(cluster, alice, bob, april):
    workload = submit(cluster, alice)
    cluster.reserved.allowed_teams.set([cluster.team_b])  # the menu changed after it was submitted

    with pytest.raises(services.ActionRefused, match="team-a may not use large-reserved-training"):
        services.approve_workload(workload, april, "looks fine")

    workload.refresh_from_db()
    assert (workload.state, workload.approval) == (State.AWAITING_APPROVAL, ApprovalState.REQUESTED)
    assert not AuditEvent.objects.filter(action="workload.approve").exists()
    services.reject_workload(workload, april, "not entitled to this class")
    workload.refresh_from_db()
    assert workload.state == State.REJECTED


def test_it_keeps_an_approved_workload_out_of_the_cycle_until_its_window_opens(cluster, alice, april):
    now = timezone.now()
    opens, closes = now + timedelta(hours=1), now + timedelta(hours=5)
    workload = submit(cluster, alice)

    services.approve_workload(workload, april, "tonight only", not_before=opens, not_after=closes)

    assert run_once(now=now).admitted == ()
    explanation = Explanation.objects.get(workload=workload)
    assert explanation.reason == "AwaitingApproval"
    assert "window opening" in explanation.message
    assert run_once(now=opens + timedelta(seconds=1)).admitted == (workload.pk,)
    event = AuditEvent.objects.get(action="workload.approve", target_id=str(workload.pk))
    assert event.after["not_before"] == opens.isoformat() and event.after["reservation"] is None


def test_it_reserves_the_devices_for_the_team_over_the_window(cluster, alice, april):
    now = timezone.now()
    opens, closes = now + timedelta(hours=1), now + timedelta(hours=3)
    workload = submit(cluster, alice)

    services.approve_workload(workload, april, "reserve r1 tonight", not_before=opens, not_after=closes, reserve=True)

    reservation = Reservation.objects.get()
    assert (reservation.team, reservation.device_class, reservation.count) == (cluster.team_a, cluster.h100, 8)
    assert (reservation.start, reservation.end, reservation.created_by) == (opens, closes, april)
    assert ApprovalRequest.objects.get(workload=workload).reservation == reservation
    assert AuditEvent.objects.get(action="workload.approve").after["reservation"] == reservation.name


def test_it_pins_a_rack_bound_gangs_reservation_to_a_rack_that_holds_it(cluster, alice, april):
    """Issue 27: 2 pods × 4 in one rack; r1 has an unhealthy device, so only r2 holds the gang (as
    built). Without a domain the 8 reserved devices could lie across both racks, usable by nobody."""
    from broker.inventory.models import Device, Health

    broken = Device.objects.filter(node__name="n1").order_by("pk").first()
    Device.objects.filter(pk=broken.pk).update(health=Health.UNHEALTHY)
    now = timezone.now()
    workload = submit(cluster, alice, topology_required="rack")

    services.approve_workload(workload, april, "reserve a rack", not_before=now, not_after=now + timedelta(hours=2),
                              reserve=True)  # fmt: skip

    reservation = Reservation.objects.get()
    assert (reservation.domain.level.name, reservation.domain.name, reservation.count) == ("rack", "r2", 8)


def test_it_reserves_anywhere_for_a_gang_without_a_required_level(cluster, alice, april):
    now = timezone.now()
    workload = submit(cluster, alice)

    services.approve_workload(workload, april, "ok", not_before=now, not_after=now + timedelta(hours=2), reserve=True)

    assert Reservation.objects.get().domain is None


@pytest.mark.parametrize(
    ("offset_before", "offset_after", "reserve", "field"),
    [(2, 1, False, "not_after"), (None, -1, False, "not_after"), (1, None, True, "reserve")],
)
def test_it_refuses_a_window_that_cannot_be_granted(cluster, alice, april, offset_before, offset_after, reserve, field):
    now = timezone.now()
    at = {k: None if v is None else now + timedelta(hours=v) for k, v in (("b", offset_before), ("a", offset_after))}
    workload = submit(cluster, alice)

    with pytest.raises(ValidationError) as error:
        services.approve_workload(workload, april, "ok", not_before=at["b"], not_after=at["a"], reserve=reserve)

    assert field in error.value.message_dict
    workload.refresh_from_db()
    assert (workload.state, workload.approval) == (State.AWAITING_APPROVAL, ApprovalState.REQUESTED)


def test_it_cancels_a_workload_whose_window_closed_before_it_started(cluster, alice, april):
    now = timezone.now()
    workload = submit(cluster, alice)
    services.approve_workload(workload, april, "short window", not_after=now + timedelta(minutes=5))

    assert approvals.expire_windows(now) == []
    assert approvals.expire_windows(now + timedelta(minutes=6)) == [workload.pk]

    workload.refresh_from_db()
    assert workload.state == State.CANCELLED
    assert AuditEvent.objects.filter(action="approval.window_expired", target_id=str(workload.pk)).count() == 1
    assert approvals.expire_windows(now + timedelta(minutes=7)) == []


def test_it_escalates_an_undecided_request_once_and_tells_admins(
    cluster, alice, april, settings, django_capture_on_commit_callbacks
):
    settings.APPROVAL_ESCALATION_SECONDS = 60
    workload = submit(cluster, alice)
    decided = submit(cluster, alice, name="decided")
    services.approve_workload(decided, april, "fine")
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(notify.ADMINS, channel)

    now = timezone.now()
    assert approvals.escalate_overdue(now) == []
    with django_capture_on_commit_callbacks(execute=True):
        assert approvals.escalate_overdue(now + timedelta(seconds=61)) == [workload.pk]
    assert approvals.escalate_overdue(now + timedelta(seconds=120)) == []

    message = async_to_sync(layer.receive)(channel)
    assert message == {"type": "approval.escalated", "workload": workload.pk}
    assert ApprovalRequest.objects.get(workload=workload).escalated_at == now + timedelta(seconds=61)
    event = AuditEvent.objects.get(action="approval.escalate")
    assert (event.target_id, event.actor_name, event.after["waited_seconds"]) == (str(workload.pk), "system", 61)
    async_to_sync(layer.group_discard)(notify.ADMINS, channel)
