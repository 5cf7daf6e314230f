from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from broker.inventory import quantities
from broker.scheduler import accounting
from broker.scheduler.claims import Claim, claim_from_dra
from broker.workloads.fields import StoredJSONField
from broker.workloads.states import HOLDING_STATES, WAITING_STATES, InvalidTransition, State, can_transition


class DisruptionMode(models.TextChoices):
    POD = "Pod", "Pods may be evicted one by one"
    POD_GROUP = "PodGroup", "The group is evicted whole"


class PreemptionPolicy(models.TextChoices):
    """Kubernetes PriorityClass preemptionPolicy, kept on the workload (its PodGroup's class, or as asked)."""

    PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority", "may preempt lower-priority work"
    NEVER = "Never", "never preempts; may still be preempted"


class ApprovalState(models.TextChoices):
    NOT_REQUIRED = "NotRequired"
    REQUESTED = "Requested"
    APPROVED = "Approved"
    REJECTED = "Rejected"


GROUP_CLAIMS_HELP = (
    "Claims the whole gang owns (PodGroup resourceClaims): [{name, requests, constraints}], requests and "
    "constraints as resource.k8s.io/v1 writes a claim's devices; each allocated once for all its pods."
)


def group_claim_devices(claim):
    """The fewest devices a stored group claim takes; 0 for a malformed one (the cycle calls it invalid)."""
    try:
        body = {key: value for key, value in claim.items() if key != "name"}
        return Claim(*claim_from_dra(body)).fewest_devices()
    except (ValueError, AttributeError):
        return 0


