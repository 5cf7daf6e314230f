"""GET /api/metrics/: the same figures as /metrics, as JSON, for operators, finance and admins."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.metrics import checkpoint, queries
from broker.metrics.api.serializers import MetricsSerializer
from broker.policy import roles


class ReadsMetrics(BasePermission):
    """Operators and finance (has_role lets admins through); the figures name every team."""

    message = "Only operators, finance and admins read the cluster's metrics."

    def has_permission(self, request, view):
        return roles.is_operator(request.user) or roles.is_finance(request.user)


def mean(row):
    return row["sum_seconds"] / row["count"] if row["count"] else 0.0


def waits(rows):
    return [
        {**row, "mean_seconds": mean(row), "buckets": [{"le": le, "count": n} for le, n in row["buckets"]]}
        for row in rows
    ]


def report(now):
    history = checkpoint.history(now)
    return {
        "generated_at": now,
        "pending": {
            "now": queries.pending_now(),
            "waits": waits(history["waits"]),
            "seconds_by_reason": history["seconds_by_reason"],
            "workloads_by_reason": history["workloads_by_reason"],
        },
        "wrong_class": history["wrong_class"],
        "stranded": {"latest": queries.latest_capacity(), "device_seconds": queries.stranded_device_seconds(now)},
        "manual_interventions": queries.manual_interventions(),
        "runtime_by_span": [{**row, "mean_seconds": mean(row)} for row in queries.runtime_by_span()],
        "cycles": {
            "by_outcome": queries.cycles_by_outcome(),
            "last": queries.last_cycle(),
            "decide": queries.decide_time_totals(),
        },
        "devices": queries.devices_by_health(),
        "workloads": queries.workloads_by_state(),
    }


class MetricsView(APIView):
    """How often and how long work pends and why, wrong-class requests, stranded capacity, manual
    interventions, placement span against runtime, and cycle health."""

    permission_classes = [ReadsMetrics]

    @extend_schema(responses=MetricsSerializer)
    def get(self, request):
        return Response(MetricsSerializer(report(timezone.now())).data)
