"""List, then watch, each resource the broker mirrors (what `manage.py kube_sync` runs).

Per resource, as client-go's reflector does: list everything (and forget what the mirror holds that the
list no longer has), remember the list's resourceVersion, then watch from it with bookmarks. A watch that
ends (its timeout) is renewed from the last version; `410 Gone` (the version was compacted away) lists
again. Every list, event and bookmark stamps the cluster's `last_synced_at`; errors are kept on the
Cluster row, which the dashboard shows.

One reader thread per resource only reads its watch stream and queues the events; one applier (the
thread that called `run`) takes every event queued so far, of all resources, and applies them in one
transaction together with each resource's last resourceVersion (WatchCursor). A burst (a 64-pod gang
is 129 objects, each written twice when it is bound) is then a few transactions and one cycle request,
not one of each per event, and a PodGroup, its claims and its pods usually arrive in the same
transaction. Because each cursor moves in the transaction that applied its events, a sync that stops
anywhere resumes after the last event it applied, never applying one twice nor skipping one. Lists run
on the applier too, in the queue's order, so no event read before a 410 is applied after the list
that follows it.
"""

import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from broker.events import one_cycle_request
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
    deleted_many: Any = None  # (cluster, [objects]) -> rows changed, where deletes come in bulk

    def delete(self, cluster, objs):
        if self.deleted_many is not None:
            return self.deleted_many(cluster, objs)
        return sum(self.deleted(cluster, obj) for obj in objs)


class Apis:
    def __init__(self, api):
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.taints = client.ResourceV1beta2Api(api)
        self.scheduling = client.SchedulingV1alpha2Api(api)
        self.priorities = client.SchedulingV1Api(api)


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
    # First: a PodGroup's priority resolves through them when the broker takes it.
    Resource(
        "priorityclasses",
        lambda a: a.priorities.list_priority_class,
        intake.priority_classes_changed,
        intake.priority_class_deleted,
    ),
    Resource(
        "workloads",
        lambda a: a.scheduling.list_workload_for_all_namespaces,
        intake.workloads_changed,
        intake.workload_deleted,
    ),
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
    Resource(
        "pods",
        lambda a: a.core.list_pod_for_all_namespaces,
        intake.pods_changed,
        intake.pod_deleted,
        deleted_many=intake.pods_deleted,
    ),
)
RESOURCES = INVENTORY + WORK
ORDER = {resource.name: index for index, resource in enumerate(RESOURCES)}
LIST_PAGE = 500
# A batch's upper bound: a relist's worth of events (after a long stop) still commits in steps.
BATCH = 2000


@dataclass(frozen=True)
class Relist:
    """A reader's request that the applier list its resource (at start, or after 410 Gone)."""

    resource: Resource
    done: Future


