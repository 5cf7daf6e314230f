import pytest

from broker.cycle.loader import forget_everything_loaded
from broker.kube.sync import INVENTORY, Sync
from broker.policy.models import DeviceClass, PriorityClass, Queue, ResourceClass, ResourceClassDeviceClass, Team
from tests.kube import objects
from tests.kube_apiserver import MockCluster


@pytest.fixture
def apiserver():
    with MockCluster() as running:
        yield running


@pytest.fixture
def kube_settings(settings, apiserver):
    settings.KUBE_ENABLED = True
    settings.KUBE_API_URL = apiserver.url
    settings.KUBE_CLUSTER_NAME = "lab"
    settings.KUBE_WATCH_TIMEOUT_SECONDS = 1
    settings.EXECUTOR = "external"
    return settings


@pytest.fixture
def sync(kube_settings, db):
    return Sync(timeout_seconds=1)


@pytest.fixture
def lab(sync, apiserver):
    """Two racks of 8 GPUs (r0: two nodes of 4, r1: one node of 8), the h100 class, queue `ml`."""
    forget_everything_loaded()
    for name, rack, gpus in (("k0", "r0", 4), ("k1", "r0", 4), ("k2", "r1", 8)):
        apiserver.create(objects.node(name, rack=rack))
        apiserver.create(objects.resource_slice(name, devices=gpus))
    apiserver.create(objects.device_class())
    sync.list_all(INVENTORY)
    team = Team.objects.create(name="ml-team")
    Queue.objects.create(name="ml", team=team)
    batch = PriorityClass.objects.create(name="batch", value=100)
    training = ResourceClass.objects.create(
        name="training", display_name="Training", priority_class=batch, topology_required="rack"
    )
    ResourceClassDeviceClass.objects.create(resource_class=training, device_class=DeviceClass.objects.get(name="h100"))
    yield apiserver
    forget_everything_loaded()


@pytest.fixture
def mig(sync, apiserver):
    """One node with one GPU: whole (class h100) or two halves (class h100-half), queue `ml`."""
    forget_everything_loaded()
    apiserver.create(objects.node("mig"))
    apiserver.create(objects.counter_slice("mig"))
    apiserver.create(objects.partitioned_slice("mig"))
    apiserver.create(objects.device_class())
    apiserver.create(objects.device_class("h100-half", objects.H100_HALF))
    sync.list_all(INVENTORY)
    team = Team.objects.create(name="ml-team")
    Queue.objects.create(name="ml", team=team)
    batch = PriorityClass.objects.create(name="batch", value=100)
    for name, device_class in (("training", "h100"), ("inference", "h100-half")):
        resource_class = ResourceClass.objects.create(name=name, display_name=name, priority_class=batch)
        ResourceClassDeviceClass.objects.create(
            resource_class=resource_class, device_class=DeviceClass.objects.get(name=device_class)
        )
    yield apiserver
    forget_everything_loaded()
