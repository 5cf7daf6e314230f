"""List, then watch, each resource the broker mirrors (what `manage.py kube_sync` runs).

Per resource, as client-go's reflector does: list everything (and forget what the mirror holds that the
list no longer has), remember the list's resourceVersion, then watch from it with bookmarks. Each event
is applied in one transaction together with the resourceVersion it brings (WatchCursor), so a sync that
stops anywhere resumes after the last event it applied, never applying one twice nor skipping one. A
watch that ends (its timeout) is renewed from the last version; `410 Gone` (the version was compacted
away) lists again. Every list, event and bookmark stamps the cluster's `last_synced_at`; errors are kept
on the Cluster row, which the dashboard shows.
"""

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from broker.kube import intake, mirror
from broker.kube.connection import api_client
from broker.kube.models import Cluster, WatchCursor

log = logging.getLogger(__name__)
GONE = 410


@dataclass(frozen=True)
class Resource:
    name: str
    lister: Any  # (apis) -> the client's list function for every namespace
    changed: Any  # (cluster, [objects]) -> rows changed
    deleted: Any  # (cluster, object) -> rows changed
    # The client's model, when Watch cannot find it from the list's name: 36.0.3 names resource.k8s.io/v1's
    # claim ResourceV1ResourceClaim (beside core's), but its list docstring says V1ResourceClaimList.
    model: str | None = None


class Apis:
    def __init__(self, api):
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.taints = client.ResourceV1beta2Api(api)
        self.scheduling = client.SchedulingV1alpha2Api(api)


INVENTORY = (
    Resource(
        "deviceclasses",
        lambda a: a.resource.list_device_class,
        mirror.device_classes_changed,
        mirror.device_class_deleted,
    ),
    Resource("nodes", lambda a: a.core.list_node, mirror.nodes_changed, mirror.node_deleted),
    Resource(
        "devicetaintrules",
        lambda a: a.taints.list_device_taint_rule,
        mirror.taint_rules_changed,
        mirror.taint_rule_deleted,
    ),
    Resource("resourceslices", lambda a: a.resource.list_resource_slice, mirror.slices_changed, mirror.slice_deleted),
)
WORK = (
    Resource(
        "podgroups",
        lambda a: a.scheduling.list_pod_group_for_all_namespaces,
        intake.pod_groups_changed,
        intake.pod_group_deleted,
    ),
    Resource(
        "resourceclaims",
        lambda a: a.resource.list_resource_claim_for_all_namespaces,
        intake.claims_changed,
        intake.claim_deleted,
        "ResourceV1ResourceClaim",
    ),
    Resource("pods", lambda a: a.core.list_pod_for_all_namespaces, intake.pods_changed, intake.pod_deleted),
)
RESOURCES = INVENTORY + WORK
LIST_PAGE = 500


