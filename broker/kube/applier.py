"""Decisions out: the applier drains the outbox the cycle's commit wrote, exactly once.

For an admitted workload (a Bind entry), every pod of the gang at once (as kube-scheduler binds in
goroutines): allocate the pod's ResourceClaim (`status.allocation` names the devices the cycle chose, on
the pod's node, and `reservedFor` the pod), then bind the pod to that node through the `binding`
subresource; then the workload is Running. For a victim (an Evict entry): every pod of its group goes
through the Eviction API with the grace period, or, for a workload the cycle shrinks (Pod disruption
mode), only the pods it let go; the sync completes the eviction when they are gone
(broker.kube.intake.pod_deleted).

Two calls a pod: what the calls need (the pod's uid, whether it is bound, the claim's resourceVersion
and requests) comes from the mirror the sync keeps, not from a read. The claim's write is conditional
on the resourceVersion the mirror saw: a `409 Conflict` (the mirror was behind, or someone wrote the
claim since) is re-read and retried, up to KUBE_CONFLICT_RETRIES times, as is a binding refused because
the pod is bound already.

Exactly once: the entry is locked while it is applied and marked done in the same transaction that moves
the workload, so a worker that dies anywhere leaves it open and the next one applies it again. Each try is
counted in its own transaction before any call; a try after the first may follow a worker that died
half-way, so it reads every pod and claim first and skips what is already so (a claim allocated with
these devices, a pod bound to this node): nothing is done twice.

A PodGroup's own claims (group claims, KEP-5729) are allocated before its pods are bound, once for the
gang: `status.allocation` names the devices the cycle chose for the claim's requests (its allocation rows
of pod set `podgroup:<claim entry>`, in the requests' order) and the nodes the pods are bound to, and
`reservedFor` the PodGroup itself (scheduling.k8s.io podgroups), not its pods. They are deallocated once
none of the gang's pods runs any more, as the pods' own claims are.

Every PodGroup also carries a `PodGroupScheduled` condition with the broker's reason code and message, the
same words as the dashboard (`write_conditions`).
"""

import json
import logging
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from kubernetes import client
from kubernetes.client.rest import ApiException

from broker.cycle.executor import move
from broker.kube.connection import api_client
from broker.kube.intake import claim_devices, claim_requests
from broker.kube.models import Action, MirroredClaim, MirroredPod, MirroredPodGroup, OutboxEntry
from broker.scheduler.snapshot import GROUP_POD_SET
from broker.workloads.models import Allocation, Explanation
from broker.workloads.states import HOLDING_STATES, State

log = logging.getLogger(__name__)
CONFLICT = 409
MERGE_PATCH = "application/merge-patch+json"
CONDITION = "PodGroupScheduled"
PARALLEL_PODS = 16


def request_name(requests, device_class=None):
    """The request an allocation result names, from the claim's requests as the mirror keeps them
    (intake.claim_requests): for firstAvailable, the subrequest of the device class the cycle chose
    (`request/subrequest`)."""
    request = requests[0]
    if request.get("subrequests"):
        classes = request["classes"]
        index = classes.index(device_class) if device_class in classes else 0
        return f"{request['name']}/{request['subrequests'][index]}"
    return request["name"]


class ApplyFailed(Exception):
    pass


def group_results(devices, rows):
    """The allocation results of a group claim whose spec.devices is `devices`, from its allocation rows
    [(driver, pool, device, device class)] in pod index order: the cycle allocates a claim's requests in
    their order, `count` devices each; for firstAvailable the sub-request is the first of the chosen
    device's class (`request/subrequest`). A request with allocationMode All (at most one a claim, as
    intake takes them) has the devices the counted requests after it leave."""
    results, at = [], 0
    requests = devices.get("requests") or []
    for position, request in enumerate(requests):
        if at >= len(rows):
            raise ApplyFailed(f"request {request.get('name')}: no device allocated")
        if request.get("exactly", {}).get("allocationMode") == "All":
            later = sum((other.get("exactly") or {}).get("count") or 1 for other in requests[position + 1 :])
            label, count = request["name"], len(rows) - at - later
        elif request.get("exactly"):
            label, count = request["name"], request["exactly"].get("count") or 1
        else:
            device_class = rows[at][3]
            sub = next(
                (sub for sub in request.get("firstAvailable") or [] if sub["deviceClassName"] == device_class), None
            )
            if sub is None:
                raise ApplyFailed(f"request {request['name']}: no sub-request of class {device_class}")
            label, count = f"{request['name']}/{sub['name']}", sub.get("count") or 1
        taken = rows[at : at + count]
        if len(taken) != count:
            raise ApplyFailed(f"request {request['name']}: {len(taken)} of its {count} devices allocated")
        results += [{"request": label, "driver": d, "pool": p, "device": n} for d, p, n, _ in taken]
        at += count
    if at != len(rows):
        raise ApplyFailed(f"{len(rows) - at} allocated devices belong to no request")
    return results


