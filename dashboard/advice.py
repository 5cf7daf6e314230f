"""Advice a viewer can act on (issue 27): each suggestion of the decision core becomes the change the
submit form makes, or, for a quota, the place an operator makes it; what the viewer cannot apply is
not shown to them."""

from urllib.parse import urlencode

from django.urls import reverse

from broker.inventory.models import TopologyLevel
from broker.policy.models import Queue
from broker.policy.roles import is_admin, is_operator, team_ids
from broker.workloads.states import WAITING_STATES

# The submit form's value for "no topology at all", distinct from "" (as the resource class sets it).
ANYWHERE = "anywhere"
# The fields a suggestion may set in the submit form (and the query of a resubmission link).
FORM_FIELDS = ("replicas", "min_count", "device_class", "topology_required", "topology_preferred")


def form_change(kind, change) -> dict | None:
    """{submit form field: value} making a suggestion's change, None when the form cannot make it (a
    quota is an operator's change, a gang of several pod sets is not the form's one)."""
    change = change or {}
    if kind == "ShrinkGang":
        pod_sets = change.get("pod_sets") or {}
        if len(pod_sets) != 1:
            return None
        (counts,) = pod_sets.values()
        if not counts or "count" not in counts:
            return None
        return {"replicas": counts["count"], "min_count": counts.get("min_count") or counts["count"]}
    if kind == "FallbackClass":
        names = change.get("device_classes") or []
        return {"device_class": names[0]} if len(names) == 1 else None
    if kind == "RelaxTopology" and "topology_required" in change:
        fields = {"topology_required": change["topology_required"] or ANYWHERE}
        if "topology_preferred" in change:
            fields["topology_preferred"] = change["topology_preferred"] or ANYWHERE
        return fields
    return None


def levels() -> list[str]:
    """Topology levels from coarse to fine, the node last."""
    return [*TopologyLevel.objects.order_by("order").values_list("name", flat=True), "node"]


def class_refusal(resource_class, field, value, known_levels) -> str:
    """Why `resource_class` refuses the form's topology `value` for `field`, or "". Its required level is
    its promise (a training class keeps a gang in one rack): only another class is coarser. A stored
    empty level reads as the class's own, so "anywhere" cannot undo a level the class sets."""
    promised = getattr(resource_class, field, "") if resource_class else ""
    if not value or not promised:
        return ""
    if value == ANYWHERE:
        return f"{resource_class} sets one {promised}; choose another class to drop it."
    known = promised in known_levels and value in known_levels
    if field == "topology_required" and known and known_levels.index(value) < known_levels.index(promised):
        return f"{resource_class} keeps all pods in one {promised}; choose another class to relax it."
    return ""


def class_allows(resource_class, fields, known_levels) -> bool:
    return not any(
        class_refusal(resource_class, name, fields.get(name), known_levels)
        for name in ("topology_required", "topology_preferred")
    )


def form_suggestions(suggestions, resource_class=None) -> list[dict]:
    """The suggestions (objects with kind, description, change) the submit form makes in one click in
    `resource_class`, each with `form`, the fields to set."""
    offered, known_levels = [], None
    for suggestion in suggestions:
        fields = form_change(suggestion.kind, suggestion.change)
        if fields and suggestion.kind == "RelaxTopology":
            known_levels = known_levels or levels()
            fields = fields if class_allows(resource_class, fields, known_levels) else None
        if fields:
            offered.append({"kind": suggestion.kind, "description": suggestion.description, "form": fields})
    return offered


def resubmittable(workload, pod_sets) -> bool:
    """Whether the submit form can say this request again: one pod set, of plain devices or of a DRA
    claim (its advanced field), without an attribute match or a fallback list of its own (the API's),
    in a resource class."""
    if workload.resource_class_id is None or len(pod_sets) != 1:
        return False
    pod_set = pod_sets[0]
    return not pod_set.match_attribute and len(pod_set.device_classes) <= 1


def may_resubmit(user, workload, waiting=True) -> bool:
    """Only who may submit to the workload's queue and cancel it: its team's members (an admin submits
    anywhere); an operator outside the team can do neither through the form. `waiting`: and only while
    it waits, as advice for a running workload is moot."""
    if waiting and workload.state not in WAITING_STATES:
        return False
    return is_admin(user) or workload.team_id in team_ids(user)


def resubmit_url(workload, fields) -> str:
    return reverse("dashboard:submit") + "?" + urlencode({"from": workload.pk, **fields})


def quota_url(queue_name) -> str | None:
    """Where an operator changes a queue's quota: the queue in the API (its browsable form writes it,
    audited as a manual intervention), or None for a queue that no longer exists."""
    queue = Queue.objects.filter(name=queue_name).only("pk").first()
    return None if queue is None else reverse("queue-detail", args=[queue.pk])


def for_viewer(user, workload, pod_sets, suggestions) -> list[dict]:
    """The stored suggestions (dicts of kind, description, change) `user` can apply, each with the
    `action` ("resubmit" or "quota") and the `url` that applies it."""
    shown, known_levels = [], None
    resubmits = may_resubmit(user, workload) and resubmittable(workload, pod_sets)
    for suggestion in suggestions or ():
        if not isinstance(suggestion, dict):
            continue
        kind, change = suggestion.get("kind"), suggestion.get("change") or {}
        entry = {"kind": kind, "description": suggestion.get("description", "")}
        if kind == "IncreaseQuota":
            url = quota_url(change.get("queue")) if is_operator(user) else None
            if url:
                shown.append({**entry, "action": "quota", "url": url, "queue": change.get("queue")})
            continue
        fields = form_change(kind, change) if resubmits else None
        if fields and kind == "RelaxTopology":
            known_levels = known_levels or levels()
            fields = fields if class_allows(workload.resource_class, fields, known_levels) else None
        if fields:
            shown.append({**entry, "action": "resubmit", "url": resubmit_url(workload, fields)})
    return shown
