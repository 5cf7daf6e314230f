from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework import serializers

from broker.api.serializers import ValidatedModelSerializer
from broker.governance.approvals import cost_threshold
from broker.governance.policy import set_cost_threshold
from broker.inventory.models import Domain
from broker.policy.models import (
    Cohort,
    DeviceClass,
    PriorityClass,
    Queue,
    Reservation,
    ResourceClass,
    ResourceClassDeviceClass,
    Team,
)


class TeamSerializer(ValidatedModelSerializer):
    members = serializers.SlugRelatedField(
        many=True, required=False, slug_field="username", queryset=get_user_model().objects.all()
    )

    class Meta:
        model = Team
        fields = ["id", "name", "display_name", "members"]


class PriorityClassSerializer(ValidatedModelSerializer):
    class Meta:
        model = PriorityClass
        fields = ["id", "name", "value", "description", "preemptible"]


class DeviceClassSerializer(ValidatedModelSerializer):
    class Meta:
        model = DeviceClass
        fields = ["id", "name", "description", "selector", "price_per_hour"]


class CohortSerializer(ValidatedModelSerializer):
    parent = serializers.SlugRelatedField(
        slug_field="name", queryset=Cohort.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = Cohort
        fields = ["id", "name", "parent", "nominal_quota"]


class QueueSerializer(ValidatedModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all())
    cohort = serializers.SlugRelatedField(
        slug_field="name", queryset=Cohort.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = Queue
        fields = [
            "id",
            "name",
            "team",
            "cohort",
            "nominal_quota",
            "borrowing_limit",
            "lending_limit",
            "fair_share_weight",
            "within_queue_preemption",
            "reclaim_within_cohort",
        ]


class CostThresholdField(serializers.DecimalField):
    """The class's approval cost rule (governance.ApprovalPolicy), read and written with the class as
    the menu page does."""

    def get_attribute(self, instance):
        return cost_threshold(instance)


class ResourceClassSerializer(ValidatedModelSerializer):
    cost_threshold_per_hour = CostThresholdField(
        max_digits=12,
        decimal_places=2,
        min_value=0,
        required=False,
        allow_null=True,
        help_text="Requests whose devices cost more than this per hour need approval; null: no cost rule.",
    )
    priority_class = serializers.SlugRelatedField(slug_field="name", queryset=PriorityClass.objects.all())
    device_classes = serializers.ListField(
        source="ordered_device_classes",
        child=serializers.SlugRelatedField(slug_field="name", queryset=DeviceClass.objects.all()),
        required=False,
        help_text="Device class names in fallback order: the first that fits is used.",
    )
    allowed_teams = serializers.SlugRelatedField(
        many=True,
        required=False,
        slug_field="name",
        queryset=Team.objects.all(),
        help_text="Teams entitled to the class; empty means every team.",
    )

    class Meta:
        model = ResourceClass
        fields = [
            "id",
            "name",
            "display_name",
            "description",
            "device_classes",
            "topology_required",
            "topology_preferred",
            "sharing",
            "priority_class",
            "preemptible",
            "preempts_across_queues",
            "checkpoint_restart_seconds",
            "max_devices",
            "max_devices_per_pod",
            "max_duration_seconds",
            "cost_label",
            "approval_required",
            "approval_threshold_devices",
            "cost_threshold_per_hour",
            "allowed_teams",
        ]

    def validate_device_classes(self, value):
        names = [device_class.name for device_class in value]
        if len(set(names)) != len(names):
            raise serializers.ValidationError("A device class may appear once in the fallback order.")
        return value

    def save_device_classes(self, resource_class, device_classes):
        if device_classes is None:
            return
        resource_class.device_class_choices.all().delete()
        ResourceClassDeviceClass.objects.bulk_create(
            ResourceClassDeviceClass(resource_class=resource_class, device_class=device_class, rank=rank)
            for rank, device_class in enumerate(device_classes)
        )

    @transaction.atomic
    def create(self, validated_data):
        device_classes = validated_data.pop("ordered_device_classes", [])
        threshold = validated_data.pop("cost_threshold_per_hour", None)
        resource_class = super().create(validated_data)
        self.save_device_classes(resource_class, device_classes)
        set_cost_threshold(resource_class, threshold)
        return resource_class

    @transaction.atomic
    def update(self, instance, validated_data):
        device_classes = validated_data.pop("ordered_device_classes", None)
        unchanged = object()
        threshold = validated_data.pop("cost_threshold_per_hour", unchanged)
        resource_class = super().update(instance, validated_data)
        self.save_device_classes(resource_class, device_classes)
        if threshold is not unchanged:
            set_cost_threshold(resource_class, threshold)
        return resource_class


class ReservationSerializer(ValidatedModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all())
    device_class = serializers.SlugRelatedField(slug_field="name", queryset=DeviceClass.objects.all())
    domain = serializers.PrimaryKeyRelatedField(queryset=Domain.objects.all(), required=False, allow_null=True)
    created_by = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,
        help_text="Who created it, through the API or by approving a request; null if unknown or since deleted.",
    )

    class Meta:
        model = Reservation
        fields = ["id", "name", "team", "device_class", "count", "domain", "start", "end", "reason", "created_by"]

    def create(self, validated_data):
        request = self.context.get("request")
        if request is not None:
            validated_data["created_by"] = request.user
        return super().create(validated_data)