class Workload(models.Model):
    """A PodGroup: one or more pod sets scheduled all-or-nothing."""

    # Indexed by Meta.indexes without the LIKE copy a SlugField's db_index adds: every admission and
    # start rewrites index entries of all of this table's indexes (the state changes), so none is spare.
    name = models.SlugField(max_length=100, db_index=False)
    # Looked up through the (team, name) unique index, which starts with it.
    team = models.ForeignKey("policy.Team", on_delete=models.PROTECT, related_name="workloads", db_index=False)
    # Looked up through the (queue, state) index, which starts with it.
    queue = models.ForeignKey("policy.Queue", on_delete=models.PROTECT, related_name="workloads", db_index=False)
    # Not indexed (nor submitted_by): read by a submission's class guidance within one team (the team's
    # rows through the (team, name) index), by API filters and by the rare deletion of a class or user.
    # An index is one more entry for every one of the 20,000 rows an admission rewrites.
    resource_class = models.ForeignKey(
        "policy.ResourceClass", null=True, blank=True, on_delete=models.PROTECT, related_name="workloads",
        db_index=False,
    )  # fmt: skip
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="workloads",
        db_index=False,
    )  # fmt: skip
    priority = models.IntegerField(default=0)
    disruption_mode = models.CharField(max_length=8, choices=DisruptionMode.choices, default=DisruptionMode.POD_GROUP)
    preemptible = models.BooleanField(default=True)
    preemption_policy = models.CharField(
        max_length=24,
        choices=PreemptionPolicy.choices,
        default=PreemptionPolicy.PREEMPT_LOWER_PRIORITY,
        help_text="Never: it never preempts others to start (it may still be preempted, as `preemptible` says).",
    )
    topology_required = models.CharField(max_length=50, blank=True)
    topology_preferred = models.CharField(max_length=50, blank=True)
    expected_duration_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Queried by the composite indexes below, which start with it.
    state = models.CharField(max_length=20, choices=State.choices, default=State.SUBMITTED)
    approval = models.CharField(max_length=12, choices=ApprovalState.choices, default=ApprovalState.NOT_REQUIRED)
    # Not indexed (nor chosen_device_class and evicted_for): nothing lists workloads by them but the
    # rare deletion of what they point to, and every state change would rewrite their index entries.
    approval_decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="approval_decisions",
        db_index=False,
    )
    approval_decided_at = models.DateTimeField(null=True, blank=True)
    approval_comment = models.TextField(blank=True)
    submitted_at = models.DateTimeField(default=timezone.now, db_index=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    chosen_device_class = models.ForeignKey(
        "policy.DeviceClass",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        # As Allocation.device_class: the admission's UPDATE sets it on 20,000 rows at once, and the
        # class comes from the snapshot; Django still protects a class in use from deletion.
        db_constraint=False,
        help_text="The device class the cycle chose from the fallback list.",
    )
    trace_id = models.CharField(max_length=64, blank=True, help_text="Source job when replayed from a trace.")
    # Graceful eviction (issue 5): a cycle that picks this workload as a victim sets these; it keeps its
    # devices while the executor stops it, then is requeued. Cleared when it is admitted again.
    eviction_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="Chosen as a preemption victim and asked to leave."
    )
    evicted_for = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="evictions", db_index=False,
        help_text="The preemptor this workload is (or was last) evicted for.",
    )  # fmt: skip
    eviction_rule = models.CharField(max_length=32, blank=True)
    eviction_message = models.TextField(blank=True)
    preemption_count = models.PositiveIntegerField(
        default=0, help_text="How often it was preempted; a bound (PREEMPTION_MAX_PER_WORKLOAD) then protects it."
    )
    nominated_devices = models.JSONField(
        default=list, blank=True, help_text="Device pks its victims free for it; held for it until it is admitted."
    )
    # Kubernetes 1.36 PodGroup spec.resourceClaims (issue 26): claims the whole gang owns, each allocated
    # once (its allocations have pod set "podgroup:<name>") and reachable from every pod.
    group_claims = models.JSONField(
        default=list,
        blank=True,
        help_text=GROUP_CLAIMS_HELP,
    )

    class Meta:
        ordering = ["submitted_at", "id"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="workload_unique_name_per_team")]
        indexes = [
            models.Index(fields=["name"], name="workload_name"),
            # Queue first: it serves a queue's workloads in one state and all of them (a queue's deletion,
            # the queue filter); a state across queues reads workload_state_submitted.
            models.Index(fields=["queue", "state"], name="workload_queue_state"),
            # The API's lists by state in submission order read a page off this index, no sort.
            models.Index(fields=["state", "submitted_at", "id"], name="workload_state_submitted"),
            # The waiting ones in submission order (the queue's list): PostgreSQL took the page of the
            # 20,000 pending off submitted_at's index instead, filtering by state, as if they were spread
            # evenly through the 70,000 rows it walks in that order; they are the newest, at its far end
            # (45 ms against 1 ms). Partial: an admission's rewritten row adds no entry.
            models.Index(
                fields=["submitted_at", "id"],
                condition=Q(state__in=sorted(WAITING_STATES)),
                name="workload_waiting_submitted",
            ),
            # Partial: only the few workloads being evicted have an entry, so the 20,000 rows an admission
            # or a start rewrites add none.
            models.Index(
                fields=["eviction_requested_at"],
                condition=Q(eviction_requested_at__isnull=False),
                name="workload_evicting",
            ),
        ]

    def __str__(self):
        return f"{self.team.name}/{self.name}"

    @property
    def total_devices(self):
        """Devices its pods ask, plus its group claims' devices once (the fewest each can take)."""
        pods = sum(pod_set.replicas * pod_set.devices_per_pod for pod_set in self.pod_sets.all())
        return pods + sum(group_claim_devices(claim) for claim in self.group_claims or ())

    @property
    def holds_devices(self):
        return self.state in HOLDING_STATES

    @property
    def evicting(self):
        return self.eviction_requested_at is not None and self.state in HOLDING_STATES

    def transition(self, target, actor=None, reason="", at=None):
        """Move to `target` if the state machine allows it; records and returns the transition."""
        if not can_transition(self.state, target):
            raise InvalidTransition(self.state, target)
        at = at or timezone.now()
        previous = self.state
        self.state = target
        self.state_changed_at = at
        if target == State.ADMITTED:
            self.admitted_at = at
        elif target == State.RUNNING:
            self.started_at = at
        elif target in (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.REJECTED, State.PREEMPTED):
            self.finished_at = at
        elif target == State.PENDING:
            self.finished_at = None
        self.save()
        return WorkloadTransition.objects.create(
            workload=self, from_state=previous, to_state=target, at=at, actor=actor, reason=reason
        )


