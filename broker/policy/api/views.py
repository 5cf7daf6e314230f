from rest_framework import viewsets

from broker.api.mixins import AuditedWritesMixin
from broker.api.permissions import ReadAnyRoleWriteOperator
from broker.policy import filtersets
from broker.policy.api import serializers
from broker.policy.models import Cohort, DeviceClass, PriorityClass, Queue, Reservation, ResourceClass, Team


class PolicyViewSet(AuditedWritesMixin, viewsets.ModelViewSet):
    permission_classes = [ReadAnyRoleWriteOperator]


class TeamViewSet(PolicyViewSet):
    queryset = Team.objects.prefetch_related("members")
    serializer_class = serializers.TeamSerializer
    filterset_class = filtersets.TeamFilterSet
    ordering_fields = ["name"]
    search_fields = ["name", "display_name"]


class PriorityClassViewSet(PolicyViewSet):
    queryset = PriorityClass.objects.all()
    serializer_class = serializers.PriorityClassSerializer
    filterset_class = filtersets.PriorityClassFilterSet
    ordering_fields = ["name", "value"]
    search_fields = ["name", "description"]


class DeviceClassViewSet(PolicyViewSet):
    queryset = DeviceClass.objects.all()
    serializer_class = serializers.DeviceClassSerializer
    filterset_class = filtersets.DeviceClassFilterSet
    ordering_fields = ["name", "price_per_hour"]
    search_fields = ["name", "description", "selector"]


class CohortViewSet(PolicyViewSet):
    queryset = Cohort.objects.select_related("parent")
    serializer_class = serializers.CohortSerializer
    filterset_class = filtersets.CohortFilterSet
    ordering_fields = ["name"]
    search_fields = ["name"]
    manual_intervention = True


class QueueViewSet(PolicyViewSet):
    queryset = Queue.objects.select_related("team", "cohort")
    serializer_class = serializers.QueueSerializer
    filterset_class = filtersets.QueueFilterSet
    ordering_fields = ["name", "fair_share_weight"]
    search_fields = ["name", "team__name"]
    # A quota edit changes who runs next: it is counted as a manual intervention.
    manual_intervention = True


class ResourceClassViewSet(PolicyViewSet):
    queryset = ResourceClass.objects.select_related("priority_class").prefetch_related("allowed_teams")
    serializer_class = serializers.ResourceClassSerializer
    filterset_class = filtersets.ResourceClassFilterSet
    ordering_fields = ["name", "max_devices"]
    search_fields = ["name", "display_name", "description", "cost_label"]


class ReservationViewSet(PolicyViewSet):
    queryset = Reservation.objects.select_related("team", "device_class", "created_by")
    serializer_class = serializers.ReservationSerializer
    filterset_class = filtersets.ReservationFilterSet
    ordering_fields = ["start", "end", "name"]
    search_fields = ["name", "reason", "team__name"]
