"""Seen in the product: the topology page shows each mirrored cluster's sync health, a node's cluster and a
device's pool; a workload's page names its PodGroup."""

from datetime import timedelta

from django.utils import timezone

from broker.inventory.models import Node
from broker.kube.applier import Applier
from broker.kube.models import Cluster
from tests.builders import make_user
from tests.kube.helpers import admit


def test_it_shows_the_clusters_sync_health_on_the_topology_page(sync, lab, client):
    client.force_login(make_user("olivia", roles=["operator"]))
    page = client.get("/topology/").content.decode()
    assert 'data-cluster="lab" data-healthy="true"' in page
    assert "<td>3</td><td>16</td><td>3</td>" in page  # nodes, devices, pools
    Cluster.objects.filter(name="lab").update(last_synced_at=timezone.now() - timedelta(hours=1))
    assert 'data-cluster="lab" data-healthy="false"' in client.get("/topology/").content.decode()


def test_it_names_a_nodes_cluster_and_each_devices_pool(sync, lab, client):
    client.force_login(make_user("olivia", roles=["operator"]))
    node = Node.objects.get(name="k2")
    data = client.get(f"/dashboard/api/heatmap/node/{node.pk}/").json()
    assert data["node"]["cluster"] == "lab"
    assert {(d["driver"], d["pool"]) for d in data["devices"]} == {("gpu.example.com", "k2")}


def test_it_links_a_workload_to_its_pod_group(sync, lab, client):
    group = admit(sync, lab)
    Applier().drain()
    Applier().write_conditions()
    client.force_login(make_user("olivia", roles=["operator"]))
    page = client.get(f"/workloads/{group.workload_id}/").content.decode()
    assert "kubectl -n ml describe podgroup train" in page
    assert "Scheduled written to its condition" in page
