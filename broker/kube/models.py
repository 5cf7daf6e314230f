"""What the Kubernetes bridge remembers: where each mirrored object came from, how far each watch has
read, and the outbox of decisions still to apply to the cluster.

The inventory, policy and workload rows themselves are the broker's own (broker.inventory, broker.policy,
broker.workloads); these rows say which cluster object each of them mirrors.
"""

from datetime import timedelta

from django.db import models
from django.db.models import Q
from django.utils import timezone

from broker.workloads.models import PreemptionPolicy


class Cluster(models.Model):
    """A Kubernetes cluster the broker mirrors, and the health of its sync."""

    name = models.SlugField(max_length=63, unique=True)
    server = models.CharField(max_length=500, blank=True, help_text="The API server's URL, as last connected.")
    last_listed_at = models.DateTimeField(null=True, blank=True, help_text="The last full list of every resource.")
    last_synced_at = models.DateTimeField(null=True, blank=True, help_text="The last list, event or bookmark.")
    events_applied = models.BigIntegerField(default=0)
    relists = models.PositiveIntegerField(default=0, help_text="Lists after a watch expired (410 Gone).")
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def healthy(self, now=None, stale_seconds=120):
        """Synced within `stale_seconds`, and no error since the last sync."""
        now = now or timezone.now()
        if self.last_synced_at is None or now - self.last_synced_at > timedelta(seconds=stale_seconds):
            return False
        return self.last_error_at is None or self.last_error_at < self.last_synced_at


class WatchCursor(models.Model):
    """How far the watch of one resource has read: a restarted sync resumes from here."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="cursors")
    resource = models.CharField(max_length=63)
    resource_version = models.CharField(max_length=63, blank=True)
    listed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "resource"], name="kube_cursor_unique")]

    def __str__(self):
        return f"{self.cluster}/{self.resource}@{self.resource_version}"


class MirroredNode(models.Model):
    """An inventory node that mirrors a Kubernetes Node."""

    node = models.OneToOneField("inventory.Node", on_delete=models.CASCADE, related_name="kube")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    uid = models.CharField(max_length=63, blank=True)
    ready = models.CharField(max_length=10, default="Unknown", help_text="The Node's Ready condition.")
    conditions = models.JSONField(default=list, blank=True)
    gone = models.BooleanField(default=False, help_text="Deleted in the cluster while its devices were held.")

    def __str__(self):
        return f"{self.cluster}/{self.node}"


class MirroredSlice(models.Model):
    """A ResourceSlice: which devices of which node it published, and its own device taints."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="slices")
    name = models.CharField(max_length=253)
    driver = models.CharField(max_length=253)
    pool = models.CharField(max_length=253)
    node = models.ForeignKey("inventory.Node", null=True, on_delete=models.CASCADE, related_name="+")
    devices = models.JSONField(default=list, blank=True, help_text="Names of the devices it publishes.")
    taints = models.JSONField(default=dict, blank=True, help_text="{device: [taint]} as the slice publishes them.")
    shared_counters = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="kube_slice_unique")]

    def __str__(self):
        return f"{self.cluster}/{self.name}"


class MirroredDeviceClass(models.Model):
    device_class = models.OneToOneField("policy.DeviceClass", on_delete=models.CASCADE, related_name="kube")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="device_classes")
    name = models.CharField(max_length=253)

    def __str__(self):
        return f"{self.cluster}/{self.name}"


