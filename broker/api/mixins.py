import json
from collections import defaultdict

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import ProtectedError, RestrictedError
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response

from broker.api.pagination import BrokerPagination
from broker.api.serializers import drf_errors
from broker.audit.models import record
from broker.events import request_cycle_after_commit
from broker.inventory.models import ClusterState
from broker.workloads.services import ActionRefused, InvalidSubmission


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The object is not in a state that allows this."
    default_code = "conflict"


BLOCKERS_NAMED = 10


def describe_blockers(objects):
    """ "2 queues (team-a, team-b); 21,643 workloads (team-a/job-1, …)": per model, how many and the first
    few by primary key. Only those are named: a workload's name reads its team, a query each, and a
    device class in use has tens of thousands of them."""
    by_model = defaultdict(list)
    for obj in objects:
        by_model[obj._meta].append(obj)
    parts = []
    for meta, rows in sorted(by_model.items(), key=lambda item: item[0].label):
        rows.sort(key=lambda obj: obj.pk)
        named = ", ".join(str(obj) for obj in rows[:BLOCKERS_NAMED])
        noun = meta.verbose_name if len(rows) == 1 else meta.verbose_name_plural
        parts.append(f"{len(rows):,} {noun} ({named}{', …' if len(rows) > BLOCKERS_NAMED else ''})")
    return "; ".join(parts)


def audit_reason(request):
    """Writers may say why in an X-Reason header; it lands in the audit event."""
    return request.headers.get("X-Reason", "")[:2000]


class DomainErrorsMixin:
    """Domain code raises Django's ValidationError, InvalidSubmission and ActionRefused; the API answers
    400, 400 and 409."""

    pagination_class = BrokerPagination

    def handle_exception(self, exc):
        if isinstance(exc, DjangoValidationError):
            exc = ValidationError(drf_errors(exc))
        elif isinstance(exc, InvalidSubmission):
            exc = ValidationError(exc.errors)
        elif isinstance(exc, ActionRefused):
            exc = Conflict(str(exc))
        return super().handle_exception(exc)


class AuditedWritesMixin(DomainErrorsMixin):
    """Every create, update and delete is one transaction that writes the row, an audit event with
    before/after, and bumps the cluster generation so a cycle running on the old inventory or policy
    refuses to commit; a fresh cycle is asked for after the commit."""

    # Set on viewsets whose updates are hand-made changes to capacity (quotas, health).
    manual_intervention = False

    def audit_snapshot(self, instance):
        data = self.get_serializer(instance).data
        return json.loads(json.dumps(data, cls=DjangoJSONEncoder))

    def audit_action(self, verb):
        return f"{self.queryset.model._meta.model_name}.{verb}"

    def bump_generation(self):
        ClusterState.bump(settings.CLUSTER_NAME)
        request_cycle_after_commit(f"{self.queryset.model._meta.verbose_name} changed through the API")

    def perform_create(self, serializer):
        with transaction.atomic():
            instance = serializer.save()
            record(
                self.audit_action("create"),
                instance,
                actor=self.request.user,
                after=self.audit_snapshot(instance),
                reason=audit_reason(self.request),
            )
            self.bump_generation()

    def perform_update(self, serializer):
        with transaction.atomic():
            before = self.audit_snapshot(serializer.instance)
            instance = serializer.save()
            record(
                self.audit_action("update"),
                instance,
                actor=self.request.user,
                before=before,
                after=self.audit_snapshot(instance),
                reason=audit_reason(self.request),
                manual_intervention=self.manual_intervention,
            )
            self.bump_generation()

    def perform_destroy(self, instance):
        with transaction.atomic():
            before = self.audit_snapshot(instance)
            record(
                self.audit_action("delete"),
                instance,
                actor=self.request.user,
                before=before,
                reason=audit_reason(self.request),
                manual_intervention=self.manual_intervention,
            )
            instance.delete()
            self.bump_generation()

    def destroy(self, request, *args, **kwargs):
        try:
            return super().destroy(request, *args, **kwargs)
        except (ProtectedError, RestrictedError) as error:
            objects = getattr(error, "protected_objects", None) or getattr(error, "restricted_objects", ())
            return Response(
                {"detail": f"It is still in use by {describe_blockers(objects)}."},
                status=status.HTTP_409_CONFLICT,
            )
