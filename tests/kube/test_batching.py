"""Watch events are applied in batches: what the readers queued since the last batch is one transaction,
with one cursor move per resource and one cycle request; a bad object holds back only its own resource."""

import pytest
from django.dispatch import receiver

from broker import events
from broker.inventory.models import Node
from broker.kube.models import Cluster, MirroredPod, MirroredPodGroup, WatchCursor
from broker.kube.sync import INVENTORY, WORK
from tests.kube import objects

NODES = next(resource for resource in INVENTORY if resource.name == "nodes")
CLASSES = next(resource for resource in INVENTORY if resource.name == "deviceclasses")
PODS = next(resource for resource in WORK if resource.name == "pods")


def read(sync, resources):
    """Each resource's watch from its cursor until the server's timeout, queued as a reader does."""
    for resource in resources:
        sync.watch_once(resource, sync.cursor(resource), generation=1)


# Transactional: the batch's own transaction commits, and with it the cycle request it asks for.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_it_applies_a_gang_created_at_once_in_one_batch_with_one_cycle_request(sync, lab):
    sync.list_all(WORK)
    objects.gang(lab, "burst", pods=8)
    read(sync, WORK)
    asked = []

    @receiver(events.cycle_wanted, weak=False)
    def count(sender, reason, **kwargs):
        asked.append(reason)

    try:
        applied = sync.drain(block=0)
    finally:
        events.cycle_wanted.disconnect(count)
    assert applied == 1 + 8 + 8
    assert sync.batches == 1
    group = MirroredPodGroup.objects.get(name="burst")
    assert group.workload is not None and group.workload.pod_sets.get().replicas == 8
    assert MirroredPod.objects.filter(pod_group="burst").count() == 8
    assert len(asked) == 1, asked
    assert Cluster.objects.get(name="lab").events_applied == 17
    for resource in WORK:
        assert WatchCursor.objects.get(resource=resource.name).resource_version == str(lab.handler.revision)


def test_it_applies_only_the_newest_version_of_an_object_changed_twice_in_a_batch(sync, lab):
    lab.apply(objects.node("k0", rack="r0", unschedulable=True))
    lab.apply(objects.node("k0", rack="r0"))
    lab.apply(objects.node("k1", rack="r0", unschedulable=True))
    read(sync, [NODES])
    assert sync.drain(block=0) == 3
    assert list(Node.objects.filter(cordoned=True).values_list("name", flat=True)) == ["k1"]


def test_it_holds_back_only_the_resource_whose_object_fails_and_retries_it(sync, lab):
    before = WatchCursor.objects.get(resource="deviceclasses").resource_version
    lab.create(objects.device_class("broken", "device.attributes[ this is not CEL"))
    lab.apply(objects.node("k2", rack="r1", unschedulable=True))
    read(sync, [CLASSES, NODES])
    sync.drain(block=0)
    assert Node.objects.get(name="k2").cordoned, "the nodes' events are applied"
    assert WatchCursor.objects.get(resource="deviceclasses").resource_version == before
    assert sync.dropped == {"deviceclasses": 1}, "the reader watches again from the cursor"
    cluster = Cluster.objects.get(name="lab")
    assert cluster.last_error.startswith("deviceclasses: ValidationError")


def test_it_takes_a_gang_deleted_at_once_as_one_batch_ending_the_workload_once(sync, lab):
    from broker.audit.models import AuditEvent
    from broker.kube.applier import Applier
    from broker.workloads.states import State
    from tests.kube.helpers import admit

    group = admit(sync, lab, "gone")
    Applier().drain()
    for i in range(8):
        lab.delete("Pod", f"gone-{i}", "ml")
    read(sync, [PODS])
    assert sync.drain(block=0) >= 8
    group.workload.refresh_from_db()
    assert group.workload.state == State.FAILED
    assert not MirroredPod.objects.filter(pod_group="gone").exists()
    (event,) = AuditEvent.objects.filter(action="workload.ended_in_cluster")
    assert event.manual_intervention and "gone-0" in event.reason
