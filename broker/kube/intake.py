"""Work in: Workloads and PodGroups (scheduling.k8s.io/v1alpha2), their pods and ResourceClaims become the
broker's workloads.

A PodGroup is one broker workload with one pod set: its pods (those whose `spec.schedulingGroup` names it
and whose `schedulerName` is the broker's) are the replicas, its gang policy's `minCount` the gang, its
first topology constraint's label key the required topology level, its priority and disruption mode the
workload's. The queue is the PodGroup's queue label (settings.KUBE_QUEUE_LABEL), else its namespace's
name; the resource class is its resource-class label. Each pod claims its devices through one
ResourceClaim with one request: `exactly` (a device class and a count) or `firstAvailable` (classes in
fallback order, one count). A request with `allocationMode: All` (every matching device of the pod's
node) goes in as the pod set's claim, as its spec.devices says it. The workload is submitted once every
pod of the gang and every claim exists.

A PodGroup's own `resourceClaims` (Kubernetes 1.36, KEP-5729) are claims the whole gang owns: each
becomes one of the workload's group claims (its `spec.devices` requests and constraints as written),
allocated once for the gang and reachable from every pod; its pods name it too, and that entry is not
their own claim. Such a claim may have one allocationMode All request, beside `exactly` requests with
counts (its allocation result is told apart by request order). An entry names a ResourceClaim, or a
ResourceClaimTemplate from which the resourceclaim controller makes one claim for the PodGroup and
records its name in the PodGroup's `status.resourceClaimStatuses`; until that claim is named and
mirrored the group waits (WaitingForClaims).

A PodGroup made from a Workload's PodGroupTemplate names it (`spec.podGroupTemplateRef.workload`). As in
Kubernetes 1.36 (KEP-5832, "copy/inline"), the PodGroup carries its own copy of the template's policy and
that copy is what counts: the template supplies only what the PodGroup leaves unset (a scheduling policy
naming neither gang nor basic, topology constraints, priority, disruption mode, resource claims). Like
kube-scheduler, the broker takes such a PodGroup only once its Workload and template exist: until then it
waits, with a condition saying for what. A template the broker cannot take (a topology key no level
stands for) is kept with why; a Workload has no status, so the PodGroups made
from that template carry it as their condition (InvalidWorkload).

Priority, as the Priority admission plugin resolves it for a pod (a PodGroup may carry only the class's
name: nothing fills in its number): the PodGroup's own `priority` if set, else the value of its
`priorityClassName`; else its template's, by the same rule; else the value of the `globalDefault`
PriorityClass (the smallest, if several claim it); else (where Kubernetes says 0) its resource class's
priority, as for any submission that names none. PriorityClasses (scheduling.k8s.io/v1) are
mirrored for this. A class the group names that does not exist refuses it (UnknownPriorityClass) until
the class is created. The priority is resolved once, when the broker takes the group: as in Kubernetes,
where priority is fixed at admission, a PriorityClass deleted and created again with another value
(its value cannot be updated) does not re-rank the groups already taken. A PriorityClass with
`preemptionPolicy: Never` means its groups never preempt others (they may still be preempted): the
workload keeps it (Workload.preemption_policy) and the cycle never looks for victims for it. Never is
not read as "not preemptible", which is a different promise (Workload.preemptible, the resource
class's).

A PodGroup the broker cannot take keeps a reason code and message (`refused`), which the applier writes
as the PodGroup's condition: an unknown queue, class or PriorityClass, a claim the broker cannot read.

What the cluster says wins: a bound pod deleted by hand ends its workload (Failed, devices released,
audited as a manual intervention); pods that all succeeded end it Succeeded; a pod that failed, Failed.
"""

import json
import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from broker.audit.models import record
from broker.cycle.executor import complete_evictions, complete_pod_evictions, move
from broker.events import request_cycle_after_commit
from broker.kube.mirror import hold_outside, level_for_label
from broker.kube.models import (
    MirroredClaim,
    MirroredPod,
    MirroredPodGroup,
    MirroredPriorityClass,
    MirroredWorkload,
)
from broker.policy.models import DeviceClass, Queue, ResourceClass
from broker.scheduler.snapshot import ALL_DEVICES, GROUP_POD_SET
from broker.workloads.models import Allocation, DisruptionMode, PreemptionPolicy, Workload
from broker.workloads.services import InvalidSubmission, PodSetRequest, Submission, submit_workload
from broker.workloads.states import FINAL_STATES, HOLDING_STATES, State

log = logging.getLogger(__name__)
SYNC_USER = "kube-sync"


