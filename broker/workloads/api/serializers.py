from functools import cached_property

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from broker import limits
from broker.api.serializers import StrictSerializer
from broker.policy.models import Queue, ResourceClass
from broker.scheduler import accounting
from broker.workloads import services
from broker.workloads.models import (
    Allocation,
    DisruptionMode,
    Explanation,
    PodSet,
    PreemptionPolicy,
    SchedulingCycle,
    Workload,
)


class PodSetSerializer(serializers.ModelSerializer):
    gang_size = serializers.IntegerField(read_only=True)

    class Meta:
        model = PodSet
        fields = [
            "name", "replicas", "min_count", "gang_size", "devices_per_pod", "device_classes", "match_attribute",
            "claim", "capacity",
        ]  # fmt: skip


class WorkloadExplanationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Explanation
        fields = [
            "reason",
            "secondary",
            "message",
            "details",
            "position_in_queue",
            "position_in_cluster",
            "estimated_start",
            "suggestions",
            "updated_at",
        ]


class WorkloadSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    queue = serializers.SlugRelatedField(slug_field="name", read_only=True)
    # The optional relations are null when unset: said so in the schema, which generated clients follow.
    resource_class = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True, help_text="Its resource class; null when it names none."
    )
    chosen_device_class = serializers.SlugRelatedField(
        slug_field="name",
        read_only=True,
        allow_null=True,
        help_text="The device class it was admitted with (of its fallback list); null until it is admitted.",
    )
    submitted_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="Who submitted it; null if unknown or since deleted.",
    )
    approval_decided_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="Who approved or rejected it; null while undecided or if it needed no approval.",
    )
    total_devices = serializers.IntegerField(read_only=True)
    pod_sets = PodSetSerializer(many=True, read_only=True)
    explanation = serializers.SerializerMethodField(help_text="Why it is not admitted yet, when it is waiting.")

    class Meta:
        model = Workload
        fields = [
            "id",
            "name",
            "team",
            "queue",
            "resource_class",
            "submitted_by",
            "priority",
            "disruption_mode",
            "preemption_policy",
            "preemptible",
            "preemption_count",
            "topology_required",
            "topology_preferred",
            "expected_duration_seconds",
            "state",
            "approval",
            "approval_decided_by",
            "approval_decided_at",
            "approval_comment",
            "submitted_at",
            "state_changed_at",
            "admitted_at",
            "started_at",
            "finished_at",
            "chosen_device_class",
            "total_devices",
            "pod_sets",
            "group_claims",
            "explanation",
            "trace_id",
        ]
        read_only_fields = fields

    @extend_schema_field(WorkloadExplanationSerializer(allow_null=True))
    def get_explanation(self, workload):
        try:
            explanation = workload.explanation
        except Explanation.DoesNotExist:
            return None
        return self.explanation_serializer.to_representation(explanation)

    @cached_property
    def explanation_serializer(self):
        # One for the whole list (a list's rows share this serializer): a ModelSerializer made per row
        # introspected the model again for each, and left its fields, bound to it, as cyclic garbage.
        return WorkloadExplanationSerializer(context=self.context)


class GuidanceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["cheaper_class", "smaller_class", "rarely_succeeds"])
    resource_class = serializers.CharField()
    message = serializers.CharField()


class SubmittedWorkloadSerializer(WorkloadSerializer):
    """The answer to a submission: the workload, and advice when another class would suit it better."""

    guidance = GuidanceSerializer(many=True, read_only=True)

    class Meta(WorkloadSerializer.Meta):
        fields = [*WorkloadSerializer.Meta.fields, "guidance"]
        read_only_fields = fields


