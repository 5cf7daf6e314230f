"""Steps the Kubernetes tests share."""

from broker.cycle.runner import run_once
from broker.kube.applier import Applier
from broker.kube.models import MirroredPodGroup
from broker.kube.sync import WORK
from broker.workloads.models import Allocation
from tests.kube import objects


def admit(sync, cluster, name="train", pods=8, **group):
    objects.gang(cluster, name, pods=pods, **group)
    sync.list_all(WORK)
    run_once()
    return MirroredPodGroup.objects.select_related("workload").get(name=name)


def bound_nodes(cluster, prefix):
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName")
        for p in cluster.items("Pod")
        if p["metadata"]["name"].startswith(prefix)
    }


def submit(sync, cluster, name, resource_class, device_class):
    objects.gang(cluster, name, pods=1, resource_class=resource_class, device_class_name=device_class, topology=None)
    sync.list_all(WORK)
    run_once()
    Applier().drain()
    return MirroredPodGroup.objects.select_related("workload").get(name=name).workload


def held(workload):
    return sorted(
        Allocation.objects.filter(workload=workload, released_at__isnull=True).values_list("device__name", flat=True)
    )
