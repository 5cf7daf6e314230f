from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from broker.api.serializers import ValidatedModelSerializer
from broker.inventory.models import Device, Domain, Node, TopologyLevel, validate_taints


class TopologyLevelSerializer(ValidatedModelSerializer):
    class Meta:
        model = TopologyLevel
        fields = ["id", "name", "order"]


class DomainSerializer(ValidatedModelSerializer):
    level = serializers.SlugRelatedField(slug_field="name", queryset=TopologyLevel.objects.all())
    path = serializers.SerializerMethodField(help_text="{level: domain name} from this domain up to the root.")

    class Meta:
        model = Domain
        fields = ["id", "level", "name", "parent", "path"]

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
    def get_path(self, domain):
        return domain.path()


class NodeSerializer(ValidatedModelSerializer):
    device_count = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["id", "name", "domain", "labels", "shared_counters", "cordoned", "device_count", "created", "updated"]
        # Cordoning is a manual intervention with its own audited actions (/cordon/, /uncordon/).
        read_only_fields = ["cordoned"]

    @extend_schema_field(OpenApiTypes.INT)
    def get_device_count(self, node):
        return len(node.devices.all())

    def validate_labels(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Labels must be an object of name: value.")
        return value


class DeviceSerializer(ValidatedModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", queryset=Node.objects.all())
    qualified_name = serializers.CharField(read_only=True, help_text="node/device")

    class Meta:
        model = Device
        fields = [
            "id",
            "node",
            "qualified_name",
            "driver",
            "pool",
            "name",
            "attributes",
            "capacity",
            "health",
            "taints",
            "parent",
            "consumes_counters",
            "allow_multiple_allocations",
        ]
        # Health changes by hand are manual interventions with their own audited actions.
        read_only_fields = ["health"]

    def validate_taints(self, value):
        error = validate_taints(value)
        if error:
            raise serializers.ValidationError(error)
        return value