def sync_user():
    """The actor the sync submits as: an admin that cannot log in (the cluster's RBAC already decided)."""
    user, created = get_user_model().objects.get_or_create(
        username=SYNC_USER, defaults={"is_superuser": True, "is_staff": False, "is_active": False}
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


# --- what the cluster says -----------------------------------------------------------------------------


def policy_of(spec):
    """The scheduling policy fields a PodGroup and a PodGroupTemplate share, as the broker reads them.
    `policy` is "gang", "basic" or "" (names neither: a PodGroup left it for its template to supply)."""
    policy = spec.get("schedulingPolicy") or {}
    gang = policy.get("gang")
    return {
        "policy": "gang" if gang is not None else "basic" if policy.get("basic") is not None else "",
        "min_count": (gang or {}).get("minCount"),
        "topology_key": ((spec.get("schedulingConstraints") or {}).get("topology") or [{}])[0].get("key", ""),
        "priority": spec.get("priority"),
        "priority_class": spec.get("priorityClassName") or "",
        "disruption_mode": spec.get("disruptionMode") or "",
        "resource_claims": spec.get("resourceClaims") or [],
    }


def pod_group_spec(obj):
    spec = obj.get("spec") or {}
    reference = (spec.get("podGroupTemplateRef") or {}).get("workload") or {}
    statuses = (obj.get("status") or {}).get("resourceClaimStatuses") or []
    return {
        **policy_of(spec),
        "labels": (obj["metadata"].get("labels") or {}),
        # The claims the resourceclaim controller made from the group's templates, by claim entry.
        "generated_claims": {s["name"]: s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")},
        "template_ref": {"workload": reference["workloadName"], "template": reference["podGroupTemplateName"]}
        if reference.get("workloadName")
        else None,
    }


def template_of(template):
    """A PodGroupTemplate as the broker keeps it: its policy, and why the broker cannot take it, if so."""
    policy = policy_of(template)
    refused = ""
    if policy["topology_key"] and level_for_label(policy["topology_key"]) is None:
        refused = f"topology key {policy['topology_key']!r} is no topology level the broker knows"
    return {**policy, "refused": refused}


# Where the PodGroup leaves a field unset, its template's value counts ("" and [] are unset too). Priority
# is not merged field by field: a PodGroup's own class name beats its template's number (resolved_priority).
UNSET = (None, "", [])
TEMPLATE_FIELDS = ("policy", "min_count", "topology_key", "disruption_mode", "resource_claims")


def with_template(spec, template):
    """The PodGroup's own policy, completed by its template's where it left a field unset. The gang's
    minCount comes with the policy it belongs to: a PodGroup naming a policy keeps its own (basic: none)."""
    merged = dict(spec)
    for name in TEMPLATE_FIELDS:
        if name == "min_count":
            continue
        if merged.get(name) in UNSET:
            merged[name] = template.get(name)
    if not spec.get("policy"):
        merged["min_count"] = template.get("min_count")
    return merged


def workloads_changed(cluster, objs):
    """Create or update the mirrored Workloads; the PodGroups waiting for them are looked at again."""
    MirroredWorkload.objects.bulk_create(
        [
            MirroredWorkload(
                cluster=cluster,
                namespace=obj["metadata"]["namespace"],
                name=obj["metadata"]["name"],
                uid=obj["metadata"].get("uid", ""),
                templates={
                    template["name"]: template_of(template)
                    for template in (obj.get("spec") or {}).get("podGroupTemplates") or []
                },
            )
            for obj in objs
        ],
        update_conflicts=True,
        unique_fields=["cluster", "namespace", "name"],
        update_fields=["uid", "templates"],
    )
    return reconcile_made_from(cluster, {(obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in objs})


def workload_deleted(cluster, obj):
    """A Workload gone: PodGroups made from it and not yet taken wait for it again; those the broker took
    run on (their policy was copied when they were made, and kube-scheduler lets them run too)."""
    meta = obj["metadata"]
    deleted, _ = MirroredWorkload.objects.filter(
        cluster=cluster, namespace=meta["namespace"], name=meta["name"]
    ).delete()
    return reconcile_made_from(cluster, {(meta["namespace"], meta["name"])}) if deleted else 0


def reconcile_made_from(cluster, workloads):
    """Look again at the PodGroups not yet taken that name one of `workloads` ((namespace, name) pairs)."""
    groups = MirroredPodGroup.objects.filter(
        cluster=cluster, namespace__in={namespace for namespace, _ in workloads}, workload__isnull=True
    )
    return sum(
        reconcile(pk)
        for pk, namespace, spec in groups.values_list("pk", "namespace", "spec")
        if (spec.get("template_ref") or {}).get("workload")
        and (namespace, spec["template_ref"]["workload"]) in workloads
    )


def pod_groups_changed(cluster, objs):
    touched = set()
    for obj in objs:
        meta = obj["metadata"]
        group, created = MirroredPodGroup.objects.get_or_create(
            cluster=cluster, namespace=meta["namespace"], name=meta["name"], defaults={"uid": meta.get("uid", "")}
        )
        spec = pod_group_spec(obj)
        if group.uid != meta.get("uid", "") and not created:
            # Deleted and created again under the same name while the sync was away: a new group.
            forget_group(group, "it was replaced by a new PodGroup of the same name")
            group = MirroredPodGroup.objects.create(
                cluster=cluster, namespace=meta["namespace"], name=meta["name"], uid=meta.get("uid", "")
            )
        if group.spec != spec:
            group.spec = spec
            group.save(update_fields=["spec"])
        touched.add(group.pk)
    return sum(reconcile(pk) for pk in touched)


def pod_group_deleted(cluster, obj):
    meta = obj["metadata"]
    group = MirroredPodGroup.objects.filter(cluster=cluster, namespace=meta["namespace"], name=meta["name"]).first()
    if group is None:
        return 0
    forget_group(group, "its PodGroup was deleted in the cluster")
    return 1


def forget_group(group, why):
    workload = group.workload
    if workload is not None and workload.state not in FINAL_STATES:
        end(workload, State.FAILED if workload.state in HOLDING_STATES else State.CANCELLED, why, manual=True)
    group.delete()


def claim_requests(obj):
    """[{name, classes, count}] of a ResourceClaim's device requests; `count` is None when its ways
    differ in count or one takes all (allocationMode All, then `all` is true): the pod set then carries
    the claim itself (pod_group_submission)."""
    requests = []
    for request in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if request.get("exactly"):
            exactly = request["exactly"]
            count = exactly.get("count") or 1
            every = exactly.get("allocationMode") == ALL_DEVICES
            requests.append(
                {
                    "name": request["name"],
                    "classes": [exactly.get("deviceClassName")],
                    "count": None if every else count,
                    **({"all": True} if every else {}),
                }
            )
        elif request.get("firstAvailable"):
            subs = request["firstAvailable"]
            every = any(sub.get("allocationMode") == ALL_DEVICES for sub in subs)
            counts = {sub.get("count") or 1 for sub in subs}
            requests.append(
                {
                    "name": request["name"],
                    "classes": [sub.get("deviceClassName") for sub in subs],
                    "count": counts.pop() if len(counts) == 1 and not every else None,
                    "subrequests": [sub["name"] for sub in subs],
                    **({"all": True} if every else {}),
                }
            )
    return requests


def claim_devices(obj):
    """A claim's spec.devices as a group claim is read (requests and constraints as resource.k8s.io/v1
    writes them; its config is the driver's business)."""
    devices = (obj.get("spec") or {}).get("devices") or {}
    return {"requests": devices.get("requests") or [], "constraints": devices.get("constraints") or []}


def allocated_devices(obj):
    """[[driver, pool, device]] of a claim's status.allocation (empty while it is not allocated)."""
    results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return sorted([result["driver"], result["pool"], result["device"]] for result in results)


def brokers_claims(cluster, namespaces):
    """(namespace, name) of the claims of the PodGroups the broker took (only those have `claims`, kept
    after their workload is gone), their pods' and their own (group claims): the only claims it allocates."""
    groups = MirroredPodGroup.objects.filter(cluster=cluster, namespace__in=namespaces).exclude(claims={})
    return {
        (namespace, claim)
        for namespace, claims, owned in groups.values_list("namespace", "claims", "group_claims")
        for claim in [*claims.values(), *owned.values()]
    }


def outside_marks(rows):
    """{"namespace/name": devices} of mirrored claims marked as allocated outside the broker."""
    return {f"{row.namespace}/{row.name}": row.allocated_devices for row in rows if row.outside}


def claims_changed(cluster, objs):
    keys = [(obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in objs]
    held = {key: devices for key, obj in zip(keys, objs, strict=True) if (devices := allocated_devices(obj))}
    ours = brokers_claims(cluster, {namespace for namespace, _ in held}) if held else set()
    outside = {key for key in held if key not in ours}
    # Only a claim allocated outside now or before moves a taint: the claims the broker allocates never do.
    batch = set(keys)
    before = outside_marks(
        row
        for row in MirroredClaim.objects.filter(
            cluster=cluster, outside=True, namespace__in={ns for ns, _ in keys}, name__in={name for _, name in keys}
        )
        if (row.namespace, row.name) in batch
    )
    # One statement for a batch of claims (the sync hands over each object once per batch).
    MirroredClaim.objects.bulk_create(
        [
            MirroredClaim(
                cluster=cluster,
                namespace=key[0],
                name=key[1],
                uid=obj["metadata"].get("uid", ""),
                resource_version=obj["metadata"].get("resourceVersion", ""),
                requests=claim_requests(obj),
                devices=claim_devices(obj),
                allocated=bool((obj.get("status") or {}).get("allocation")),
                allocated_devices=held.get(key, []),
                outside=key in outside,
            )
            for key, obj in zip(keys, objs, strict=True)
        ],
        update_conflicts=True,
        unique_fields=["cluster", "namespace", "name"],
        update_fields=[
            "uid",
            "resource_version",
            "requests",
            "devices",
            "allocated",
            "allocated_devices",
            "outside",
        ],
    )
    if before or outside:
        hold_outside(cluster, before, {f"{namespace}/{name}": held[(namespace, name)] for namespace, name in outside})
    return reconcile_waiting(cluster, {obj["metadata"]["namespace"] for obj in objs})


def claim_deleted(cluster, obj):
    meta = obj["metadata"]
    claims = MirroredClaim.objects.filter(cluster=cluster, namespace=meta["namespace"], name=meta["name"])
    before = outside_marks(claims)
    claims.delete()
    if before:
        hold_outside(cluster, before, {})
    return 0


def take_back(cluster, namespace, claim_names):
    """Claims of a PodGroup the broker just took were never another scheduler's (seen allocated before
    their group, as after a sync that lost its database): their devices are no longer held outside."""
    claims = MirroredClaim.objects.filter(cluster=cluster, namespace=namespace, name__in=claim_names, outside=True)
    before = outside_marks(claims)
    if before:
        claims.update(outside=False)
        hold_outside(cluster, before, {})


def pod_claims(obj):
    """The ResourceClaim names a pod uses: named directly, or generated from a template (pod status)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    generated = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    names = []
    for claim in spec.get("resourceClaims") or []:
        name = claim.get("resourceClaimName") or generated.get(claim["name"])
        if name:
            names.append(name)
    return names


def ours(obj):
    spec = obj.get("spec") or {}
    return spec.get("schedulerName") == settings.KUBE_SCHEDULER_NAME and (spec.get("schedulingGroup") or {}).get(
        "podGroupName"
    )


def pods_changed(cluster, objs):
    pods = [
        MirroredPod(
            cluster=cluster,
            namespace=obj["metadata"]["namespace"],
            name=obj["metadata"]["name"],
            uid=obj["metadata"].get("uid", ""),
            pod_group=obj["spec"]["schedulingGroup"]["podGroupName"],
            node_name=obj["spec"].get("nodeName") or "",
            phase=(obj.get("status") or {}).get("phase") or "",
            claims=pod_claims(obj),
            terminating=bool(obj["metadata"].get("deletionTimestamp")),
        )
        for obj in objs
        if ours(obj)
    ]
    # One statement for a batch of pods (the sync hands over each object once per batch).
    MirroredPod.objects.bulk_create(
        pods,
        update_conflicts=True,
        unique_fields=["cluster", "namespace", "name"],
        update_fields=["uid", "pod_group", "node_name", "phase", "claims", "terminating"],
    )
    groups = {(pod.namespace, pod.pod_group) for pod in pods}
    return sum(reconcile_named(cluster, namespace, name) for namespace, name in sorted(groups))


def pod_deleted(cluster, obj):
    return pods_deleted(cluster, [obj])


def pods_deleted(cluster, objs):
    """Pods gone from the cluster, a batch at a time (a gang's pods go together): their rows in one
    statement, then each group they belonged to looked at once."""
    keys = {(obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in objs}
    pods = [
        pod
        for pod in MirroredPod.objects.filter(cluster=cluster, name__in={name for _, name in keys})
        if (pod.namespace, pod.name) in keys
    ]
    if not pods:
        return 0
    MirroredPod.objects.filter(pk__in=[pod.pk for pod in pods]).delete()
    by_group = {}
    for pod in pods:
        by_group.setdefault((pod.namespace, pod.pod_group), []).append(pod.name)
    return sum(group_lost_pods(cluster, namespace, name, gone) for (namespace, name), gone in sorted(by_group.items()))


def group_lost_pods(cluster, namespace, name, gone):
    group = MirroredPodGroup.objects.filter(cluster=cluster, namespace=namespace, name=name).first()
    if group is None or group.workload_id is None:
        return reconcile_named(cluster, namespace, name)
    workload = Workload.objects.get(pk=group.workload_id)
    gone = [pod for pod in gone if pod in group.pods]
    if workload.state not in HOLDING_STATES or not gone:
        return 0
    if workload.eviction_requested_at is not None:
        # Evicted by the broker: once the last pod is gone its eviction is complete.
        if not MirroredPod.objects.filter(cluster=cluster, namespace=namespace, pod_group=group.name).exists():
            complete_evictions([workload.pk], timezone.now())
        return 1
    leaving = list(
        Allocation.objects.filter(
            workload=workload,
            pod_index__in=[group.pods.index(pod) for pod in gone],
            released_at__isnull=True,
            eviction_requested_at__isnull=False,
        ).values_list("id", "workload_id", "pod_set", "pod_index")
    )
    if leaving:
        # Pods a shrunk workload lets go (Pod disruption mode): the rest run on.
        complete_pod_evictions(leaving, timezone.now())
    left = {row[3] for row in leaving}
    by_hand = [pod for pod in gone if group.pods.index(pod) not in left]
    if by_hand:
        end(workload, State.FAILED, f"pod {namespace}/{by_hand[0]} was deleted in the cluster", manual=True)
    return 1


def reconcile_waiting(cluster, namespaces):
    groups = MirroredPodGroup.objects.filter(cluster=cluster, namespace__in=namespaces, workload__isnull=True)
    return sum(reconcile(pk) for pk in groups.values_list("pk", flat=True))


def reconcile_named(cluster, namespace, name):
    group = MirroredPodGroup.objects.filter(cluster=cluster, namespace=namespace, name=name).first()
    return reconcile(group.pk) if group is not None else 0


# --- PriorityClasses -----------------------------------------------------------------------------------

# Why a group may wait on its PriorityClass: looked at again whenever PriorityClasses change.
PRIORITY_REFUSALS = ("UnknownPriorityClass",)


def priority_classes_changed(cluster, objs):
    """Create or update the mirrored PriorityClasses. Groups the broker took keep the priority it resolved
    when it took them (see the module's docstring); those still waiting and resolving through one of these
    classes are looked at again."""
    names = {obj["metadata"]["name"] for obj in objs}
    was_default = MirroredPriorityClass.objects.filter(cluster=cluster, name__in=names, global_default=True).exists()
    MirroredPriorityClass.objects.bulk_create(
        [
            MirroredPriorityClass(
                cluster=cluster,
                name=obj["metadata"]["name"],
                uid=obj["metadata"].get("uid", ""),
                value=obj.get("value") or 0,
                global_default=bool(obj.get("globalDefault")),
                preemption_policy=obj.get("preemptionPolicy") or PreemptionPolicy.PREEMPT_LOWER_PRIORITY,
            )
            for obj in objs
        ],
        update_conflicts=True,
        unique_fields=["cluster", "name"],
        update_fields=["uid", "value", "global_default", "preemption_policy"],
    )
    default_changed = was_default or any(obj.get("globalDefault") for obj in objs)
    return reconcile_priority_waiting(cluster, names, default_changed)


def priority_class_deleted(cluster, obj):
    name = obj["metadata"]["name"]
    classes = MirroredPriorityClass.objects.filter(cluster=cluster, name=name)
    was_default = classes.filter(global_default=True).exists()
    deleted, _ = classes.delete()
    return reconcile_priority_waiting(cluster, {name}, was_default) if deleted else 0


def reconcile_priority_waiting(cluster, names, default_changed):
    """Look again at the PodGroups not yet taken that wait on their PriorityClass, or whose priority would
    resolve through one of `names` (or through the default PriorityClass, when `default_changed`)."""
    groups = MirroredPodGroup.objects.filter(cluster=cluster, workload__isnull=True)
    return sum(
        reconcile(pk)
        for pk, spec, refused in groups.values_list("pk", "spec", "refused")
        if refused in PRIORITY_REFUSALS or resolves_through(spec, names, default_changed)
    )


def resolves_through(spec, names, default_changed):
    if spec.get("priority_class"):
        return spec["priority_class"] in names
    if spec.get("priority") is not None:
        return False
    # Through its template's class (read only when the group is looked at), or the default.
    return bool(spec.get("template_ref")) or default_changed


def resolved_priority(cluster, own, template, where):
    """(priority, PriorityClass name or "", preemption policy) of a PodGroup whose own spec is `own` and
        whose template (None: made from none) is `template`, named `where`: the first of its own priority, its
        own class's value, its template's priority, its template's class's value, the default class's value,
    else None (the resource class's priority, see the end).
        A number set wins over the class named beside it (Priority admission sets it from that class; the class
        may have gone since). Raises Refused for a class named and needed that does not exist."""
    for source, named_by in ((own, "the PodGroup's priorityClassName"), (template, f"priorityClassName of {where}")):
        if source is None:
            continue
        name = source.get("priority_class") or ""
        if source.get("priority") is None and not name:
            continue
        known = MirroredPriorityClass.objects.filter(cluster=cluster, name=name).first() if name else None
        if source.get("priority") is not None:
            policy = known.preemption_policy if known else PreemptionPolicy.PREEMPT_LOWER_PRIORITY
            return source["priority"], name if known else "", policy
        if known is None:
            raise Refused("UnknownPriorityClass", f"no PriorityClass named {name!r} ({named_by})")
        return known.value, known.name, known.preemption_policy
    # Kubernetes: "if more than one PriorityClass has globalDefault set, the smallest value is used".
    default = (
        MirroredPriorityClass.objects.filter(cluster=cluster, global_default=True).order_by("value", "name").first()
    )
    if default is not None:
        return default.value, default.name, default.preemption_policy
    # Kubernetes would say 0 here; the broker's answer is the group's resource class's priority, as for
    # any submission that names none (so a cluster without PriorityClasses ranks groups as before).
    return None, "", PreemptionPolicy.PREEMPT_LOWER_PRIORITY


# --- from the cluster's words to a workload ------------------------------------------------------------


class Refused(Exception):
    def __init__(self, reason, message):
        super().__init__(message)
        self.reason, self.message = reason, message


def reconcile(pk, again=True):
    """Bring one PodGroup's workload up to what the cluster says; returns 1 if anything changed.

    The pods, the claims and the group come in on three watches, each committing on its own: two of them
    can each decide in their transaction that the other's row is missing. So a group left waiting is looked
    at once more after the transaction commits, when whichever committed last sees both; the group's row
    lock keeps two of these from submitting it twice."""
    with transaction.atomic():
        changed = reconcile_locked(pk)
        group = MirroredPodGroup.objects.filter(pk=pk).values_list("workload_id", flat=True).first()
    if again and group is None and MirroredPodGroup.objects.filter(pk=pk).exists():
        transaction.on_commit(lambda: reconcile(pk, again=False), robust=True)
    return changed


def reconcile_locked(pk):
    group = MirroredPodGroup.objects.select_for_update(of=("self",)).select_related("cluster").filter(pk=pk).first()
    if group is None:
        return 0
    pods = list(MirroredPod.objects.filter(cluster=group.cluster, namespace=group.namespace, pod_group=group.name))
    if group.workload_id is not None:
        return follow_pods(group, pods)
    try:
        submission, claims, owned = submission_for(group, pods)
    except Refused as refusal:
        return refuse(group, refusal.reason, refusal.message)
    if submission is None:
        return refuse(group, "WaitingForPods", claims)
    try:
        with transaction.atomic():
            workload = submit_workload(submission, sync_user())
            group.workload = workload
            group.pods = [pod.name for pod in sorted(pods, key=lambda pod: pod.name)]
            group.claims = claims
            group.group_claims = owned
            group.refused = group.refused_message = ""
            group.save(update_fields=["workload", "pods", "claims", "group_claims", "refused", "refused_message"])
            take_back(group.cluster, group.namespace, set(claims.values()) | set(owned.values()))
    except InvalidSubmission as invalid:
        return refuse(group, "InvalidRequest", "; ".join(flatten(invalid.errors)))
    return 1


def flatten(errors, prefix=""):
    if isinstance(errors, dict):
        return [line for key, value in errors.items() for line in flatten(value, f"{prefix}{key}: ")]
    if isinstance(errors, list):
        return [line for value in errors for line in flatten(value, prefix)]
    return [f"{prefix}{errors}"]


def refuse(group, reason, message):
    if (group.refused, group.refused_message) == (reason, message):
        return 0
    group.refused, group.refused_message = reason, message
    group.save(update_fields=["refused", "refused_message"])
    return 1


def submission_for(group, pods):
    """(Submission, {pod: claim}, {group claim entry: claim}) once the gang is complete; (None, why it
    waits, None) before; raises Refused."""
    spec = group.spec
    reference = spec.get("template_ref")
    template = where = None
    if reference:
        mirrored = MirroredWorkload.objects.filter(
            cluster=group.cluster, namespace=group.namespace, name=reference["workload"]
        ).first()
        if mirrored is None:
            raise Refused("WaitingForWorkload", f"Workload {reference['workload']} does not exist yet")
        template = mirrored.templates.get(reference["template"])
        if template is None:
            raise Refused(
                "InvalidWorkload", f"Workload {mirrored.name} has no PodGroupTemplate {reference['template']!r}"
            )
        where = f"Workload {mirrored.name}, PodGroupTemplate {reference['template']}"
        if template["refused"]:
            raise Refused("InvalidWorkload", f"{where}: {template['refused']}")
        spec = with_template(spec, template)
    labels = spec.get("labels") or {}
    queue_name = labels.get(settings.KUBE_QUEUE_LABEL) or group.namespace
    queue = Queue.objects.select_related("team").filter(name=queue_name).first()
    if queue is None:
        raise Refused(
            "UnknownQueue", f"no queue named {queue_name!r} (label {settings.KUBE_QUEUE_LABEL} or the namespace)"
        )
    class_name = labels.get(settings.KUBE_RESOURCE_CLASS_LABEL)
    resource_class = ResourceClass.objects.filter(name=class_name).first() if class_name else None
    if resource_class is None:
        raise Refused(
            "UnknownResourceClass",
            f"label {settings.KUBE_RESOURCE_CLASS_LABEL} must name a resource class"
            + (f"; there is none named {class_name!r}" if class_name else ""),
        )
    priority, _, preemption_policy = resolved_priority(group.cluster, group.spec, template, where)
    topology = ""
    if spec.get("topology_key"):
        topology = level_for_label(spec["topology_key"])
        if topology is None:
            raise Refused(
                "InvalidRequest", f"topology key {spec['topology_key']!r} is no topology level the broker knows"
            )
    group_claims, owned = group_claims_of(group, spec.get("resource_claims") or [])
    min_count = spec.get("min_count")
    wanted = min_count or 1
    if len(pods) < wanted:
        return None, f"{len(pods)} of the gang's {wanted} pods exist", None
    claims, shapes = {}, set()
    # A pod names the group's claims too (KEP-5729: its entry must match the PodGroup's): not its own.
    shared = set(owned.values())
    for pod in pods:
        pod.claims = [name for name in pod.claims if name not in shared]
    named = [name for pod in pods for name in pod.claims]
    known = {
        claim.name: claim
        for claim in MirroredClaim.objects.filter(cluster=group.cluster, namespace=group.namespace, name__in=named)
    }
    for pod in sorted(pods, key=lambda pod: pod.name):
        if len(pod.claims) != 1:
            raise Refused("InvalidRequest", f"pod {pod.name} must claim its devices through exactly one ResourceClaim")
        claim = known.get(pod.claims[0])
        if claim is None:
            return None, f"ResourceClaim {pod.claims[0]} of pod {pod.name} does not exist yet", None
        if len(claim.requests) != 1 or not (claim.requests[0]["count"] or claim.requests[0].get("all")):
            raise Refused(
                "InvalidRequest",
                f"ResourceClaim {claim.name} must have one request with an exact device count or allocationMode All",
            )
        request = claim.requests[0]
        if request.get("all"):  # its devices are counted on the node: the pod set carries the claim itself
            shapes.add((tuple(request["classes"]), json.dumps(claim.devices, sort_keys=True)))
        else:
            shapes.add((tuple(request["classes"]), request["count"]))
        claims[pod.name] = claim.name
    if len(shapes) != 1:
        raise Refused("InvalidRequest", "every pod of the group must claim the same devices")
    classes, count = shapes.pop()
    unknown = [name for name in classes if not DeviceClass.objects.filter(name=name).exists()]
    if unknown:
        raise Refused("InvalidRequest", f"unknown device class {', '.join(unknown)}")
    if isinstance(count, str):
        pod_set = PodSetRequest(name="main", replicas=len(pods), devices_per_pod=1, min_count=min_count,
                                claim=json.loads(count))  # fmt: skip
    else:
        pod_set = PodSetRequest(
            name="main", replicas=len(pods), devices_per_pod=count, min_count=min_count, device_classes=classes
        )
    return (
        Submission(
            name=f"{group.namespace}-{group.name}"[:94] + f"-{group.uid[:5]}",
            queue=queue,
            resource_class=resource_class,
            pod_sets=(pod_set,),
            priority=priority,
            disruption_mode=spec.get("disruption_mode") if spec.get("disruption_mode") in DisruptionMode.values else "",
            preemption_policy=preemption_policy,
            topology_required=topology or None,
            group_claims=group_claims,
        ),
        claims,
        owned,
    )


# The longest claim entry name whose allocation rows' pod set (GROUP_POD_SET + name) fits Allocation.pod_set.
GROUP_CLAIM_NAME_MAX = 63 - len(GROUP_POD_SET)


def group_claims_of(group, entries):
    """([{name, requests, constraints}] for the Submission, {entry: ResourceClaim name}) of a PodGroup's
    resourceClaims (its own, or its template's). An entry names a ResourceClaim, or a
    ResourceClaimTemplate from which the resourceclaim controller makes one claim for the PodGroup and
    records its name in the PodGroup's status.resourceClaimStatuses: until it has, and until the claim
    is mirrored, the group waits (WaitingForClaims). Raises Refused."""
    generated = group.spec.get("generated_claims") or {}
    known = {}
    owned = {}
    for entry in entries:
        name = entry.get("name") or ""
        if len(name) > GROUP_CLAIM_NAME_MAX:
            raise Refused(
                "InvalidRequest", f"resource claim entry {name!r} is longer than {GROUP_CLAIM_NAME_MAX} characters"
            )
        if entry.get("resourceClaimName"):
            owned[name] = entry["resourceClaimName"]
        elif entry.get("resourceClaimTemplateName"):
            if not generated.get(name):
                raise Refused(
                    "WaitingForClaims",
                    f"no ResourceClaim made from template {entry['resourceClaimTemplateName']} for claim {name} "
                    "yet (the PodGroup's status.resourceClaimStatuses names none)",
                )
            owned[name] = generated[name]
        else:
            raise Refused("InvalidRequest", f"resource claim {name} names neither a claim nor a claim template")
    if owned:
        known = {
            claim.name: claim
            for claim in MirroredClaim.objects.filter(
                cluster=group.cluster, namespace=group.namespace, name__in=list(owned.values())
            )
        }
    group_claims = []
    for name, claim_name in owned.items():
        claim = known.get(claim_name)
        if claim is None:
            raise Refused("WaitingForClaims", f"ResourceClaim {claim_name} (group claim {name}) does not exist yet")
        takes_all = [request for request in claim.requests if request.get("all")]
        if takes_all and (len(takes_all) > 1 or any(request.get("subrequests") for request in claim.requests)):
            # Its allocation result is written from the devices in request order (applier.group_results):
            # one request of unknown size among counted ones can be told apart, two cannot.
            raise Refused(
                "InvalidRequest",
                f"ResourceClaim {claim_name} (group claim {name}): an allocationMode All request goes only "
                "beside exactly requests with a count",
            )
        group_claims.append({"name": name, **claim.devices})
    return tuple(group_claims), owned


def follow_pods(group, pods):
    """A workload that runs: all its pods succeeded -> Succeeded; one failed -> Failed."""
    workload = Workload.objects.get(pk=group.workload_id)
    if workload.state != State.RUNNING:
        return 0
    # The pods that still hold devices: a shrunk workload (Pod disruption mode) runs on without the rest.
    holding = set(
        Allocation.objects.filter(workload=workload, released_at__isnull=True).values_list("pod_index", flat=True)
    )
    members = {name for index, name in enumerate(group.pods) if index in holding}
    phases = {pod.name: pod.phase for pod in pods if pod.name in members}
    if any(phase == "Failed" for phase in phases.values()):
        return end(workload, State.FAILED, "a pod failed")
    if members and len(phases) == len(members) and all(phase == "Succeeded" for phase in phases.values()):
        return end(workload, State.SUCCEEDED, "every pod succeeded")
    return 0


def end(workload, target, why, manual=False):
    now = timezone.now()
    source = workload.state
    moved = move([workload.pk], source, target, now, why)
    if not moved:
        return 0
    Allocation.objects.filter(workload=workload, released_at__isnull=True).update(released_at=now)
    if manual:
        record(
            "workload.ended_in_cluster",
            workload,
            before={"state": source},
            after={"state": target},
            reason=why,
            manual_intervention=True,
        )
    request_cycle_after_commit(f"workload {workload.pk} {target.lower()} in the cluster")
    return 1


def forget_missing(cluster, resource, present):
    """After a list: what the mirror holds of `resource` that the cluster no longer lists was deleted."""
    present = set(present)  # (namespace, name)
    if resource == "priorityclasses":
        names = set(MirroredPriorityClass.objects.filter(cluster=cluster).values_list("name", flat=True))
        gone = names - {name for _, name in present}
        for name in sorted(gone):
            priority_class_deleted(cluster, {"metadata": {"name": name}})
        return len(gone)
    model = {
        "workloads": MirroredWorkload,
        "podgroups": MirroredPodGroup,
        "resourceclaims": MirroredClaim,
        "pods": MirroredPod,
    }[resource]
    gone = [row for row in model.objects.filter(cluster=cluster) if (row.namespace, row.name) not in present]
    objs = [{"metadata": {"namespace": row.namespace, "name": row.name}} for row in gone]
    if resource == "pods":
        pods_deleted(cluster, objs)
    else:
        handler = {"workloads": workload_deleted, "podgroups": pod_group_deleted, "resourceclaims": claim_deleted}[
            resource
        ]
        for obj in objs:
            handler(cluster, obj)
    return len(gone)
