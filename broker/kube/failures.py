"""Work on failed devices leaves: as Kubernetes' device taint eviction does, a workload holding a device
tainted NoExecute (by its ResourceSlice, a DeviceTaintRule, or because the device or its node vanished) that
its pod set does not tolerate is evicted whole, through the outbox and the Eviction API, and requeued once
its pods are gone (broker.kube.intake.pod_deleted completes the eviction)."""

from django.db import transaction
from django.utils import timezone

from broker.audit.models import record
from broker.inventory.models import Device
from broker.kube.models import Action, MirroredPodGroup, OutboxEntry
from broker.kube.outbox import drain_soon
from broker.workloads.models import Allocation, PodSet, Workload
from broker.workloads.states import HOLDING_STATES

RULE = "DeviceTaint"


def tolerated(taint, tolerations):
    """Whether a pod set's tolerations (Kubernetes' shape) tolerate `taint`."""
    for toleration in tolerations or []:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint["key"]:
                return True
        elif toleration.get("key") == taint["key"] and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def evict_from_tainted_devices(cluster):
    """Ask every untolerating holder of a NoExecute-tainted device of `cluster` to leave; returns their ids."""
    tainted = {
        pk: next(taint for taint in taints if taint.get("effect") == "NoExecute")
        for pk, taints in Device.objects.filter(node__kube__cluster=cluster)
        .exclude(taints=[])
        .values_list("pk", "taints")
        if any(taint.get("effect") == "NoExecute" for taint in taints)
    }
    if not tainted:
        return []
    held = Allocation.objects.filter(device_id__in=list(tainted), released_at__isnull=True).values_list(
        "workload_id", "device_id", "device__node__name", "device__name"
    )
    holders = {}
    for workload_id, device_id, node, name in held:
        holders.setdefault(workload_id, (device_id, f"{node}/{name}"))
    groups = dict(MirroredPodGroup.objects.filter(workload_id__in=list(holders)).values_list("workload_id", "pk"))
    tolerations = dict(PodSet.objects.filter(workload_id__in=list(groups)).values_list("workload_id", "tolerations"))
    workloads = Workload.objects.filter(
        pk__in=list(groups), state__in=HOLDING_STATES, eviction_requested_at__isnull=True
    ).select_related("team")
    now, evicted = timezone.now(), []
    for workload in workloads:
        device_id, device_name = holders[workload.pk]
        taint = tainted[device_id]
        if tolerated(taint, tolerations.get(workload.pk)):
            continue
        message = f"device {device_name} is tainted {taint['key']}={taint.get('value', '')}:NoExecute"
        Workload.objects.filter(pk=workload.pk).update(
            eviction_requested_at=now, eviction_rule=RULE, eviction_message=message
        )
        record(
            "workload.preempt",
            workload,
            before={"state": workload.state},
            after={"state": workload.state, "evicting": True, "rule": RULE},
            reason=f"{RULE}: {message}",
        )
        OutboxEntry.objects.create(cluster=cluster, pod_group_id=groups[workload.pk], action=Action.EVICT)
        evicted.append(workload.pk)
    if evicted:
        transaction.on_commit(drain_soon, robust=True)
    return evicted
