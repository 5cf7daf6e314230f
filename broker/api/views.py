from django.conf import settings
from django.db.models import Count
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.permissions import IsBrokerUser
from broker.governance.lockouts import lockout_response
from broker.inventory.models import ClusterState, Device, Node
from broker.workloads.api.serializers import SchedulingCycleSerializer
from broker.workloads.api.views import visible_to
from broker.workloads.models import SchedulingCycle, Workload


class StatusSerializer(serializers.Serializer):
    generation = serializers.IntegerField(help_text="Inventory generation; moves on every inventory change.")
    nodes = serializers.IntegerField()
    cordoned_nodes = serializers.IntegerField()
    devices = serializers.DictField(child=serializers.IntegerField(), help_text="Devices by health.")
    workloads = serializers.DictField(child=serializers.IntegerField(), help_text="Workloads you can see, by state.")
    last_cycle = SchedulingCycleSerializer(allow_null=True)


def counts_by(queryset, field):
    return {row[field]: row["n"] for row in queryset.values(field).annotate(n=Count("id")).order_by(field)}


class StatusView(APIView):
    """The cluster at a glance: inventory size and health, workloads by state, the last cycle."""

    permission_classes = [IsBrokerUser]

    @extend_schema(responses=StatusSerializer)
    def get(self, request):
        cluster = settings.CLUSTER_NAME
        last_cycle = SchedulingCycle.objects.filter(cluster=cluster).order_by("-started_at", "-id").first()
        status = {
            "generation": ClusterState.current_generation(cluster),
            "nodes": Node.objects.count(),
            "cordoned_nodes": Node.objects.filter(cordoned=True).count(),
            "devices": counts_by(Device.objects.all(), "health"),
            "workloads": counts_by(visible_to(Workload.objects.all(), request.user), "state"),
            "last_cycle": SchedulingCycleSerializer(last_cycle).data if last_cycle else None,
        }
        return Response(StatusSerializer(status).data)


class TokenView(ObtainAuthToken):
    """POST username and password for the API token. Failed attempts count towards the login lockout
    (django-axes, broker.governance.lockouts) as the login page's do; a locked-out username is answered
    429 saying so, not "Unable to log in", which would send its owner guessing passwords again."""

    @extend_schema(
        responses={
            200: inline_serializer("Token", {"token": serializers.CharField()}),
            429: OpenApiResponse(description="Locked out after too many failed logins; see Retry-After."),
        }
    )
    def post(self, request, *args, **kwargs):
        try:
            return super().post(request, *args, **kwargs)
        except ValidationError:
            if getattr(request, "axes_locked_out", False):
                return lockout_response(request)
            raise
