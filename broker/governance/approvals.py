"""Approval policy and the approval request's life: why a request needs approval, telling approvers,
granting a window and a reservation, escalating what nobody decided, closing windows that passed.

The workload services (broker.workloads.services) call these inside their transactions; the
governance tick (broker.governance.tasks) runs the time-driven parts.
"""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from broker import events
from broker.audit.models import record
from broker.governance.models import ApprovalPolicy, ApprovalRequest
from broker.policy.models import Reservation
from broker.workloads.models import ApprovalState, Explanation, ExplanationChange, Workload
from broker.workloads.states import State

WINDOW_STATES = (State.PENDING, State.PREEMPTED)


def price_per_hour(resource_class):
    """Price of one device-hour in the class's first-choice device class (what a request pays at most
    when the fallbacks are cheaper); None when the class offers no device class."""
    choices = resource_class.ordered_device_classes()
    return choices[0].price_per_hour if choices else None


def request_cost_per_hour(resource_class, devices):
    price = price_per_hour(resource_class)
    return None if price is None else (price * devices).quantize(Decimal("0.01"))


def cost_threshold(resource_class):
    try:
        return resource_class.approval_policy.cost_threshold_per_hour
    except ApprovalPolicy.DoesNotExist:
        return None


def approval_reasons(resource_class, devices):
    """Why a request of `devices` devices in this class needs approval, as sentences; [] when it does not."""
    reasons = []
    if resource_class.approval_required:
        reasons.append(f"{resource_class} always needs approval.")
    threshold = resource_class.approval_threshold_devices
    if threshold is not None and devices > threshold:
        reasons.append(f"{devices} devices is more than the {threshold} {resource_class} allows without approval.")
    limit = cost_threshold(resource_class)
    cost = request_cost_per_hour(resource_class, devices)
    if limit is not None and cost is not None and cost > limit:
        reasons.append(f"${cost:.2f} per hour is more than the ${limit:.2f} {resource_class} allows without approval.")
    return reasons


def open_request(workload, reasons, at=None):
    """Record the request (inside the submit transaction) and tell approvers once it commits."""
    at = at or timezone.now()
    approval_request = ApprovalRequest.objects.create(
        workload=workload,
        requested_at=at,
        due_at=at + timedelta(seconds=settings.APPROVAL_ESCALATION_SECONDS),
        reasons=reasons,
        cost_per_hour=request_cost_per_hour(workload.resource_class, workload.total_devices),
    )
    events.approval_changed_after_commit("approval.requested", workload.pk)
    return approval_request


def request_for(workload):
    """The workload's ApprovalRequest, created for one submitted before governance existed."""
    found = ApprovalRequest.objects.filter(workload=workload).first()
    if found is not None:
        return found
    return ApprovalRequest.objects.create(
        workload=workload,
        requested_at=workload.submitted_at,
        due_at=workload.submitted_at + timedelta(seconds=settings.APPROVAL_ESCALATION_SECONDS),
        reasons=approval_reasons(workload.resource_class, workload.total_devices) if workload.resource_class else [],
    )


# --- the grant -------------------------------------------------------------------------------------------


def window_errors(not_before, not_after, reserve, now):
    errors = {}
    if not_before and not_after and not_after <= not_before:
        errors["not_after"] = "The window must end after it starts."
    elif not_after and not_after <= now:
        errors["not_after"] = "The window has already closed."
    if reserve and not not_after:
        errors["reserve"] = "A reservation needs a window with an end."
    return errors


def reserve_for(workload, actor, start, end, comment):
    """A Reservation holding the workload's devices for its team over the window."""
    device_class = workload.resource_class.ordered_device_classes()[0]
    return Reservation.objects.create(
        name=f"approval-{workload.pk}",
        team=workload.team,
        device_class=device_class,
        count=workload.total_devices,
        start=start,
        end=end,
        reason=f"approved for {workload}: {comment}",
        created_by=actor,
    )


