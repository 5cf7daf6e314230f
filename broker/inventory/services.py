"""An operator's hands on the inventory: cordon a node, mark a device's health.

Each is a manual intervention: audited, counted, and it bumps the cluster generation so a cycle that
read the old inventory refuses to commit; a fresh cycle is asked for once the change commits.
"""

from django.conf import settings
from django.db import transaction

from broker.audit.models import record
from broker.events import request_cycle_after_commit
from broker.inventory.models import ClusterState, Device, Health, Node


def set_cordoned(node, actor, cordoned, reason=""):
    """Cordon or uncordon a node; returns the node. Asking for the state it is already in changes nothing."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.cordoned == cordoned:
            return node
        node.cordoned = cordoned
        node.save(update_fields=["cordoned", "updated"])
        record(
            "node.cordon" if cordoned else "node.uncordon",
            node,
            actor=actor,
            before={"cordoned": not cordoned},
            after={"cordoned": cordoned},
            reason=reason,
            manual_intervention=True,
        )
        ClusterState.bump(settings.CLUSTER_NAME)
        request_cycle_after_commit(f"node {node.name} {'cordoned' if cordoned else 'uncordoned'}")
    return node


def set_health(device, actor, health, reason=""):
    """Mark a device Healthy or Unhealthy by hand; returns the device."""
    with transaction.atomic():
        device = Device.objects.select_for_update().select_related("node").get(pk=device.pk)
        if device.health == health:
            return device
        before = device.health
        device.health = health
        device.save(update_fields=["health"])
        record(
            "device.mark_healthy" if health == Health.HEALTHY else "device.mark_unhealthy",
            device,
            actor=actor,
            before={"health": before},
            after={"health": health},
            reason=reason,
            manual_intervention=True,
        )
        ClusterState.bump(settings.CLUSTER_NAME)
        request_cycle_after_commit(f"device {device.qualified_name} marked {health}")
    return device