class PodSet(models.Model):
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="pod_sets")
    name = models.SlugField(max_length=63, default="main")
    replicas = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    min_count = models.PositiveIntegerField(null=True, blank=True, help_text="Gang size; empty means all replicas.")
    devices_per_pod = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    device_classes = models.JSONField(
        default=list, blank=True, help_text="Device class names in fallback order; empty: the resource class's."
    )
    match_attribute = models.CharField(max_length=100, blank=True)
    tolerations = models.JSONField(default=list, blank=True)
    claim = models.JSONField(
        default=dict,
        blank=True,
        help_text="Each pod's claim as resource.k8s.io/v1 writes it (requests, constraints); empty: "
        "devices_per_pod devices of the device classes.",
    )
    capacity = models.JSONField(
        default=dict,
        blank=True,
        help_text="What each pod takes of each of its devices when its resource class shares them (TimeSliced), "
        'as DRA\'s ExactDeviceRequest capacity.requests writes it, e.g. {"memory": "20Gi"}; empty: devices whole.',
    )

    class Meta:
        ordering = ["workload", "id"]
        constraints = [models.UniqueConstraint(fields=["workload", "name"], name="podset_unique_name")]

    def __str__(self):
        return f"{self.workload}:{self.name}"

    @property
    def gang_size(self):
        return self.min_count or self.replicas


class WorkloadTransition(models.Model):
    # No database constraint (Django still cascades on delete): every writer records the transition of a
    # row it has just updated or locked in the same transaction (executor.move after its locking read or
    # checked UPDATE, Workload.transition after save), so the row is there; checked row by row, the
    # constraint cost a 20,000-admission commit ~90 ms for nothing.
    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="transitions", db_constraint=False)
    from_state = models.CharField(max_length=20, choices=State.choices)
    to_state = models.CharField(max_length=20, choices=State.choices)
    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, db_index=False
    )
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]
        # Partial: the cycle's and the executor's transitions (tens of thousands a cycle) have no actor,
        # so they add no entry; a person's have one, found when that user is deleted.
        indexes = [
            models.Index(fields=["actor"], condition=Q(actor__isnull=False), name="workloadtransition_actor"),
        ]


class SchedulingCycle(models.Model):
    class Outcome(models.TextChoices):
        RUNNING = "Running"
        COMMITTED = "Committed"
        REFUSED = "Refused", "Refused: snapshot went stale"
        FAILED = "Failed"

    cluster = models.SlugField(default="default")
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.RUNNING)
    generation = models.BigIntegerField(default=0, help_text="Inventory generation of the snapshot.")
    load_ms = models.FloatField(default=0)
    decide_ms = models.FloatField(default=0)
    commit_ms = models.FloatField(default=0)
    pending_count = models.PositiveIntegerField(default=0)
    admitted_count = models.PositiveIntegerField(default=0)
    preempted_count = models.PositiveIntegerField(default=0)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self):
        return f"cycle {self.pk} ({self.outcome})"

    @property
    def duration_ms(self):
        return self.load_ms + self.decide_ms + self.commit_ms


