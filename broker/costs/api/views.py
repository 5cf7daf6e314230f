"""The cost API, shaped like OpenCost's allocation API (window, aggregate, step, idle, share_idle)."""

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.permissions import IsBrokerUser
from broker.costs import exports
from broker.costs.api.serializers import (
    AllocationQuerySerializer,
    MonthQuerySerializer,
    PendingQuerySerializer,
    StatementQuerySerializer,
)
from broker.costs.pending import pending_report
from broker.costs.report import allocation_report
from broker.costs.statement import monthly_statement
from broker.costs.ticker import running_cost
from broker.policy import roles
from broker.policy.models import Team


def reads_all_costs(user):
    """Finance, operators and admins read every team's costs (has_role lets admins through both)."""
    return roles.is_finance(user) or roles.is_operator(user)


def sees_workload_detail(user):
    """Queue, resource class and state of a workload line are for those who may read workloads anyway."""
    return roles.sees_all_workloads(user)


class ReadsAllCosts(BasePermission):
    message = "Only finance, operators and admins read cluster-wide costs."

    def has_permission(self, request, view):
        return reads_all_costs(request.user)


def validated(serializer_class, request, **context):
    serializer = serializer_class(data=request.query_params, context={"now": timezone.now(), **context})
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class AllocationView(APIView):
    """GET /api/costs/allocation?window=&aggregate=&step=&idle=&share_idle=&top="""

    permission_classes = [ReadsAllCosts]

    @extend_schema(parameters=[AllocationQuerySerializer], responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        query = validated(AllocationQuerySerializer, request)
        report = allocation_report(
            query["start"],
            query["end"],
            aggregate=query["aggregate"],
            step=query["step"],
            idle=query["idle"],
            share_idle=query["share_idle"],
            now=query["now"],
            workload_detail=sees_workload_detail(request.user),
            top=query.get("top"),
        )
        return Response(report)


class PendingView(APIView):
    """GET /api/costs/pending?window=&aggregate=workload|team|queue|reason|device_class&step="""

    permission_classes = [ReadsAllCosts]

    @extend_schema(parameters=[PendingQuerySerializer], responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        query = validated(PendingQuerySerializer, request)
        report = pending_report(
            query["start"], query["end"], aggregate=query["aggregate"], step=query["step"], now=query["now"]
        )
        return Response(report)


class StatementView(APIView):
    """GET /api/costs/statement?team=&month=YYYY-MM: finance, operators and admins for any team, members
    for their own teams."""

    permission_classes = [IsBrokerUser]

    @extend_schema(parameters=[StatementQuerySerializer], responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        query = validated(StatementQuerySerializer, request)
        team = Team.objects.filter(name=query["team"]).first()
        if not reads_all_costs(request.user) and (team is None or team.pk not in roles.team_ids(request.user)):
            raise PermissionDenied("You may read only your own team's statement.")
        if team is None:
            raise ValidationError({"team": [f"Unknown team '{query['team']}'."]})
        start, end = query["month"]
        return Response(monthly_statement(team, start, end))


class ExportCsvView(APIView):
    """GET /api/costs/export.csv?month=YYYY-MM: the chargeback of every team for the month."""

    permission_classes = [ReadsAllCosts]

    @extend_schema(
        parameters=[MonthQuerySerializer],
        responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="Chargeback per team.")},
    )
    def get(self, request):
        start, end = validated(MonthQuerySerializer, request)["month"]
        response = HttpResponse(exports.to_csv(exports.chargeback_rows(start, end)), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="chargeback-{start:%Y-%m}.csv"'
        return response


class ExportXlsxView(APIView):
    permission_classes = [ReadsAllCosts]

    @extend_schema(
        parameters=[MonthQuerySerializer],
        responses={
            (200, "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"): OpenApiResponse(
                OpenApiTypes.BINARY, description="Chargeback per team."
            )
        },
    )
    def get(self, request):
        start, end = validated(MonthQuerySerializer, request)["month"]
        response = HttpResponse(
            exports.to_xlsx(exports.chargeback_rows(start, end)),
            content_type="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        )
        response["Content-Disposition"] = f'attachment; filename="chargeback-{start:%Y-%m}.xlsx"'
        return response


class TickerView(APIView):
    """GET /api/costs/ticker: month-to-date cost and the current burn rate (the live ticker's payload)."""

    permission_classes = [ReadsAllCosts]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        return Response(running_cost())