class Sync:
    def __init__(self, cluster_name=None, api=None, timeout_seconds=None):
        self.api = api or api_client()
        self.apis = Apis(self.api)
        self.cluster = mirror.cluster_named(cluster_name)
        Cluster.objects.filter(pk=self.cluster.pk).update(server=self.api.configuration.host)
        self.timeout_seconds = timeout_seconds or settings.KUBE_WATCH_TIMEOUT_SECONDS
        self.stopping = threading.Event()

    def stop(self):
        self.stopping.set()

    # --- list ----------------------------------------------------------------------------------------

    def relist(self, resource):
        """List every object of `resource` in pages, apply them, forget what is gone; returns the list's
        resourceVersion, stored as the cursor in the same transaction as the last page."""
        lister = resource.lister(self.apis)
        present, token, pages = [], None, []
        while True:
            kwargs = {"limit": LIST_PAGE, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            response = lister(**kwargs)
            page = json.loads(response.data)
            pages.append(page["items"])
            present += [(item["metadata"].get("namespace"), item["metadata"]["name"]) for item in page["items"]]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                version = page["metadata"]["resourceVersion"]
                break
        with transaction.atomic():
            for items in pages:
                resource.changed(self.cluster, items)
            if resource in INVENTORY:
                mirror.forget_missing(self.cluster, resource.name, present)
            else:
                intake.forget_missing(self.cluster, resource.name, present)
            self.advance(resource, version, listed=True)
        return version

    # --- watch ---------------------------------------------------------------------------------------

    def watch_once(self, resource, version):
        """One watch request from `version` until it times out; returns the last version applied."""
        stream = watch.Watch(return_type=resource.model).stream(
            resource.lister(self.apis),
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_seconds,
        )
        # Deserialized by the client into its own models (a shape it does not know fails here, loudly);
        # the mirror reads the raw JSON beside it.
        for event in stream:
            obj = event["raw_object"]
            new_version = obj["metadata"]["resourceVersion"]
            if event["type"] == "BOOKMARK":
                self.advance(resource, new_version)
            else:
                with transaction.atomic():
                    if event["type"] == "DELETED":
                        resource.deleted(self.cluster, obj)
                    else:
                        resource.changed(self.cluster, [obj])
                    self.advance(resource, new_version, event=True)
            version = new_version
            if self.stopping.is_set():
                break
        return version

    def advance(self, resource, version, listed=False, event=False):
        now = timezone.now()
        defaults = {"resource_version": version}
        if listed:
            defaults["listed_at"] = now
        WatchCursor.objects.update_or_create(cluster=self.cluster, resource=resource.name, defaults=defaults)
        stamp = {"last_synced_at": now}
        if listed:
            stamp["last_listed_at"] = now
        if event:
            stamp["events_applied"] = F("events_applied") + 1
        Cluster.objects.filter(pk=self.cluster.pk).update(**stamp)

    def cursor(self, resource):
        return (
            WatchCursor.objects.filter(cluster=self.cluster, resource=resource.name)
            .values_list("resource_version", flat=True)
            .first()
        )

    def follow(self, resource):
        """The loop of one resource: resume from its cursor (or list), watch, relist on 410, until stopped."""
        version = self.cursor(resource)
        backoff = 1.0
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self.relist(resource)
                version = self.watch_once(resource, version)
                backoff = 1.0
            except ApiException as error:
                if error.status == GONE:
                    log.info("%s: watch expired (410 Gone), listing again", resource.name)
                    Cluster.objects.filter(pk=self.cluster.pk).update(relists=F("relists") + 1)
                    version = None
                    continue
                backoff = self.failed(resource, error, backoff)
            except Exception as error:  # the loop must outlive a dropped connection or a bad object
                backoff = self.failed(resource, error, backoff)
            finally:
                close_old_connections()

    def failed(self, resource, error, backoff):
        log.warning("%s: %s", resource.name, error, exc_info=not isinstance(error, ApiException))
        Cluster.objects.filter(pk=self.cluster.pk).update(
            last_error=f"{resource.name}: {type(error).__name__}: {error}"[:2000], last_error_at=timezone.now()
        )
        self.stopping.wait(backoff)
        return min(backoff * 2, 30.0)

    def list_all(self, resources=RESOURCES):
        """List every resource once, in dependency order (classes, nodes, rules, slices, then work)."""
        return {resource.name: self.relist(resource) for resource in resources}

    def run(self, resources=RESOURCES):
        """Follow every resource on a thread of its own until `stop()`; lists first where no cursor is kept."""
        threads = [
            threading.Thread(target=self.follow_closing, args=(resource,), name=f"kube-{resource.name}", daemon=True)
            for resource in resources
        ]
        for thread in threads:
            thread.start()
        while not self.stopping.is_set() and any(thread.is_alive() for thread in threads):
            self.stopping.wait(1.0)
        for thread in threads:
            thread.join(self.timeout_seconds + 5)

    def follow_closing(self, resource):
        try:
            self.follow(resource)
        finally:
            connection.close()


def wait_until(predicate, timeout=10.0, interval=0.05):
    """For callers that need the mirror to catch up (tests, the bench): poll `predicate` until true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