class Allocation(models.Model):
    """A device held by a workload's pod, whole, or a share of it (`consumed_capacity`) when the device
    allows several allocations. A device has at most one active whole allocation, ever, and never one
    beside shares: the partial unique index below makes the database refuse a second whole one, and on
    PostgreSQL triggers (migration 0022) refuse a share of a device that allows none and a share beside
    a whole allocation. That the shares never sum past the capacity the cycle's commit checks."""

    # What an allocation is, so the database refuses an allocation of a missing workload or device and the
    # deletion of an allocated one, as a foreign key would; but by statement triggers (migration 0016,
    # "allocation_references"), which check a statement's rows as one set. A foreign key checks (and
    # share-locks) the referenced row of each new row: a 20,000-admission commit (25,000 allocations)
    # spent 230 ms in those checks, and 40 ms in the set's. What the row locks were for, the cycle's
    # commit has already: it holds each admitted workload's row (its UPDATE) and the inventory revision
    # row, which every inventory write waits for, so a deletion that starts meanwhile runs after the
    # commit, and its trigger then sees the new allocations.
    workload = models.ForeignKey(Workload, on_delete=models.PROTECT, related_name="allocations", db_constraint=False)
    device = models.ForeignKey(
        "inventory.Device", on_delete=models.PROTECT, related_name="allocations", db_constraint=False
    )
    # No database constraint on the class and the cycle (Django still applies PROTECT and SET_NULL on
    # delete): the commit takes both from rows it read or wrote itself, and PostgreSQL checks each
    # constraint row by row. With them, a 20,000-admission commit spent 1.3 s in such checks; these two
    # (and the cycle columns of the explanation tables) were half of it.
    # Nor indexed: only a class's (rare) deletion looks allocations up by it, and the last cycle's
    # admissions are read from its history rows (ExplanationChange.cycle), not from here.
    device_class = models.ForeignKey(
        "policy.DeviceClass", on_delete=models.PROTECT, related_name="allocations", db_constraint=False,
        db_index=False,
    )  # fmt: skip
    pod_set = models.CharField(max_length=63)
    pod_index = models.PositiveIntegerField()
    cycle = models.ForeignKey(
        SchedulingCycle, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False,
        db_index=False,
    )  # fmt: skip
    allocated_at = models.DateTimeField(default=timezone.now)
    # DRA's consumedCapacity: {capacity: amount} this pod takes of the device when it shares it (a
    # time-sliced GPU's memory); None: it holds the device whole.
    consumed_capacity = models.JSONField(null=True, blank=True)
    # What a share bills and reports as (accounting.device_share), in millionths of the device: fixed
    # when the allocation is made, against the capacity the device published then, as DRA keeps an
    # allocation's consumedCapacity when a driver republishes its device. None for a whole device.
    share_millionths = models.PositiveIntegerField(
        null=True, blank=True, help_text="The share of its device this allocation takes, in millionths."
    )
    # Indexed where set only (Meta.indexes): an admission's new rows have none, and the active ones are
    # found through allocation_one_whole_per_device, whose condition is released_at IS NULL.
    released_at = models.DateTimeField(null=True, blank=True)
    # Shrinking (Pod disruption mode): this pod was chosen to leave so `evicted_for` can start; its
    # workload runs on with its other pods. The device stays held until the executor has stopped the pod.
    eviction_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="This pod was preempted (its workload shrunk) and is shutting down."
    )
    evicted_for = models.ForeignKey(
        Workload, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False,
        db_index=False, help_text="The preemptor this pod leaves for.",
    )  # fmt: skip

    class Meta:
        ordering = ["allocated_at", "id"]
        # Partial, both: an admission's new rows (25,000 in a 20,000-admission cycle) add no entry to either.
        indexes = [
            models.Index(
                fields=["eviction_requested_at"],
                condition=Q(eviction_requested_at__isnull=False, released_at__isnull=True),
                name="allocation_evicting",
            ),
            # Finance's windows: what was released after a given instant.
            models.Index(fields=["released_at"], condition=Q(released_at__isnull=False), name="allocation_released"),
            # The active shares: few, and what the sharing triggers and the commit's capacity check look at.
            models.Index(
                fields=["device"],
                condition=Q(released_at__isnull=True, consumed_capacity__isnull=False),
                name="allocation_active_shares",
            ),
        ]
        constraints = [
            # Keyed (device, 0) for a whole allocation and (device, its id) for a share: one whole holder of
            # a device, any number of shares. Still every active allocation's index (released_at IS NULL).
            models.UniqueConstraint(
                F("device"),
                Case(
                    When(consumed_capacity__isnull=True, then=Value(0)),
                    default=F("id"),
                    output_field=models.BigIntegerField(),
                ),
                condition=Q(released_at__isnull=True),
                name="allocation_one_whole_per_device",
            ),
            models.CheckConstraint(
                condition=Q(released_at__isnull=True) | Q(released_at__gte=models.F("allocated_at")),
                name="allocation_released_after_allocated",
            ),
        ]

    def __str__(self):
        return f"{self.device} -> {self.workload}"

    def save(self, *args, **kwargs):
        # A share written by hand (the admin, a script) is fixed as the cycle's commit fixes those it
        # writes: against the capacity its device publishes now.
        if self.consumed_capacity is not None and self.share_millionths is None:
            self.share_millionths = accounting.share_millionths(
                quantities.numbers(self.device.capacity), quantities.numbers(self.consumed_capacity)
            )
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "share_millionths"}
        super().save(*args, **kwargs)

    @property
    def active(self):
        return self.released_at is None


