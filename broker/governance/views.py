"""Governance pages: the resource-class menu and its editor, the approvals inbox, the audit trail, the
login lockouts.

Who may open which page is in broker.governance.access (one table for every page); the views check
again where an action needs it, so a page is safe even if it is routed around the middleware."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from broker.audit.api.views import csv_rows
from broker.audit.models import AuditEvent
from broker.governance import lockouts, menu, policy
from broker.governance.forms import AuditFilterForm, DecisionForm, ResourceClassForm
from broker.policy import roles
from broker.policy.models import ResourceClass
from broker.workloads import services
from broker.workloads.models import ApprovalState, Workload
from broker.workloads.states import State

AUDIT_PAGE_SIZE = 50
RECENT_DECISIONS = 20


def require(allowed, message):
    if not allowed:
        raise PermissionDenied(message)


# --- the menu ------------------------------------------------------------------------------------------------


@login_required
@require_GET
def menu_page(request):
    visible = list(menu.classes_for(request.user))
    classes = menu.describe_all(visible)
    context = {
        "classes": classes,
        "preemption": menu.preemption_matrix(visible),
        "is_operator": roles.is_operator(request.user),
        "whole_menu": menu.sees_whole_menu(request.user),
    }
    return render(request, "governance/menu.html", context)


@login_required
def class_edit(request, pk=None):
    require(roles.is_operator(request.user), "Only operators edit the menu.")
    instance = get_object_or_404(ResourceClass, pk=pk) if pk else None
    form = ResourceClassForm(request.POST or None, instance=instance)
    if request.method == "POST" and form.is_valid():
        before = policy.snapshot(instance) if instance else None
        resource_class = policy.save_resource_class(form, request.user)
        changed = policy.changed_fields(before, policy.snapshot(resource_class))
        messages.success(request, f"Saved {resource_class}: {', '.join(changed) or 'nothing changed'}.")
        return redirect("governance:menu")
    return render(request, "governance/class_form.html", {"form": form, "resource_class": instance})


# --- approvals -----------------------------------------------------------------------------------------------


def awaiting():
    return (
        Workload.objects.filter(state=State.AWAITING_APPROVAL, approval=ApprovalState.REQUESTED)
        .select_related("team", "queue", "resource_class", "submitted_by", "approval_request")
        .prefetch_related("pod_sets")
        .order_by("submitted_at", "id")
    )


def approval_row(workload, user, form=None):
    """What one inbox row shows: the request, why it needs approval, and whether this user may decide."""
    approval_request = getattr(workload, "approval_request", None)
    return {
        "workload": workload,
        "request": approval_request,
        "own": workload.submitted_by_id == user.pk,
        "not_entitled": services.entitlement_refusal(workload),
        "overdue": approval_request is not None and approval_request.due_at <= timezone.now(),
        "form": form or DecisionForm(prefix=f"w{workload.pk}"),
    }


@login_required
@require_GET
def approvals_page(request):
    require(roles.is_approver(request.user), "Only approvers decide on approvals.")
    decided = (
        Workload.objects.filter(approval__in=[ApprovalState.APPROVED, ApprovalState.REJECTED])
        .select_related("team", "resource_class", "submitted_by", "approval_decided_by", "approval_request")
        .order_by("-approval_decided_at")[:RECENT_DECISIONS]
    )
    context = {"rows": [approval_row(w, request.user) for w in awaiting()], "decided": decided}
    return render(request, "governance/approvals.html", context)


@login_required
@require_GET
def approval_row_fragment(request, pk):
    """One inbox row, for the page's script when the socket says a request arrived or changed."""
    require(roles.is_approver(request.user), "Only approvers decide on approvals.")
    workload = awaiting().filter(pk=pk).first()
    context = {"row": approval_row(workload, request.user) if workload else None, "pk": pk}
    return render(request, "governance/_approval_row.html", context)


