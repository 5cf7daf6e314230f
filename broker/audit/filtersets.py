import django_filters

from broker.audit.models import AuditEvent
from broker.limits import UtcIsoDateTimeFilter


class AuditEventFilterSet(django_filters.FilterSet):
    action = django_filters.CharFilter()
    action_prefix = django_filters.CharFilter(field_name="action", lookup_expr="startswith", help_text="e.g. workload.")
    after = UtcIsoDateTimeFilter(field_name="at", lookup_expr="gte")
    before = UtcIsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["action", "action_prefix", "actor_name", "target_type", "target_id", "manual_intervention"]