class PodSetRequestSerializer(StrictSerializer):
    name = serializers.SlugField(max_length=63, default="main")
    replicas = serializers.IntegerField(min_value=1, max_value=limits.REPLICAS_MAX)
    min_count = serializers.IntegerField(
        min_value=1,
        max_value=limits.REPLICAS_MAX,
        required=False,
        allow_null=True,
        help_text="Gang size: pods that must start together.",
    )
    devices_per_pod = serializers.IntegerField(
        min_value=1,
        max_value=limits.DEVICES_PER_POD_MAX,
        required=False,
        help_text="Required unless `claim` says the devices.",
    )
    device_classes = serializers.ListField(
        child=serializers.SlugField(max_length=63),
        required=False,
        default=list,
        max_length=limits.DEVICE_CLASSES_PER_POD_SET_MAX,
        help_text="Fallback order; default: the class's.",
    )
    match_attribute = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)
    claim = serializers.JSONField(
        required=False,
        default=dict,
        help_text="Each pod's claim as resource.k8s.io/v1 ResourceClaim spec.devices writes it: `requests` "
        "(each `exactly` {deviceClassName, allocationMode, count, selectors} or `firstAvailable` sub-requests "
        "in order of preference; allocationMode All, without count, takes every matching device of the pod's "
        "node) and `constraints` ({requests, matchAttribute} or {requests, distinctAttribute} across them). "
        "Instead of devices_per_pod, device_classes and match_attribute.",
    )
    capacity = serializers.DictField(
        child=serializers.CharField(max_length=32),
        required=False,
        default=dict,
        help_text="What each pod takes of each of its devices when its resource class shares them (sharing "
        'TimeSliced), as DRA\'s ExactDeviceRequest capacity.requests writes it, e.g. {"memory": "20Gi"}; '
        "empty: devices whole.",
    )

    def validate(self, attrs):
        if "devices_per_pod" not in attrs:
            if not attrs.get("claim"):
                raise serializers.ValidationError({"devices_per_pod": ["This field is required."]})
            attrs["devices_per_pod"] = 1
        return attrs


class GroupClaimRequestSerializer(StrictSerializer):
    """A claim the whole gang owns (Kubernetes 1.36 PodGroup spec.resourceClaims): allocated once, its
    devices used by every pod, which may only go where they are reachable (a node-local device pins the
    gang to its node; one with the attribute `reach: rack` to its rack)."""

    name = serializers.RegexField(
        r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63, help_text="A DNS label, unique in the workload."
    )
    requests = serializers.ListField(
        child=serializers.JSONField(),
        allow_empty=False,
        max_length=limits.POD_SETS_MAX,
        help_text="As a ResourceClaim's spec.devices.requests: each `exactly` {deviceClassName, allocationMode, "
        "count, selectors} or `firstAvailable` sub-requests (allocationMode All: every matching device the "
        "gang's pods all reach).",
    )
    constraints = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        default=list,
        max_length=limits.POD_SETS_MAX,
        help_text="As spec.devices.constraints: {requests, matchAttribute} or {requests, distinctAttribute} "
        "across its requests.",
    )


class WorkloadSubmissionSerializer(StrictSerializer):
    """A request for capacity: a gang of pod sets in a resource class, submitted to a queue."""

    name = serializers.SlugField(max_length=100)
    queue = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Queue.objects.select_related("team"),
        required=False,
        help_text="Default: your team's queue, when you are in one team.",
    )
    resource_class = serializers.SlugRelatedField(
        slug_field="name", queryset=ResourceClass.objects.select_related("priority_class")
    )
    pod_sets = PodSetRequestSerializer(many=True, allow_empty=False, max_length=limits.POD_SETS_MAX)
    priority = serializers.IntegerField(
        min_value=limits.PRIORITY_MIN,
        max_value=limits.PRIORITY_MAX,
        required=False,
        help_text="Default: the class's priority.",
    )
    disruption_mode = serializers.ChoiceField(choices=DisruptionMode.choices, required=False)
    preemption_policy = serializers.ChoiceField(
        choices=PreemptionPolicy.choices,
        required=False,
        help_text="Never: it never preempts others to start and waits for room instead. Default: PreemptLowerPriority.",
    )
    topology_required = serializers.CharField(max_length=50, required=False, allow_blank=True)
    topology_preferred = serializers.CharField(max_length=50, required=False, allow_blank=True)
    expected_duration_seconds = serializers.IntegerField(
        min_value=1, max_value=limits.EXPECTED_DURATION_MAX_SECONDS, required=False, allow_null=True
    )
    group_claims = GroupClaimRequestSerializer(
        many=True, required=False, default=list, max_length=limits.GROUP_CLAIMS_MAX,
        help_text="Claims the whole gang owns, each allocated once for all its pods.",
    )  # fmt: skip

    def validate(self, attrs):
        actor = self.context["request"].user
        queue = attrs.get("queue") or services.default_queue(actor)
        if queue is None:
            raise serializers.ValidationError({"queue": ["Name a queue: you are not in exactly one team's queue."]})
        submission = services.Submission(
            name=attrs["name"],
            queue=queue,
            resource_class=attrs["resource_class"],
            pod_sets=tuple(
                services.PodSetRequest(**{**pod_set, "device_classes": tuple(pod_set["device_classes"])})
                for pod_set in attrs["pod_sets"]
            ),
            priority=attrs.get("priority"),
            disruption_mode=attrs.get("disruption_mode", ""),
            preemption_policy=attrs.get("preemption_policy", ""),
            topology_required=attrs.get("topology_required"),
            topology_preferred=attrs.get("topology_preferred"),
            expected_duration_seconds=attrs.get("expected_duration_seconds"),
            group_claims=tuple(
                {"name": claim["name"], "requests": claim["requests"], "constraints": claim["constraints"]}
                for claim in attrs.get("group_claims", ())
            ),
        )
        errors = services.submission_errors(submission, actor)
        if errors:
            raise serializers.ValidationError(errors)
        return {"submission": submission}

    def create(self, validated_data):
        return services.submit_workload(validated_data["submission"], self.context["request"].user)


