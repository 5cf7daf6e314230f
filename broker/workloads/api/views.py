from django.db.models import F
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from broker.api.mixins import DomainErrorsMixin
from broker.api.permissions import (
    CancelsWorkload,
    IsApprover,
    IsBrokerUser,
    IsOperator,
    ReadsWorkloads,
    SubmitsWorkloads,
)
from broker.api.serializers import ReasonSerializer
from broker.policy import roles
from broker.workloads import filtersets, services
from broker.workloads.api import serializers
from broker.workloads.models import Allocation, Explanation, SchedulingCycle, Workload
from broker.workloads.states import WAITING_STATES


def visible_to(queryset, user, team_field="team_id"):
    """Team members see their own teams' rows; operators, approvers and admins see every team's."""
    if roles.sees_all_workloads(user):
        return queryset
    return queryset.filter(**{f"{team_field}__in": roles.team_ids(user)})


class WorkloadViewSet(
    DomainErrorsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Workloads change only through submission and the actions below, never by PUT or DELETE."""

    queryset = Workload.objects.select_related(
        "team", "queue", "resource_class", "submitted_by", "approval_decided_by", "chosen_device_class", "explanation"
    ).prefetch_related("pod_sets")
    serializer_class = serializers.WorkloadSerializer
    permission_classes = [ReadsWorkloads]
    filterset_class = filtersets.WorkloadFilterSet
    ordering_fields = ["submitted_at", "priority", "name", "state_changed_at"]
    search_fields = ["name", "team__name", "queue__name", "trace_id"]

    def get_queryset(self):
        return visible_to(super().get_queryset(), self.request.user)

    def get_permissions(self):
        if self.action == "create":
            return [SubmitsWorkloads()]
        return super().get_permissions()

    def workload_response(self, workload, status_code=status.HTTP_200_OK):
        return Response(self.get_serializer(self.get_queryset().get(pk=workload.pk)).data, status=status_code)

    @extend_schema(
        request=serializers.WorkloadSubmissionSerializer, responses={201: serializers.SubmittedWorkloadSerializer}
    )
    def create(self, request, *args, **kwargs):
        submission = serializers.WorkloadSubmissionSerializer(data=request.data, context={"request": request})
        submission.is_valid(raise_exception=True)
        workload = submission.save()
        response = self.workload_response(workload, status.HTTP_201_CREATED)
        # Wrong-class advice (broker.governance.guidance): said once, at submission.
        response.data["guidance"] = workload.guidance
        return response

    @extend_schema(request=ReasonSerializer, responses=serializers.WorkloadSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CancelsWorkload])
    def cancel(self, request, pk=None):
        """Cancel the workload and release every device it holds."""
        body = ReasonSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        workload = services.cancel_workload(self.get_object(), request.user, body.validated_data["reason"])
        return self.workload_response(workload)

    @extend_schema(request=serializers.DecisionSerializer, responses=serializers.WorkloadSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsApprover])
    def approve(self, request, pk=None):
        body = serializers.DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        workload = services.approve_workload(self.get_object(), request.user, body.validated_data["comment"])
        return self.workload_response(workload)

    @extend_schema(request=serializers.DecisionSerializer, responses=serializers.WorkloadSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsApprover])
    def reject(self, request, pk=None):
        body = serializers.DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        workload = services.reject_workload(self.get_object(), request.user, body.validated_data["comment"])
        return self.workload_response(workload)

    @extend_schema(request=serializers.PriorityChangeSerializer, responses=serializers.WorkloadSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOperator])
    def priority(self, request, pk=None):
        """An operator's override of the workload's priority."""
        body = serializers.PriorityChangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        workload = services.change_priority(self.get_object(), request.user, **body.validated_data)
        return self.workload_response(workload)


class AllocationViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Allocation.objects.select_related("workload__team", "device__node", "device_class")
    serializer_class = serializers.AllocationSerializer
    permission_classes = [ReadsWorkloads]
    filterset_class = filtersets.AllocationFilterSet
    ordering_fields = ["allocated_at", "released_at"]
    search_fields = ["workload__name", "device__node__name"]

    def get_queryset(self):
        return visible_to(super().get_queryset(), self.request.user, team_field="workload__team_id")


class ExplanationViewSet(viewsets.ReadOnlyModelViewSet):
    """The pending-workloads view: every waiting workload, why it waits, and where it stands in line."""

    queryset = Explanation.objects.select_related("workload__team", "workload__queue", "workload__resource_class")
    serializer_class = serializers.ExplanationSerializer
    permission_classes = [ReadsWorkloads]
    filterset_class = filtersets.ExplanationFilterSet
    ordering_fields = ["position_in_queue", "position_in_cluster", "estimated_start", "updated_at"]
    search_fields = ["workload__name", "message"]

    def get_queryset(self):
        queryset = super().get_queryset().filter(workload__state__in=WAITING_STATES)
        queryset = visible_to(queryset, self.request.user, team_field="workload__team_id")
        return queryset.order_by(
            F("position_in_cluster").asc(nulls_last=True),
            F("position_in_queue").asc(nulls_last=True),
            "workload__submitted_at",
            "workload_id",
        )

    def paginate_queryset(self, queryset):
        # The page is sorted and cut on ids, then read whole: sorting the rows themselves made PostgreSQL
        # carry every pending workload's explanation, JSON and all, through the sort to keep fifty.
        page = super().paginate_queryset(queryset.values_list("pk", flat=True))
        if page is None:
            return None
        rows = queryset.in_bulk(page)
        return [rows[pk] for pk in page if pk in rows]


class SchedulingCycleViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = SchedulingCycle.objects.all()
    serializer_class = serializers.SchedulingCycleSerializer
    permission_classes = [IsBrokerUser]
    filterset_class = filtersets.SchedulingCycleFilterSet
    ordering_fields = ["started_at", "decide_ms", "pending_count"]
