"""Dashboard pages and the JSON endpoints their scripts and the live socket's catch-up read."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from broker import limits
from broker.inventory import services as inventory_services
from broker.inventory.models import Device, Domain, Health, Node
from broker.policy.roles import is_operator, sees_all_workloads, team_ids
from broker.workloads import services as workload_services
from broker.workloads.models import Workload
from broker.workloads.states import FINAL_STATES, WAITING_STATES
from dashboard import advice, broadcast, live_health, queries
from dashboard.forms import PriorityForm, SubmitForm, entitled_resource_classes, plain_words, resubmission_initial
from dashboard.whatif import would_start


def back_to(request, view_name, **kwargs):
    """Where a POST action returns: its `next` when that is a path on this host, else `view_name`. Any
    other `next` (another host, a scheme, //host) is ignored: a crafted form must not send an operator
    off-site after a real action."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        return redirect(target)
    return redirect(view_name, **kwargs)


def page_number(request):
    return limits.page_number(request.GET.get("page"))


# --- pages -----------------------------------------------------------------------------------------------


@login_required
def overview(request):
    data = queries.overview(request.user)
    context = {**data, "changes": queries.last_cycle_changes(request.user)}
    return render(request, "dashboard/overview.html", context)


@login_required
def queue(request):
    filters = queries.queue_filters(request.GET)
    context = {
        "filters": filters,
        "choices": queries.filter_choices(request.user),
        "pending": queries.pending_rows(request.user, filters, page_number(request)),
        "running": queries.running_rows(request.user, filters),
        "hidden": queries.hidden_pending(request.user),
        "sees_all": sees_all_workloads(request.user),
        "is_operator": is_operator(request.user),
    }
    return render(request, "dashboard/queue.html", context)


def visible_workload_or_404(user, pk):
    workload = get_object_or_404(Workload.objects.select_related("team", "queue", "resource_class"), pk=pk)
    if not queries.can_see(user, workload.team_id):
        # Another team's workload does not exist for a member: no name, no reason, no placement.
        raise Http404("No such workload.")
    return workload


@login_required
def workload_detail(request, pk):
    workload = visible_workload_or_404(request.user, pk)
    context = queries.workload_detail(workload)
    context["is_operator"] = is_operator(request.user)
    context["can_cancel"] = workload.state not in FINAL_STATES and (
        is_operator(request.user) or workload.team_id in team_ids(request.user)
    )
    explanation = context["explanation"]
    context["advice"] = (
        advice.for_viewer(request.user, workload, context["pod_sets"], explanation.suggestions)
        if explanation is not None and context["row"]["reason"]
        else []
    )
    return render(request, "dashboard/workload.html", context)


@login_required
def history(request):
    scope, sort = queries.history_params(request.GET)
    context = {
        "scope": scope,
        "sort": sort,
        "history": queries.history_rows(request.user, scope, sort, page_number(request)),
        "in_team": bool(team_ids(request.user)),
        "columns": [
            ("name", "Workload"),
            ("state", "State"),
            ("priority", "Priority"),
            ("submitted", "Submitted"),
            ("started", "Started"),
            ("finished", "Ended"),
        ],
    }
    return render(request, "dashboard/history.html", context)


@login_required
def topology(request):
    context = {"is_operator": is_operator(request.user), "clusters": queries.kube_clusters()}
    return render(request, "dashboard/topology.html", context)


@login_required
def teams(request):
    return render(
        request,
        "dashboard/teams.html",
        {"queues": queries.quota_usage(), "usage": queries.usage_over_time()},
    )


@login_required
def submit(request):
    replacing = replaced_workload(request)
    initial = None
    if request.method != "POST" and replacing is not None:
        changes = {name: request.GET[name] for name in advice.FORM_FIELDS if name in request.GET}
        initial = resubmission_initial(replacing, replacing.pod_sets.get(), changes)
    form = SubmitForm(request.user, request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            with transaction.atomic():
                workload = workload_services.submit_workload(form.submission(), request.user)
                cancelled = replace(replacing, workload, request.user)
        except workload_services.InvalidSubmission as error:
            form.add_service_errors(error.errors)
        else:
            messages.success(request, f"Submitted {workload.name}; the next cycle decides where it runs.")
            if cancelled:
                messages.info(request, f"Cancelled {replacing.name}: {workload.name} replaces it.")
            elif replacing is not None:
                messages.warning(request, f"{replacing.name} no longer waits, so it was not cancelled.")
            for advice_item in workload.guidance:  # wrong-class advice from broker.governance.guidance
                messages.warning(request, advice_item["message"])
            return redirect("dashboard:workload", pk=workload.pk)
    classes = [
        {"rc": rc, "words": plain_words(rc), "price": rc_price(rc)} for rc in entitled_resource_classes(request.user)
    ]
    return render(request, "dashboard/submit.html", {"form": form, "classes": classes, "replacing": replacing})


def replaced_workload(request):
    """The workload a resubmission replaces: `from` of a suggestion's link (it must be waiting),
    `replaces` of the form's box (unticked: the original keeps waiting). None unless the user may
    resubmit it through the form: a link for another team's workload opens an empty form."""
    posted = request.method == "POST"
    raw = request.POST.get("replaces", "") if posted else request.GET.get("from", "")
    if not raw.isdigit():
        return None
    workload = Workload.objects.select_related("team", "queue", "resource_class").filter(pk=int(raw)).first()
    if workload is None or not advice.may_resubmit(request.user, workload, waiting=not posted):
        return None
    if not advice.resubmittable(workload, list(workload.pod_sets.all())):
        return None
    return workload


def replace(original, workload, user):
    """Cancel `original` now that `workload` says it again; False when it no longer waits: it may have
    started since the form opened, and then both stay for the user to decide."""
    if original is None:
        return False
    current = Workload.objects.select_for_update().get(pk=original.pk)
    if current.state not in WAITING_STATES:
        return False
    workload_services.cancel_workload(current, user, reason=f"replaced by {workload.name}")
    return True


def rc_price(resource_class):
    choices = resource_class.ordered_device_classes()
    return float(choices[0].price_per_hour) if choices else None


@login_required
@require_POST
def submit_whatif(request):
    form = SubmitForm(request.user, request.POST)
    if not form.is_valid():
        return JsonResponse({"ok": False, "errors": form.errors.get_json_data()}, status=400)
    submission = form.submission()
    errors = workload_services.submission_errors(submission, request.user)
    errors.pop("name", None)  # a what-if never stores the workload, so a clashing name does not matter
    if errors:
        form.add_service_errors(errors)  # by the form's fields, as a submission shows them
        return JsonResponse({"ok": False, "errors": form.errors.get_json_data()}, status=400)
    return JsonResponse({"ok": True, **would_start(submission, request.user)})


# --- operator actions ------------------------------------------------------------------------------------


def require_operator(user):
    if not is_operator(user):
        raise PermissionDenied("Only operators may do this.")


@login_required
@require_POST
def node_cordon(request, pk):
    require_operator(request.user)
    node = get_object_or_404(Node, pk=pk)
    cordon = request.POST.get("cordoned") == "true"
    inventory_services.set_cordoned(node, request.user, cordon, reason=request.POST.get("reason", ""))
    workload_services.request_cycle_after_commit(f"node {node.name} {'cordoned' if cordon else 'uncordoned'}")
    broadcast.inventory_changed(domain_ids=[node.domain_id])
    messages.success(request, f"{node.name} is {'cordoned' if cordon else 'schedulable again'}.")
    return back_to(request, "dashboard:topology")


@login_required
@require_POST
def device_health(request, pk):
    require_operator(request.user)
    device = get_object_or_404(Device.objects.select_related("node"), pk=pk)
    health = request.POST.get("health")
    if health not in (Health.HEALTHY, Health.UNHEALTHY):
        raise ValidationError("health must be Healthy or Unhealthy")
    inventory_services.set_health(device, request.user, health, reason=request.POST.get("reason", ""))
    workload_services.request_cycle_after_commit(f"device {device.qualified_name} marked {health}")
    broadcast.inventory_changed(domain_ids=[device.node.domain_id])
    messages.success(request, f"{device.qualified_name} marked {health}.")
    return back_to(request, "dashboard:topology")


@login_required
@require_POST
def workload_cancel(request, pk):
    workload = visible_workload_or_404(request.user, pk)
    if not (is_operator(request.user) or workload.team_id in team_ids(request.user)):
        raise PermissionDenied("Only the team or an operator may cancel this workload.")
    try:
        workload_services.cancel_workload(workload, request.user, reason=request.POST.get("reason", ""))
    except workload_services.ActionRefused as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Cancelled {workload.name}.")
    return back_to(request, "dashboard:workload", pk=workload.pk)


@login_required
@require_POST
def workload_priority(request, pk):
    require_operator(request.user)
    workload = visible_workload_or_404(request.user, pk)
    form = PriorityForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The priority was not changed. {form.error_text()}")
        return redirect("dashboard:workload", pk=workload.pk)
    priority = form.cleaned_data["priority"]
    try:
        workload_services.change_priority(workload, request.user, priority, reason=form.cleaned_data["reason"])
    except workload_services.ActionRefused as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"{workload.name} now has priority {priority}.")
    return redirect("dashboard:workload", pk=workload.pk)


# --- JSON ------------------------------------------------------------------------------------------------


@login_required
@require_GET
def api_overview(request):
    data = queries.overview(request.user)
    return JsonResponse(
        {
            "capacity": data["capacity"],
            "pending": data["pending"],
            "series": data["series"],
            "counters": data["counters"],
            "live_paused": not live_health.redis_up(),
        }
    )


@login_required
@require_GET
def api_heatmap(request):
    return JsonResponse(queries.heatmap_racks())


@login_required
@require_GET
def api_heatmap_rack(request, pk):
    get_object_or_404(Domain, pk=pk)
    highlight = request.GET.get("highlight")
    highlight_id = None
    if highlight and highlight.isdigit():
        workload = visible_workload_or_404(request.user, int(highlight))
        highlight_id = workload.pk
    return JsonResponse(queries.heatmap_rack(request.user, pk, highlight=highlight_id))


@login_required
@require_GET
def api_heatmap_node(request, pk):
    get_object_or_404(Node, pk=pk)
    return JsonResponse(queries.heatmap_node(request.user, pk))


@login_required
@require_GET
def api_queue(request):
    filters = queries.queue_filters(request.GET)
    return JsonResponse(
        {
            "pending": queries.pending_rows(request.user, filters, page_number(request)),
            "running": queries.running_rows(request.user, filters),
            "hidden": queries.hidden_pending(request.user),
        }
    )


@login_required
@require_GET
def api_workload(request, pk):
    workload = visible_workload_or_404(request.user, pk)
    detail = queries.workload_detail(workload)
    return JsonResponse(
        {"workload": detail["row"], "cost": detail["cost"], "waiting": workload.state in WAITING_STATES}
    )


@login_required
@require_GET
def api_live(request):
    """The catch-up a page reads on every (re)connect: the database is the truth, a lost delta loses nothing."""
    ids = [int(x) for x in request.GET.get("workloads", "").split(",") if x.isdigit()][:500]
    rows = broadcast.workload_rows(request.user, ids)
    return JsonResponse({"type": "catchup", "counters": queries.counters(request.user), "workloads": rows})
