"""Editing the menu: a resource class and everything behind it, changed in one audited transaction."""

from django.conf import settings
from django.db import transaction

from broker.audit.models import record
from broker.events import request_cycle_after_commit
from broker.governance.approvals import cost_threshold
from broker.governance.models import ApprovalPolicy
from broker.inventory.models import ClusterState
from broker.policy.models import ResourceClassDeviceClass

SNAPSHOT_FIELDS = (
    "name",
    "display_name",
    "description",
    "topology_required",
    "topology_preferred",
    "sharing",
    "preemptible",
    "preempts_across_queues",
    "checkpoint_restart_seconds",
    "max_devices",
    "max_devices_per_pod",
    "max_duration_seconds",
    "cost_label",
    "approval_required",
    "approval_threshold_devices",
)


def snapshot(resource_class):
    """The class as the audit trail keeps it: every field the form edits, in JSON-friendly values."""
    data = {name: getattr(resource_class, name) for name in SNAPSHOT_FIELDS}
    threshold = cost_threshold(resource_class)
    data.update(
        priority_class=resource_class.priority_class.name,
        device_classes=[dc.name for dc in resource_class.ordered_device_classes()],
        allowed_teams=sorted(resource_class.allowed_teams.values_list("name", flat=True)),
        cost_threshold_per_hour=None if threshold is None else str(threshold),
    )
    return data


def set_device_classes(resource_class, device_classes):
    # Delete first: the rank is unique per class, so renumbering in place would collide.
    ResourceClassDeviceClass.objects.filter(resource_class=resource_class).delete()
    ResourceClassDeviceClass.objects.bulk_create(
        ResourceClassDeviceClass(resource_class=resource_class, device_class=device_class, rank=rank)
        for rank, device_class in enumerate(device_classes)
    )


def set_cost_threshold(resource_class, threshold):
    ApprovalPolicy.objects.update_or_create(
        resource_class=resource_class, defaults={"cost_threshold_per_hour": threshold}
    )
    # A cached reverse one-to-one would describe the old rule.
    resource_class._state.fields_cache.pop("approval_policy", None)


def save_resource_class(form, actor):
    """Save a valid ResourceClassForm: the class, its fallback list, its entitled teams and its cost rule;
    audit before/after; make a running cycle refuse its stale policy. Returns the class."""
    creating = form.instance.pk is None
    with transaction.atomic():
        before = None if creating else snapshot(type(form.instance).objects.get(pk=form.instance.pk))
        resource_class = form.save()
        set_device_classes(resource_class, form.cleaned_data["device_classes"])
        set_cost_threshold(resource_class, form.cleaned_data.get("cost_threshold_per_hour"))
        after = snapshot(resource_class)
        record(
            "resourceclass.create" if creating else "resourceclass.update",
            resource_class,
            actor=actor,
            before=before,
            after=after,
            reason=form.cleaned_data.get("reason", ""),
        )
        ClusterState.bump(settings.CLUSTER_NAME)
        request_cycle_after_commit(f"resource class {resource_class.name} changed on the menu page")
    return resource_class


def changed_fields(before, after):
    """Names whose value differs, for the page's confirmation message."""
    if before is None:
        return sorted(after)
    return sorted(name for name in after if before.get(name) != after.get(name))
