"""GET /api/workloads/{id}/explanation/: a workload's latest explanation and its compact history.

The pending-workloads view (/api/explanations/) and the workload detail carry the latest explanation; the
history of changes (ExplanationChange: one row per change of reason or message, plus admissions and
preemptions) had no endpoint. Same visibility as the workload: its team, operators, approvers, admins.
"""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.permissions import ReadsWorkloads
from broker.workloads.api.serializers import WorkloadExplanationSerializer
from broker.workloads.api.views import visible_to
from broker.workloads.models import Explanation, ExplanationChange, Workload


class ExplanationChangeSerializer(serializers.ModelSerializer):
    class Meta:
        model = ExplanationChange
        fields = ["at", "reason", "message", "cycle"]
        read_only_fields = fields


class WorkloadExplanationHistorySerializer(serializers.Serializer):
    workload = serializers.IntegerField()
    state = serializers.CharField()
    explanation = WorkloadExplanationSerializer(allow_null=True, help_text="Null once admitted or never explained.")
    history = ExplanationChangeSerializer(many=True, help_text="Oldest first.")


class WorkloadExplanationView(APIView):
    permission_classes = [ReadsWorkloads]

    @extend_schema(responses=WorkloadExplanationHistorySerializer)
    def get(self, request, pk):
        workload = get_object_or_404(visible_to(Workload.objects.all(), request.user), pk=pk)
        body = {
            "workload": workload.pk,
            "state": workload.state,
            "explanation": Explanation.objects.filter(workload=workload).first(),
            "history": workload.explanation_history.order_by("at", "id"),
        }
        return Response(WorkloadExplanationHistorySerializer(body).data)