class DecisionSerializer(StrictSerializer):
    comment = serializers.CharField(max_length=5000, help_text="Mandatory: why it was approved or rejected.")


class PriorityChangeSerializer(StrictSerializer):
    priority = serializers.IntegerField(min_value=limits.PRIORITY_MIN, max_value=limits.PRIORITY_MAX)
    reason = serializers.CharField(
        max_length=limits.REASON_MAX_LENGTH, help_text="Mandatory: a manual intervention says why."
    )


class AllocationSerializer(serializers.ModelSerializer):
    workload_name = serializers.CharField(source="workload.name", read_only=True)
    team = serializers.CharField(source="workload.team.name", read_only=True)
    device_name = serializers.CharField(source="device.qualified_name", read_only=True)
    node = serializers.CharField(source="device.node.name", read_only=True)
    device_class = serializers.SlugRelatedField(slug_field="name", read_only=True)
    active = serializers.BooleanField(read_only=True)
    share = serializers.SerializerMethodField(
        help_text="The fraction of its device a share of a shared device takes, fixed when it was allocated "
        "(what finance bills); null: the whole device."
    )

    class Meta:
        model = Allocation
        fields = [
            "id",
            "workload",
            "workload_name",
            "team",
            "device",
            "device_name",
            "node",
            "device_class",
            "pod_set",
            "pod_index",
            "cycle",
            "allocated_at",
            "released_at",
            "active",
            "consumed_capacity",
            "share",
            "eviction_requested_at",
            "evicted_for",
        ]
        read_only_fields = fields

    def get_share(self, allocation) -> float | None:
        if allocation.share_millionths is None:
            return None
        return allocation.share_millionths / accounting.SHARE_SCALE


class ExplanationSerializer(serializers.ModelSerializer):
    """One row of the pending-workloads view (Kueue's visibility API, with the reason behind each)."""

    workload_name = serializers.CharField(source="workload.name", read_only=True)
    team = serializers.CharField(source="workload.team.name", read_only=True)
    queue = serializers.CharField(source="workload.queue.name", read_only=True)
    resource_class = serializers.SerializerMethodField()
    priority = serializers.IntegerField(source="workload.priority", read_only=True)
    state = serializers.CharField(source="workload.state", read_only=True)
    submitted_at = serializers.DateTimeField(source="workload.submitted_at", read_only=True)

    class Meta:
        model = Explanation
        fields = [
            "id",
            "workload",
            "workload_name",
            "team",
            "queue",
            "resource_class",
            "priority",
            "state",
            "submitted_at",
            "reason",
            "secondary",
            "message",
            "details",
            "position_in_queue",
            "position_in_cluster",
            "estimated_start",
            "suggestions",
            "cycle",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.STR)
    def get_resource_class(self, explanation):
        resource_class = explanation.workload.resource_class
        return resource_class.name if resource_class else None


class SchedulingCycleSerializer(serializers.ModelSerializer):
    duration_ms = serializers.FloatField(read_only=True)

    class Meta:
        model = SchedulingCycle
        fields = [
            "id",
            "cluster",
            "started_at",
            "finished_at",
            "outcome",
            "generation",
            "load_ms",
            "decide_ms",
            "commit_ms",
            "duration_ms",
            "pending_count",
            "admitted_count",
            "preempted_count",
            "detail",
        ]
        read_only_fields = fields
