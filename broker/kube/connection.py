"""How the bridge reaches the API server: KUBE_API_URL, else KUBECONFIG, else the pod's service account.

One client per process and configuration, shared by every caller: its connection pool is kept, so the
applier does not open a connection per task (its pool holds one per thread binding pods in parallel)."""

import os
import threading
import time

from django.conf import settings
from kubernetes import client, config

# The applier binds up to this many pods at once; a smaller pool would drop and reopen connections.
POOL_SIZE = 16
# A kubeconfig's credentials are read when its client is made (an exec plugin's token expires): a
# client older than this is made again for new callers.
MAX_AGE_SECONDS = 300
_clients = {}
_lock = threading.Lock()


def api_client():
    key = (settings.KUBE_API_URL, settings.KUBE_IN_CLUSTER, os.environ.get("KUBECONFIG", ""))
    with _lock:
        api, made = _clients.get(key, (None, 0.0))
        if api is None or (not key[0] and not key[1] and time.monotonic() - made > MAX_AGE_SECONDS):
            api = new_api_client()
            _clients[key] = (api, time.monotonic())
        return api


def new_api_client():
    configuration = client.Configuration()
    configuration.connection_pool_maxsize = POOL_SIZE
    if settings.KUBE_API_URL:
        configuration.host = settings.KUBE_API_URL.rstrip("/")
    elif settings.KUBE_IN_CLUSTER:
        # Its token is re-read as the kubelet rotates it (the loader installs a refresh hook).
        config.load_incluster_config(client_configuration=configuration)
    else:
        # KUBECONFIG, or ~/.kube/config; raises ConfigException with the client's own words when neither is there.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration)
    return client.ApiClient(configuration)
