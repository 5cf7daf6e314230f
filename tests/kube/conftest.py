import pytest

from broker.kube.sync import Sync
from tests.kube_apiserver import MockCluster


@pytest.fixture
def cluster():
    with MockCluster() as running:
        yield running


@pytest.fixture
def kube_settings(settings, cluster):
    settings.KUBE_ENABLED = True
    settings.KUBE_API_URL = cluster.url
    settings.KUBE_CLUSTER_NAME = "lab"
    settings.KUBE_WATCH_TIMEOUT_SECONDS = 1
    settings.EXECUTOR = "external"
    return settings


@pytest.fixture
def sync(kube_settings, db):
    return Sync(timeout_seconds=1)
