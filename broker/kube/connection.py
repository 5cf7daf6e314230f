"""How the bridge reaches the API server: KUBE_API_URL, else KUBECONFIG, else the pod's service account."""

from django.conf import settings
from kubernetes import client, config


def api_client():
    if settings.KUBE_API_URL:
        configuration = client.Configuration()
        configuration.host = settings.KUBE_API_URL.rstrip("/")
        return client.ApiClient(configuration)
    if settings.KUBE_IN_CLUSTER:
        config.load_incluster_config()
        return client.ApiClient()
    # KUBECONFIG, or ~/.kube/config; raises ConfigException with the client's own words when neither is there.
    return config.new_client_from_config()