class Sync:
    def __init__(self, cluster_name=None, api=None, timeout_seconds=None):
        self.api = api or api_client()
        self.apis = Apis(self.api)
        self.cluster = mirror.cluster_named(cluster_name)
        Cluster.objects.filter(pk=self.cluster.pk).update(server=self.api.configuration.host)
        self.timeout_seconds = timeout_seconds or settings.KUBE_WATCH_TIMEOUT_SECONDS
        self.stopping = threading.Event()
        self.inbox = queue.Queue()
        # Per resource, the newest of its reader's watches (numbered from 1) whose events the applier
        # drops because one of them failed: the reader then watches again from the cursor, so the failed
        # event is retried, not skipped.
        self.dropped = {}
        self.batches = 0

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
        with transaction.atomic(), one_cycle_request():
            for items in pages:
                resource.changed(self.cluster, items)
            if resource in INVENTORY:
                mirror.forget_missing(self.cluster, resource.name, present)
            else:
                intake.forget_missing(self.cluster, resource.name, present)
            self.advance(resource, version, listed=True)
        return version

    # --- watch ---------------------------------------------------------------------------------------

    def watch_once(self, resource, version, generation=None):
        """One watch request from `version` until it times out; returns the last version read. Its events
        are queued for the applier when `generation` names the reader's watch, else applied one by one
        (a caller without an applier: the tests)."""
        stream = watch.Watch(return_type=resource.model).stream(
            resource.lister(self.apis),
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_seconds,
        )
        # Deserialized by the client into its own models (a shape it does not know fails here, loudly);
        # the mirror reads the raw JSON beside it.
        try:
            for event in stream:
                if generation is None:
                    self.apply([(resource, event, None)])
                else:
                    self.inbox.put((resource, event, generation))
                version = event["raw_object"]["metadata"]["resourceVersion"]
                if self.stopping.is_set() or self.held_back(resource, generation):
                    break
        finally:
            stream.close()  # the response too, at once, when the loop stops early
        return version

    # --- apply ---------------------------------------------------------------------------------------

    def apply(self, events):
        """Apply (resource, event, generation) triples in one transaction: per resource in dependency
        order, each run of changes as one call with the last version of each object, then the cursors.
        If the batch fails, its events are applied one by one so one bad object holds back only its own
        resource; returns how many events were applied."""
        events = [item for item in events if not self.held_back(item[0], item[2])]
        if not events:
            return 0
        try:
            with transaction.atomic(), one_cycle_request():
                applied = self.apply_in_transaction(events)
        except Exception:
            if len(events) == 1 and events[0][2] is None:
                raise
            applied = 0
            for item in events:
                resource, _, generation = item
                if self.held_back(resource, generation):
                    continue
                try:
                    with transaction.atomic(), one_cycle_request():
                        applied += self.apply_in_transaction([item])
                except Exception as error:  # noqa: BLE001 - kept on the Cluster row; the reader retries it
                    self.dropped[resource.name] = generation
                    self.failed(resource, error, 0)
        self.batches += 1
        return applied

    def held_back(self, resource, generation):
        """Whether the events of this watch of `resource` are dropped (None: applied directly, never)."""
        return generation is not None and self.dropped.get(resource.name, 0) >= generation

    def apply_in_transaction(self, events):
        by_resource = {}
        for resource, event, _ in events:
            by_resource.setdefault(resource.name, (resource, []))[1].append(event)
        versions, applied = {}, 0
        for name in sorted(by_resource, key=ORDER.__getitem__):
            resource, stream = by_resource[name]
            # Runs of changes, and runs of deletes, each applied as one call.
            changes, deletes = {}, []
            for event in stream:
                obj = event["raw_object"]
                if event["type"] == "BOOKMARK":
                    pass
                elif event["type"] == "DELETED":
                    if changes:
                        resource.changed(self.cluster, list(changes.values()))
                        changes = {}
                    deletes.append(obj)
                    applied += 1
                else:
                    if deletes:
                        resource.delete(self.cluster, deletes)
                        deletes = []
                    key = (obj["metadata"].get("namespace"), obj["metadata"]["name"])
                    changes.pop(key, None)  # only its newest version counts
                    changes[key] = obj
                    applied += 1
                versions[resource] = obj["metadata"]["resourceVersion"]
            if changes:
                resource.changed(self.cluster, list(changes.values()))
            if deletes:
                resource.delete(self.cluster, deletes)
        self.advance_all(versions)
        self.stamp(events=applied)
        return applied

    def advance_all(self, versions):
        """Every cursor of a batch in one statement."""
        WatchCursor.objects.bulk_create(
            [
                WatchCursor(cluster=self.cluster, resource=resource.name, resource_version=version)
                for resource, version in versions.items()
            ],
            update_conflicts=True,
            unique_fields=["cluster", "resource"],
            update_fields=["resource_version", "updated_at"],
        )

    def advance(self, resource, version, listed=False):
        now = timezone.now()
        defaults = {"resource_version": version}
        if listed:
            defaults["listed_at"] = now
        WatchCursor.objects.update_or_create(cluster=self.cluster, resource=resource.name, defaults=defaults)
        self.stamp(listed=listed)

    def stamp(self, listed=False, events=0):
        now = timezone.now()
        stamp = {"last_synced_at": now}
        if listed:
            stamp["last_listed_at"] = now
        if events:
            stamp["events_applied"] = F("events_applied") + events
        Cluster.objects.filter(pk=self.cluster.pk).update(**stamp)

    def cursor(self, resource):
        return (
            WatchCursor.objects.filter(cluster=self.cluster, resource=resource.name)
            .values_list("resource_version", flat=True)
            .first()
        )

    def follow(self, resource):
        """The reader of one resource: resume from its cursor (or have it listed), watch and queue the
        events, list again on 410, until stopped. Touches the database only to read its cursor."""
        version = self.cursor(resource)
        backoff, generation = 1.0, 0
        while not self.stopping.is_set():
            generation += 1
            try:
                if not version:
                    version = self.listed_by_applier(resource)
                    if version is None:
                        break
                version = self.watch_once(resource, version, generation)
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
            if self.dropped.get(resource.name, 0) >= generation:
                # The applier failed on one of this watch's events: watch again from what it applied.
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                version = self.cursor(resource)

    def listed_by_applier(self, resource):
        """Have the applier list `resource` after every event queued before; its version, None if stopped."""
        done = Future()
        self.inbox.put(Relist(resource, done))
        while not self.stopping.is_set():
            try:
                return done.result(timeout=0.5)
            except TimeoutError:
                continue
        return None

    def drain(self, block=0.5):
        """Apply everything queued so far (waiting up to `block` seconds for the first item), lists in
        their place in the queue; returns how many events were applied."""
        try:
            items = [self.inbox.get(timeout=block) if block else self.inbox.get_nowait()]
        except queue.Empty:
            return 0
        while len(items) < BATCH:
            try:
                items.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        applied, events = 0, []
        for item in items:
            if isinstance(item, Relist):
                applied += self.apply(events)
                events = []
                try:
                    item.done.set_result(self.relist(item.resource))
                except Exception as error:  # noqa: BLE001 - the reader waiting for it handles it
                    item.done.set_exception(error)
            else:
                events.append(item)
        return applied + self.apply(events)

    def failed(self, resource, error, backoff):
        log.warning("%s: %s", resource.name, error, exc_info=not isinstance(error, ApiException))
        try:
            Cluster.objects.filter(pk=self.cluster.pk).update(
                last_error=f"{resource.name}: {type(error).__name__}: {error}"[:2000], last_error_at=timezone.now()
            )
        except DatabaseError:
            log.warning("could not record the error of %s: the database is unreachable", resource.name)
        self.stopping.wait(backoff)
        return min(backoff * 2, 30.0)

    def list_all(self, resources=RESOURCES):
        """List every resource once, in dependency order (classes, nodes, rules, slices, then work)."""
        return {resource.name: self.relist(resource) for resource in resources}

    def run(self, resources=RESOURCES):
        """A reader thread per resource and this thread applying what they read, until `stop()`."""
        threads = [
            threading.Thread(target=self.follow_closing, args=(resource,), name=f"kube-{resource.name}", daemon=True)
            for resource in resources
        ]
        for thread in threads:
            thread.start()
        while not self.stopping.is_set() and any(thread.is_alive() for thread in threads):
            try:
                self.drain()
            except Exception as error:  # a lost database connection: the events are read again
                log.warning("applying watch events: %s", error, exc_info=True)
                self.stopping.wait(1.0)
            finally:
                close_old_connections()
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
