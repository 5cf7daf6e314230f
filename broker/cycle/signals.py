"""Inventory changes made outside the services (the Django admin, a shell) still ask for a cycle.

The API and broker.inventory.services bump the generation themselves; the commit's own device checks
catch a device that changed under a running cycle either way, so these receivers only wake the cycle.
"""

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from broker.events import request_cycle_after_commit
from broker.inventory.models import Device, Node


@receiver(post_save, sender=Device, dispatch_uid="cycle-device-saved")
@receiver(post_delete, sender=Device, dispatch_uid="cycle-device-deleted")
@receiver(post_save, sender=Node, dispatch_uid="cycle-node-saved")
@receiver(post_delete, sender=Node, dispatch_uid="cycle-node-deleted")
def inventory_changed(sender, instance, **kwargs):
    request_cycle_after_commit(f"{sender._meta.model_name} {instance} changed")