def on_nodes(nodes):
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": sorted(nodes)}]}]
    }


class Applier:
    def __init__(self, api=None):
        self.api = api or api_client()
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.scheduling = client.SchedulingV1alpha2Api(self.api)

    # --- the outbox ----------------------------------------------------------------------------------

    def drain(self, limit=100):
        """Apply the open entries, oldest first; returns the ids done. An entry that fails stays open with
        its error and is tried again on the next drain."""
        done = []
        ids = list(OutboxEntry.objects.filter(done_at__isnull=True).values_list("pk", flat=True)[:limit])
        for pk in ids:
            # Counted before any call, in a transaction of its own: a worker killed mid-way leaves the
            # count behind, so the next try knows it must read what is already done.
            OutboxEntry.objects.filter(pk=pk, done_at__isnull=True).update(attempts=F("attempts") + 1)
            try:
                if self.apply(pk):
                    done.append(pk)
            except Exception as error:  # one entry's failure must not stop the others
                log.warning(
                    "outbox entry %s: %s", pk, error, exc_info=not isinstance(error, ApplyFailed | ApiException)
                )
                OutboxEntry.objects.filter(pk=pk).update(last_error=f"{type(error).__name__}: {error}"[:2000])
        return done

    def apply(self, pk):
        with transaction.atomic():
            entry = (
                OutboxEntry.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("pod_group__workload")
                .filter(pk=pk, done_at__isnull=True)
                .first()
            )
            if entry is None:
                return False  # done meanwhile, or another applier holds it
            if entry.action == Action.BIND:
                applied = self.bind(entry.pod_group, careful=entry.attempts > 1)
            else:
                applied = self.evict(entry.pod_group)
            entry.done_at = timezone.now()
            entry.applied = applied
            entry.last_error = ""
            entry.save(update_fields=["done_at", "applied", "last_error"])
            return True

    # --- bind ----------------------------------------------------------------------------------------

    def placement(self, group):
        """{pod name: (node, [(driver, pool, device)])} from the workload's active allocations."""
        rows = (
            Allocation.objects.filter(workload_id=group.workload_id, released_at__isnull=True)
            .exclude(pod_set__startswith=GROUP_POD_SET)
            .order_by("pod_index", "device__name")
            .values_list("pod_index", "device__node__name", "device__driver", "device__pool", "device__name")
        )
        out = {}
        for index, node, driver, pool, device in rows:
            if index >= len(group.pods):
                raise ApplyFailed(f"allocation for pod index {index}, but {group} has {len(group.pods)} pods")
            pod = group.pods[index]
            if out.setdefault(pod, (node, []))[0] != node:
                raise ApplyFailed(f"pod {pod} has devices on two nodes")
            out[pod][1].append((driver, pool, device))
        return out

    def group_placement(self, group):
        """{claim entry: [(driver, pool, device, device class)]} of the group's claims, in request order."""
        rows = (
            Allocation.objects.filter(
                workload_id=group.workload_id, released_at__isnull=True, pod_set__startswith=GROUP_POD_SET
            )
            .order_by("pod_set", "pod_index")
            .values_list("pod_set", "device__driver", "device__pool", "device__name", "device_class__name")
        )
        out = {}
        for pod_set, *device in rows:
            out.setdefault(pod_set.removeprefix(GROUP_POD_SET), []).append(tuple(device))
        return out

    def bind(self, group, careful=False):
        """Allocate the claims and bind the pods of an admitted group. `careful`: read each pod and claim
        before writing (a try after one that may have stopped half-way), instead of trusting the mirror."""
        workload = group.workload
        if workload is None or workload.state not in HOLDING_STATES or workload.eviction_requested_at is not None:
            return {"skipped": f"workload is {workload.state if workload else 'gone'}"}
        placement = self.placement(group)
        device_class = workload.chosen_device_class.name if workload.chosen_device_class_id else None
        pods = {
            pod.name: pod
            for pod in MirroredPod.objects.filter(
                cluster=group.cluster_id, namespace=group.namespace, pod_group=group.name, name__in=list(placement)
            )
        }
        missing = sorted(set(placement) - set(pods))
        if missing:
            # Gone since it was taken (evicted, deleted); its controller recreates it: try again then.
            raise ApplyFailed(f"pods {', '.join(missing)} of {group} do not exist (yet)")
        claims = {
            claim.name: claim
            for claim in MirroredClaim.objects.filter(
                cluster=group.cluster_id, namespace=group.namespace, name__in=[group.claims[pod] for pod in placement]
            )
        }
        # The gang's own claims first: its pods may only start once the devices they share are theirs.
        self.allocate_group_claims(group, {node for node, _ in placement.values()}, careful)
        jobs = [
            (group.namespace, pods[pod], claims.get(group.claims[pod]), group.claims[pod], node, devices)
            for pod, (node, devices) in placement.items()
        ]
        # Pod by pod in parallel, as kube-scheduler binds in goroutines: each pod's calls are its own.
        with ThreadPoolExecutor(max_workers=min(PARALLEL_PODS, len(jobs) or 1)) as pool:
            list(pool.map(lambda job: self.place(*job, device_class=device_class, careful=careful), jobs))
        if workload.state == State.ADMITTED:
            move([workload.pk], State.ADMITTED, State.RUNNING, timezone.now(), "its pods were bound in the cluster")
        return {"pods": {pod: node for pod, (node, _) in placement.items()}}

    def place(self, namespace, pod, claim, claim_name, node, devices, device_class=None, careful=False):
        """Allocate one pod's claim, then bind the pod (a MirroredPod; `claim` its MirroredClaim or None)."""
        pod_object = {"metadata": {"name": pod.name, "uid": pod.uid}, "spec": {"nodeName": pod.node_name}}
        known = None
        # Without a resourceVersion the write would be unconditional: then read the claim first.
        if claim is not None and not careful and not claim.allocated and claim.resource_version:
            known = (claim.resource_version, claim.requests)
        if careful:
            pod_object = self.read(self.core.read_namespaced_pod, pod.name, namespace)
        self.allocate_claim(namespace, claim_name, pod_object, node, devices, device_class, known)
        self.bind_pod(namespace, pod.name, node, pod_object)

    def allocate_group_claims(self, group, nodes, careful=False):
        """Allocate each claim the group owns, once, reserved for the PodGroup (KEP-5729: a PodGroup's
        claim is reserved for the group rather than for each of its pods)."""
        if not group.group_claims:
            return
        chosen = self.group_placement(group)
        mirrored = {
            claim.name: claim
            for claim in MirroredClaim.objects.filter(
                cluster=group.cluster_id, namespace=group.namespace, name__in=list(group.group_claims.values())
            )
        }
        consumer = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": group.name, "uid": group.uid}
        for entry, name in sorted(group.group_claims.items()):
            rows = chosen.get(entry)
            if not rows:
                raise ApplyFailed(f"group claim {entry} of {group} has no devices allocated")
            claim = mirrored.get(name)
            known = None
            if claim is not None and not careful and not claim.allocated and claim.resource_version:
                known = (claim.resource_version, claim.devices)

            def status(devices, rows=rows):
                return {
                    "allocation": {
                        "devices": {"results": group_results(devices, rows)},
                        "nodeSelector": on_nodes(nodes),
                    },
                    "reservedFor": [consumer],
                }

            self.write_allocation(group.namespace, name, [row[:3] for row in rows], status, claim_devices, known)

    def allocate_claim(self, namespace, name, pod, node, devices, device_class=None, known=None):
        """Write the claim's allocation; `known` is (resourceVersion, requests) as the mirror saw them,
        else (or after a 409) the claim is read first. Returns False when it was allocated already."""

        def status(requests):
            results = [
                {"request": request_name(requests, device_class), "driver": driver, "pool": pool, "device": device}
                for driver, pool, device in devices
            ]
            return {
                "allocation": {"devices": {"results": results}, "nodeSelector": on_nodes([node])},
                "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
            }

        return self.write_allocation(namespace, name, devices, status, claim_requests, known)

    def write_allocation(self, namespace, name, devices, status_for, spec_of, known=None):
        """Write a claim's status: `status_for(what spec_of reads of the claim)`, conditional on the
        claim's resourceVersion; `known` is (resourceVersion, that reading) as the mirror saw them, else
        (or after a 409) the claim is read first. Returns False when it was allocated `devices` already."""
        for _ in range(settings.KUBE_CONFLICT_RETRIES):
            if known is None:
                claim = self.read(self.resource.read_namespaced_resource_claim, name, namespace)
                allocation = (claim.get("status") or {}).get("allocation")
                if allocation:
                    have = [(r["driver"], r["pool"], r["device"]) for r in allocation["devices"]["results"]]
                    if sorted(have) == sorted(devices):
                        return False  # allocated already (by an applier that died before marking its entry done)
                    raise ApplyFailed(f"claim {namespace}/{name} is allocated other devices: {have}")
                version, spec = claim["metadata"]["resourceVersion"], spec_of(claim)
            else:
                version, spec = known
            status = status_for(spec)
            body = {"metadata": {"name": name, "resourceVersion": version}, "status": status}
            try:
                self.resource.replace_namespaced_resource_claim_status(name, namespace, body, _preload_content=False)
                return True
            except ApiException as error:
                if error.status != CONFLICT:
                    raise
                known = None  # read it again
        raise ApplyFailed(f"claim {namespace}/{name}: still conflicting after {settings.KUBE_CONFLICT_RETRIES} tries")

    def bind_pod(self, namespace, name, node, pod=None):
        for _ in range(settings.KUBE_CONFLICT_RETRIES):
            pod = pod or self.read(self.core.read_namespaced_pod, name, namespace)
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound == node:
                return False  # bound already
            if bound:
                raise ApplyFailed(f"pod {namespace}/{name} is bound to {bound}, not {node}")
            binding = client.V1Binding(
                metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=pod["metadata"].get("uid") or None),
                target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
            )
            try:
                # Unread: the server answers with a Status, which the client's V1Binding cannot hold.
                self.core.create_namespaced_pod_binding(name, namespace, binding, _preload_content=False)
                return True
            except ApiException as error:
                if error.status != CONFLICT:
                    raise
                pod = None  # bound meanwhile, or the mirror was behind: read it again
        raise ApplyFailed(f"pod {namespace}/{name}: still conflicting after {settings.KUBE_CONFLICT_RETRIES} tries")

    # --- evict ---------------------------------------------------------------------------------------

    def evict(self, group):
        """Evict the group's pods: all of them, or, when the cycle shrinks the workload (Pod disruption
        mode: it runs on without the pods on failed devices, or above its gang minimum), just the pods
        whose devices it marked leaving."""
        pods = group.pods
        workload = group.workload
        if workload is not None and workload.eviction_requested_at is None:
            leaving = Allocation.objects.filter(
                workload_id=workload.pk, released_at__isnull=True, eviction_requested_at__isnull=False
            ).values_list("pod_index", flat=True)
            pods = [group.pods[index] for index in sorted(set(leaving)) if index < len(group.pods)]
        evicted = []
        for pod in pods:
            eviction = client.V1Eviction(
                metadata=client.V1ObjectMeta(name=pod, namespace=group.namespace),
                delete_options=client.V1DeleteOptions(grace_period_seconds=int(settings.EVICTION_GRACE_SECONDS)),
            )
            try:
                self.core.create_namespaced_pod_eviction(pod, group.namespace, eviction, _preload_content=False)
                evicted.append(pod)
            except ApiException as error:
                if error.status != 404:  # gone already
                    raise
        return {"evicted": evicted}

    # --- release -------------------------------------------------------------------------------------

    def release_claims(self):
        """Deallocate the claims of pods that hold no devices any more, once they no longer run: every pod
        of a PodGroup whose workload ended or was evicted and requeued, and the pods a shrunk workload
        let go; returns the claims released."""
        holding = dict(
            MirroredPodGroup.objects.filter(workload__state__in=HOLDING_STATES).values_list("workload_id", "pk")
        )
        # Of the running workloads, only those that let pods go hold released allocations.
        shrunk = set(
            Allocation.objects.filter(workload_id__in=list(holding), released_at__isnull=False)
            .values_list("workload_id", flat=True)
            .distinct()
        )
        groups = MirroredPodGroup.objects.exclude(workload__state__in=HOLDING_STATES) | MirroredPodGroup.objects.filter(
            workload_id__in=list(shrunk)
        )
        released = []
        for group in groups:
            pods = set(group.claims)
            if group.workload_id in shrunk:
                staying = Allocation.objects.filter(workload_id=group.workload_id, released_at__isnull=True)
                kept = set(staying.values_list("pod_index", flat=True))
                pods = {pod for index, pod in enumerate(group.pods) if index not in kept} & pods
            live = set(
                MirroredPod.objects.filter(cluster=group.cluster_id, namespace=group.namespace, pod_group=group.name)
                .exclude(phase__in=("Succeeded", "Failed"))
                .values_list("name", flat=True)
            )
            names = [group.claims[pod] for pod in pods if pod not in live]
            if group.workload_id not in shrunk and not live:
                names += list(group.group_claims.values())  # the gang's own claims, once none of it runs
            for claim in MirroredClaim.objects.filter(
                cluster=group.cluster_id, namespace=group.namespace, name__in=names, allocated=True
            ):
                if self.deallocate(claim.namespace, claim.name):
                    released.append(f"{claim.namespace}/{claim.name}")
                MirroredClaim.objects.filter(pk=claim.pk).update(allocated=False)
        return released

    def deallocate(self, namespace, name):
        for _ in range(settings.KUBE_CONFLICT_RETRIES):
            try:
                claim = self.read(self.resource.read_namespaced_resource_claim, name, namespace)
            except ApiException as error:
                if error.status == 404:
                    return False
                raise
            if not (claim.get("status") or {}).get("allocation"):
                return False
            body = {"metadata": {"name": name, "resourceVersion": claim["metadata"]["resourceVersion"]}, "status": {}}
            try:
                self.resource.replace_namespaced_resource_claim_status(name, namespace, body, _preload_content=False)
                return True
            except ApiException as error:
                if error.status != CONFLICT:
                    raise
        raise ApplyFailed(f"claim {namespace}/{name}: still conflicting after {settings.KUBE_CONFLICT_RETRIES} tries")

    # --- conditions ----------------------------------------------------------------------------------

    def wanted_condition(self, group, explanation):
        workload = group.workload
        if group.refused:
            return {"status": "False", "reason": group.refused, "message": group.refused_message}
        if workload is None:
            return None
        if workload.state in HOLDING_STATES and workload.eviction_requested_at is not None:
            return {"status": "False", "reason": "Preempted", "message": workload.eviction_message or "being evicted"}
        if workload.state in HOLDING_STATES:
            return {"status": "True", "reason": "Scheduled", "message": f"admitted by the broker as {workload}"}
        if explanation is not None:
            return {"status": "False", "reason": explanation[0], "message": explanation[1]}
        return {"status": "False", "reason": workload.state, "message": f"{workload} is {workload.state}"}

    def write_conditions(self):
        """Write each PodGroup's condition whose content changed since last written; returns how many."""
        groups = list(MirroredPodGroup.objects.select_related("workload"))
        explanations = {
            workload_id: (reason, message)
            for workload_id, reason, message in Explanation.objects.filter(
                workload_id__in=[group.workload_id for group in groups if group.workload_id]
            ).values_list("workload_id", "reason", "message")
        }
        written = 0
        for group in groups:
            wanted = self.wanted_condition(group, explanations.get(group.workload_id))
            if wanted is None or wanted == group.condition:
                continue
            condition = {
                "type": CONDITION,
                **wanted,
                "lastTransitionTime": timezone.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            body = {"status": {"conditions": [condition]}}
            try:
                self.scheduling.patch_namespaced_pod_group_status(
                    group.name, group.namespace, body, _content_type=MERGE_PATCH, _preload_content=False
                )
            except ApiException as error:
                if error.status == 404:
                    continue  # deleted meanwhile; the sync forgets it
                raise
            MirroredPodGroup.objects.filter(pk=group.pk).update(condition=wanted)
            written += 1
        return written

    @staticmethod
    def read(reader, name, namespace):
        return json.loads(reader(name, namespace, _preload_content=False).data)
