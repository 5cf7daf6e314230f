"""The outbox's writer: the cycle's commit announces its decisions (broker.events.decisions_made) inside its
own transaction, and this writes one entry per admitted or preempted workload that mirrors a PodGroup, in
that same transaction. Once it commits, the applier is asked to drain the outbox at once; after every
committed cycle it is asked too, so each PodGroup's condition follows the cycle's explanation."""

from django.conf import settings
from django.db import transaction
from django.dispatch import receiver

from broker import events
from broker.kube.models import Action, MirroredPodGroup, OutboxEntry


@receiver(events.decisions_made, dispatch_uid="kube-outbox")
def write_outbox(sender, cycle_id, admitted, preempted, **kwargs):
    if not settings.KUBE_ENABLED:
        return []
    groups = MirroredPodGroup.objects.filter(workload_id__in=[*admitted, *preempted]).values_list(
        "pk", "cluster_id", "workload_id"
    )
    admitted = set(admitted)
    entries = OutboxEntry.objects.bulk_create(
        OutboxEntry(
            cluster_id=cluster_id,
            pod_group_id=pk,
            action=Action.BIND if workload_id in admitted else Action.EVICT,
            cycle_id=cycle_id,
        )
        for pk, cluster_id, workload_id in groups
    )
    if entries:
        transaction.on_commit(drain_soon, robust=True)
    return entries


@receiver(events.cycle_committed, dispatch_uid="kube-conditions")
def conditions_after_cycle(sender, **kwargs):
    """After every committed cycle the PodGroups' conditions follow its explanations."""
    if settings.KUBE_ENABLED and MirroredPodGroup.objects.exists():
        drain_soon()


def drain_soon():
    from broker.kube.tasks import apply_outbox

    apply_outbox.delay()
