from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from broker.api.mixins import AuditedWritesMixin
from broker.api.permissions import IsOperator, ReadAnyRoleWriteOperator
from broker.api.serializers import ReasonSerializer
from broker.inventory import filtersets, services
from broker.inventory.api import serializers
from broker.inventory.models import Device, Domain, Health, Node, TopologyLevel


class InventoryViewSet(AuditedWritesMixin, viewsets.ModelViewSet):
    permission_classes = [ReadAnyRoleWriteOperator]


class TopologyLevelViewSet(InventoryViewSet):
    queryset = TopologyLevel.objects.all()
    serializer_class = serializers.TopologyLevelSerializer
    filterset_class = filtersets.TopologyLevelFilterSet
    ordering_fields = ["order", "name"]
    search_fields = ["name"]


class DomainViewSet(InventoryViewSet):
    queryset = Domain.objects.select_related("level", "parent__level")
    serializer_class = serializers.DomainSerializer
    filterset_class = filtersets.DomainFilterSet
    ordering_fields = ["level__order", "name"]
    search_fields = ["name"]


class NodeViewSet(InventoryViewSet):
    queryset = Node.objects.prefetch_related("devices")
    serializer_class = serializers.NodeSerializer
    filterset_class = filtersets.NodeFilterSet
    ordering_fields = ["name", "created", "cordoned"]
    search_fields = ["name", "domain__name"]

    def operator_action(self, request, cordoned):
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        node = services.set_cordoned(self.get_object(), request.user, cordoned, body.validated_data["reason"])
        return Response(self.get_serializer(node).data)

    @extend_schema(request=ReasonSerializer, responses=serializers.NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def cordon(self, request, pk=None):
        """Take no new allocations on this node (running work stays)."""
        return self.operator_action(request, cordoned=True)

    @extend_schema(request=ReasonSerializer, responses=serializers.NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def uncordon(self, request, pk=None):
        return self.operator_action(request, cordoned=False)


class DeviceViewSet(InventoryViewSet):
    queryset = Device.objects.select_related("node")
    serializer_class = serializers.DeviceSerializer
    filterset_class = filtersets.DeviceFilterSet
    ordering_fields = ["node__name", "name", "health"]
    search_fields = ["name", "node__name", "pool", "driver"]

    def health_action(self, request, health):
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        device = services.set_health(self.get_object(), request.user, health, body.validated_data["reason"])
        return Response(self.get_serializer(device).data)

    @extend_schema(request=ReasonSerializer, responses=serializers.DeviceSerializer)
    @action(detail=True, methods=["post"], url_path="mark-unhealthy", permission_classes=[IsOperator])
    def mark_unhealthy(self, request, pk=None):
        return self.health_action(request, Health.UNHEALTHY)

    @extend_schema(request=ReasonSerializer, responses=serializers.DeviceSerializer)
    @action(detail=True, methods=["post"], url_path="mark-healthy", permission_classes=[IsOperator])
    def mark_healthy(self, request, pk=None):
        return self.health_action(request, Health.HEALTHY)