class TaintRule(models.Model):
    """A DeviceTaintRule: a taint on every device its selector matches (empty selector fields match all)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="taint_rules")
    name = models.CharField(max_length=253)
    driver = models.CharField(max_length=253, blank=True)
    pool = models.CharField(max_length=253, blank=True)
    device = models.CharField(max_length=253, blank=True)
    taint = models.JSONField(default=dict)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="kube_taint_rule_unique")]

    def __str__(self):
        return f"{self.cluster}/{self.name}"


class MirroredPodGroup(models.Model):
    """A scheduling.k8s.io/v1alpha2 PodGroup, the broker's workload for it (once accepted) and its pods.

    `pods` is the gang in a fixed order (by name): the broker's pod index i is `pods[i]`; `claims` names each
    pod's ResourceClaim. `condition` is the last condition written to the PodGroup's status."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pod_groups")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=63, blank=True)
    workload = models.OneToOneField(
        "workloads.Workload", null=True, blank=True, on_delete=models.SET_NULL, related_name="pod_group"
    )
    pods = models.JSONField(default=list, blank=True)
    claims = models.JSONField(default=dict, blank=True, help_text="{pod: claim name}")
    # Kubernetes 1.36 spec.resourceClaims (KEP-5729): claims the whole gang owns, allocated once for it.
    group_claims = models.JSONField(
        default=dict, blank=True, help_text="{PodGroup claim entry: ResourceClaim name} of the claims it owns."
    )
    spec = models.JSONField(default=dict, blank=True, help_text="Its spec, labels and priority as last seen.")
    refused = models.CharField(max_length=32, blank=True, help_text="A reason code when the broker cannot take it.")
    refused_message = models.TextField(blank=True)
    condition = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="kube_pod_group_unique"),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class MirroredWorkload(models.Model):
    """A scheduling.k8s.io/v1alpha2 Workload: the policy templates its PodGroups are made from.

    `templates` holds each PodGroupTemplate by name as the broker reads it (intake.template_of); a template
    the broker cannot take keeps why under "refused", which its PodGroups then carry as their condition
    (a Workload has no status of its own to write it to)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="workloads")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=63, blank=True)
    templates = models.JSONField(default=dict, blank=True, help_text="{template name: its policy}")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="kube_workload_unique"),
        ]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class Action(models.TextChoices):
    BIND = "Bind", "allocate the claims and bind the pods of an admitted workload"
    EVICT = "Evict", "evict the pods of a preempted workload"


class OutboxEntry(models.Model):
    """A decision committed by a cycle, to apply to the cluster exactly once. Written in the cycle's own
    transaction (broker.kube.outbox), done by the applier (broker.kube.applier), which marks it done in the
    same transaction in which it records what it applied."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="outbox")
    pod_group = models.ForeignKey(MirroredPodGroup, on_delete=models.CASCADE, related_name="outbox")
    action = models.CharField(max_length=8, choices=Action.choices)
    cycle_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    done_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    applied = models.JSONField(default=dict, blank=True, help_text="What was applied: {pod: node}, claims.")

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["created_at"], condition=Q(done_at__isnull=True), name="kube_outbox_open")]

    def __str__(self):
        return f"{self.action} {self.pod_group} ({'done' if self.done_at else 'open'})"


class MirroredPod(models.Model):
    """A pod the broker schedules (its schedulerName is the broker's) that belongs to a PodGroup."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pods")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=63, blank=True)
    pod_group = models.CharField(max_length=253)
    node_name = models.CharField(max_length=253, blank=True)
    phase = models.CharField(max_length=16, blank=True)
    claims = models.JSONField(default=list, blank=True, help_text="Names of its ResourceClaims.")
    terminating = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="kube_pod_unique")]
        indexes = [models.Index(fields=["cluster", "namespace", "pod_group"], name="kube_pod_group")]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class MirroredClaim(models.Model):
    """A ResourceClaim: its requests as {name, device classes in fallback order, count}."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="claims")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=63, blank=True)
    requests = models.JSONField(default=list, blank=True)
    devices = models.JSONField(
        default=dict, blank=True, help_text="Its spec.devices requests and constraints, as a group claim is read."
    )
    allocated = models.BooleanField(default=False)
    allocated_devices = models.JSONField(
        default=list, blank=True, help_text="[[driver, pool, device]] of its status.allocation, as last seen."
    )
    outside = models.BooleanField(
        default=False, help_text="Allocated by another scheduler: its devices are held outside the broker."
    )
    resource_version = models.CharField(
        max_length=63, blank=True, help_text="As last seen: the applier's first write is conditional on it."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="kube_claim_unique")]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class MirroredPriorityClass(models.Model):
    """A scheduling.k8s.io/v1 PriorityClass: what a PodGroup's `priorityClassName` (or its template's)
    stands for, and the cluster's default priority (`globalDefault`). Read when the broker takes a group,
    as Kubernetes' Priority admission resolves it when a pod is created (broker.kube.intake)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="priority_classes")
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=63, blank=True)
    value = models.IntegerField()
    global_default = models.BooleanField(default=False)
    preemption_policy = models.CharField(
        max_length=24, choices=PreemptionPolicy.choices, default=PreemptionPolicy.PREEMPT_LOWER_PRIORITY
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="kube_priority_class_unique")]

    def __str__(self):
        return f"{self.cluster}/{self.name} ({self.value})"
