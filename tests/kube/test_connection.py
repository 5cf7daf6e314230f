"""How the bridge reaches the API server: one client per process and configuration, a kubeconfig's made
again once it is old enough for its credentials to have expired."""

import yaml
from kubernetes import client

from broker.kube import connection


def kubeconfig(path, server):
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": server}}],
                "users": [{"name": "broker", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "broker"}}],
                "current-context": "lab",
            }
        )
    )
    return path


def test_it_shares_one_client_per_configuration(settings, apiserver):
    settings.KUBE_API_URL = apiserver.url
    shared = connection.api_client()
    assert connection.api_client() is shared
    assert shared.configuration.connection_pool_maxsize == connection.POOL_SIZE


def test_it_makes_a_kubeconfig_client_again_once_it_is_old(settings, apiserver, tmp_path, monkeypatch):
    settings.KUBE_API_URL = ""
    settings.KUBE_IN_CLUSTER = False
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "config", apiserver.url)))
    first = connection.api_client()
    assert connection.api_client() is first
    assert first.configuration.host == apiserver.url
    assert client.CoreV1Api(first).list_node().items == []
    monkeypatch.setattr(connection, "MAX_AGE_SECONDS", 0)
    assert connection.api_client() is not first
