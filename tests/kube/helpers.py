"""Steps the Kubernetes tests share."""

from broker.cycle.runner import run_once
from broker.kube.models import MirroredPodGroup
from broker.kube.sync import WORK
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
