import csv
import json

from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.renderers import JSONRenderer

from broker.api.pagination import BrokerPagination
from broker.api.permissions import ReadsAudit
from broker.api.renderers import CSVRenderer
from broker.audit import filtersets
from broker.audit.api.serializers import AuditEventSerializer
from broker.audit.models import AuditEvent

CSV_COLUMNS = [
    "at",
    "actor_name",
    "action",
    "target_type",
    "target_id",
    "target_repr",
    "manual_intervention",
    "reason",
    "before",
    "after",
]


class Echo:
    """csv.writer writes into this and gets the line back, so rows stream instead of piling up."""

    def write(self, value):
        return value


# Spreadsheets run a cell that starts like a formula, and skip a leading TAB, CR or LF to find one
# (OWASP's CSV injection list, with the full-width signs some spreadsheets read as the ASCII ones).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def csv_cell(value):
    if isinstance(value, dict | list):
        value = json.dumps(value, sort_keys=True)
    text = "" if value is None else str(value)
    # An audit trail must never execute: such a cell is quoted as text with a leading apostrophe.
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_rows(events):
    writer = csv.writer(Echo())
    yield writer.writerow(CSV_COLUMNS)
    for event in events.iterator(chunk_size=2000):
        yield writer.writerow([csv_cell(getattr(event, column)) for column in CSV_COLUMNS])


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The immutable audit trail: read, search and export; no endpoint writes it."""

    queryset = AuditEvent.objects.select_related("actor")
    serializer_class = AuditEventSerializer
    permission_classes = [ReadsAudit]
    pagination_class = BrokerPagination
    filterset_class = filtersets.AuditEventFilterSet
    ordering_fields = ["at", "action"]
    search_fields = ["actor_name", "action", "target_type", "target_repr", "reason"]

    @extend_schema(responses={(200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="All matching events.")})
    @action(detail=False, methods=["get"], pagination_class=None, renderer_classes=[JSONRenderer, CSVRenderer])
    def export(self, request):
        """Every event matching the list's filters and search, as CSV."""
        events = self.filter_queryset(self.get_queryset())
        response = StreamingHttpResponse(csv_rows(events), content_type="text/csv; charset=utf-8")
        filename = f"audit-{timezone.now():%Y%m%d-%H%M%S}.csv"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response