def grant(workload, actor, comment, not_before=None, not_after=None, reserve=False, now=None):
    """Attach the window and reservation to an approval being given (inside its transaction);
    returns the ApprovalRequest. Raises ValidationError for a window that cannot be granted."""
    now = now or timezone.now()
    errors = window_errors(not_before, not_after, reserve, now)
    if reserve and not errors and not workload.resource_class.ordered_device_classes():
        errors["reserve"] = f"{workload.resource_class} offers no device class to reserve."
    if errors:
        raise ValidationError(errors)
    approval_request = request_for(workload)
    approval_request.not_before = not_before
    approval_request.not_after = not_after
    if reserve:
        approval_request.reservation = reserve_for(workload, actor, not_before or now, not_after, comment)
    approval_request.save()
    if not_before and not_before > now:
        explain_closed_window(workload, approval_request, actor, now)
    return approval_request


def grant_summary(approval_request):
    """The audit event's view of what an approval granted."""
    reservation = approval_request.reservation
    return {
        "not_before": approval_request.not_before.isoformat() if approval_request.not_before else None,
        "not_after": approval_request.not_after.isoformat() if approval_request.not_after else None,
        "reservation": reservation.name if reservation else None,
    }


def explain_closed_window(workload, approval_request, actor, now):
    """The loader keeps a workload whose window has not opened out of the cycle, so no cycle explains
    it; say here why it waits. The first cycle after the window opens replaces this explanation."""
    message = (
        f"Approved by {actor.get_username()} for a window opening {approval_request.not_before:%Y-%m-%d %H:%M %Z}; "
        "it joins its queue then."
    )
    Explanation.objects.update_or_create(
        workload=workload,
        defaults={
            "reason": "AwaitingApproval",
            "message": message,
            "details": {"window": grant_summary(approval_request)},
            "secondary": [],
            "suggestions": [],
            "position_in_queue": None,
            "position_in_cluster": None,
            "estimated_start": approval_request.not_before,
            "updated_at": now,
        },
    )
    ExplanationChange.objects.create(workload=workload, reason="AwaitingApproval", message=message, at=now)


# --- the clock: escalation and expiry ----------------------------------------------------------------------


def overdue(now):
    return ApprovalRequest.objects.filter(
        escalated_at__isnull=True,
        due_at__lte=now,
        workload__state=State.AWAITING_APPROVAL,
        workload__approval=ApprovalState.REQUESTED,
    ).select_related("workload")


def escalate_overdue(now=None):
    """Mark every request undecided past its due time escalated, audit it and tell admins; returns the
    escalated workload ids."""
    now = now or timezone.now()
    escalated = []
    with transaction.atomic():
        for approval_request in overdue(now).select_for_update(skip_locked=True, of=("self",)):
            approval_request.escalated_at = now
            approval_request.save(update_fields=["escalated_at"])
            waited = int((now - approval_request.requested_at).total_seconds())
            record(
                "approval.escalate",
                approval_request.workload,
                before={"escalated": False},
                after={"escalated": True, "waited_seconds": waited, "due_at": approval_request.due_at.isoformat()},
                reason=f"undecided for {waited} s (limit {int(settings.APPROVAL_ESCALATION_SECONDS)} s)",
            )
            events.approval_changed_after_commit("approval.escalated", approval_request.workload_id)
            events.approval_changed_after_commit("approval.updated", approval_request.workload_id)
            escalated.append(approval_request.workload_id)
    return escalated


def expire_windows(now=None):
    """A workload whose approval window closed before it was admitted will never be schedulable:
    cancel it (audited) rather than leave it waiting forever; returns the cancelled ids. A workload
    already running when its window closes is left running: stopping work is an operator's call."""
    now = now or timezone.now()
    expired = []
    with transaction.atomic():
        rows = (
            ApprovalRequest.objects.filter(not_after__lte=now, window_expired_at__isnull=True)
            .select_related("workload")
            .select_for_update(skip_locked=True, of=("self",))
        )
        for approval_request in rows:
            approval_request.window_expired_at = now
            approval_request.save(update_fields=["window_expired_at"])
            workload = Workload.objects.select_for_update().get(pk=approval_request.workload_id)
            if workload.state not in WINDOW_STATES:
                continue
            before = workload.state
            workload.transition(State.CANCELLED, reason="its approval window closed before it could start", at=now)
            record(
                "approval.window_expired",
                workload,
                before={"state": before},
                after={"state": workload.state, **grant_summary(approval_request)},
                reason="the approval window closed before the workload was admitted",
            )
            expired.append(workload.pk)
    return expired