@login_required
@require_POST
def decide(request, pk, verdict):
    require(roles.is_approver(request.user), "Only approvers decide on approvals.")
    workload = get_object_or_404(Workload, pk=pk)
    form = DecisionForm(request.POST, prefix=f"w{pk}")
    if not form.is_valid():
        messages.error(request, f"{workload.name}: {' '.join(m for ms in form.errors.values() for m in ms)}")
        return redirect("governance:approvals")
    data = form.cleaned_data
    try:
        if verdict == "approve":
            services.approve_workload(
                workload, request.user, data["comment"], data["not_before"], data["not_after"], data["reserve"]
            )
        else:
            services.reject_workload(workload, request.user, data["comment"])
    except PermissionDenied as error:
        messages.error(request, f"{workload.name}: {error}")
    except ValidationError as error:
        messages.error(request, f"{workload.name}: {' '.join(error.messages)}")
    except services.ActionRefused as error:
        messages.error(request, f"{workload.name}: {error}")
    else:
        messages.success(request, f"{'Approved' if verdict == 'approve' else 'Rejected'} {workload.name}.")
    return redirect("governance:approvals")


# --- audit ---------------------------------------------------------------------------------------------------


def filtered_events(data):
    events = AuditEvent.objects.all()
    if data.get("q"):
        q = data["q"]
        events = events.filter(
            Q(actor_name__icontains=q)
            | Q(action__icontains=q)
            | Q(target_type__icontains=q)
            | Q(target_repr__icontains=q)
            | Q(reason__icontains=q)
        )
    for field, lookup in (("action", "action"), ("actor", "actor_name"), ("target_type", "target_type")):
        if data.get(field):
            events = events.filter(**{lookup: data[field]})
    if data.get("target_id"):
        events = events.filter(target_id=data["target_id"])
    source = data.get("source") or ""
    if source != "all":
        events = events.filter(replayed=source == "replay")
    if data.get("manual") in ("yes", "no"):
        events = events.filter(manual_intervention=data["manual"] == "yes")
    if data.get("after"):
        events = events.filter(at__gte=data["after"])
    if data.get("before"):
        events = events.filter(at__lt=data["before"])
    return events.order_by("-at", "-id")


def audit_filters(request):
    form = AuditFilterForm(request.GET or None)
    return form, (form.cleaned_data if form.is_valid() else {})


def may_read_audit(user):
    return roles.is_operator(user) or roles.is_approver(user)


@login_required
@require_GET
def audit_page(request):
    require(may_read_audit(request.user), "Operators, approvers and admins read the audit trail.")
    form, data = audit_filters(request)
    page = Paginator(filtered_events(data), AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "actions": AuditEvent.objects.order_by("action").values_list("action", flat=True).distinct(),
        "target_types": AuditEvent.objects.order_by("target_type").values_list("target_type", flat=True).distinct(),
    }
    return render(request, "governance/audit.html", context)


@login_required
@require_GET
def audit_export(request):
    require(may_read_audit(request.user), "Operators, approvers and admins read the audit trail.")
    _form, data = audit_filters(request)
    response = StreamingHttpResponse(csv_rows(filtered_events(data)), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="audit-{timezone.now():%Y%m%d-%H%M%S}.csv"'
    return response


# --- login lockouts ------------------------------------------------------------------------------------------


@login_required
@require_GET
def lockouts_page(request):
    require(roles.is_operator(request.user), "Operators and admins see and lift login lockouts.")
    context = {
        "locked": lockouts.current_lockouts(),
        "failing": lockouts.recent_failures(),
        "limit": settings.AXES_FAILURE_LIMIT,
        "minutes": lockouts.cool_off_minutes(),
    }
    return render(request, "governance/lockouts.html", context)


@login_required
@require_POST
def lockout_lift(request, pk):
    require(roles.is_operator(request.user), "Operators and admins see and lift login lockouts.")
    attempt = get_object_or_404(lockouts.attempts(), pk=pk)
    reason = request.POST.get("reason", "").strip()[:2000]
    if not reason:
        messages.error(request, "Say why the lockout is lifted.")
    else:
        lockouts.lift(attempt, request.user, reason)
        messages.success(request, f"{attempt.username} may log in from {attempt.ip_address} again.")
    return redirect("governance:lockouts")