class Explanation(models.Model):
    """The latest word on why a workload is not admitted (one row per workload)."""

    # Checked by statement triggers, not a foreign key (migration 0017): a key checks and share-locks the
    # workload of each new row one by one: 0.1-0.2 s of a refill's commit for its 17,000 new explanations.
    workload = models.OneToOneField(Workload, on_delete=models.CASCADE, related_name="explanation", db_constraint=False)
    # Unconstrained in the database, as Allocation.cycle: written in bulk by the cycle that names itself.
    # Unindexed too: nothing lists explanations by the cycle that last wrote them (the "changed in the last
    # cycle" list reads ExplanationChange), and each of a refill's 17,000 new rows paid for the entry.
    cycle = models.ForeignKey(
        SchedulingCycle,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    # Indexed by Meta.indexes: a reason code is filtered by equality, never by LIKE, so no pattern copy.
    reason = models.CharField(max_length=32)
    # StoredJSONField: written in bulk by every cycle, never queried by key.
    secondary = StoredJSONField(default=list, blank=True)
    message = models.TextField()
    details = StoredJSONField(default=dict, blank=True)
    position_in_queue = models.PositiveIntegerField(null=True, blank=True)
    position_in_cluster = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    suggestions = StoredJSONField(default=list, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # db_default: rows written without it (a COPY naming other columns, before the migration) are empty.
    fingerprint = models.CharField(
        max_length=32, blank=True, db_default="", help_text="Digest of what the cycle compares; empty: compare as new."
    )

    class Meta:
        indexes = [models.Index(fields=["reason"], name="explanation_reason")]

    def __str__(self):
        return f"{self.workload}: {self.reason}"

    def save(self, *args, **kwargs):
        # Only the cycle's commit (bulk writes, no save()) knows the fingerprint of what it writes. Content
        # saved any other way must not keep the old one, or the next cycle would take it for its own.
        self.fingerprint = ""
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], "fingerprint"}
        super().save(*args, **kwargs)


class ExplanationChange(models.Model):
    """Compact history: a row only when the reason or message changes, not one per cycle."""

    # Unconstrained in the database, as WorkloadTransition.workload and for the same reason: a history row
    # is written beside a change its workload's row has just had (an admission, eviction or start) or
    # beside its Explanation, whose insert trigger refuses a cycle that explains a workload deleted since
    # its snapshot.
    workload = models.ForeignKey(
        Workload, on_delete=models.CASCADE, related_name="explanation_history", db_constraint=False
    )
    # Unconstrained in the database, as Allocation.cycle.
    cycle = models.ForeignKey(
        SchedulingCycle, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_constraint=False
    )
    reason = models.CharField(max_length=32)
    message = models.TextField()
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]
