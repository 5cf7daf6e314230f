import django_filters

from broker.limits import UtcIsoDateTimeFilter
from broker.workloads.models import Allocation, ApprovalState, Explanation, SchedulingCycle, Workload
from broker.workloads.states import State


class WorkloadFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=State.choices, distinct=False)  # a column: no duplicates
    approval = django_filters.ChoiceFilter(choices=ApprovalState.choices)
    team = django_filters.CharFilter(field_name="team__name")
    queue = django_filters.CharFilter(field_name="queue__name")
    resource_class = django_filters.CharFilter(field_name="resource_class__name")
    submitted_by = django_filters.CharFilter(field_name="submitted_by__username")
    submitted_after = UtcIsoDateTimeFilter(field_name="submitted_at", lookup_expr="gte")
    submitted_before = UtcIsoDateTimeFilter(field_name="submitted_at", lookup_expr="lt")

    class Meta:
        model = Workload
        fields = ["name", "state", "approval", "team", "queue", "resource_class", "submitted_by", "disruption_mode"]


class AllocationFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="workload__team__name")
    node = django_filters.CharFilter(field_name="device__node__name")
    device_class = django_filters.CharFilter(field_name="device_class__name")
    active = django_filters.BooleanFilter(field_name="released_at", lookup_expr="isnull")
    # Pods of shrunk workloads still shutting down (Pod disruption mode).
    evicting = django_filters.BooleanFilter(field_name="eviction_requested_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = Allocation
        fields = ["workload", "device", "team", "node", "device_class", "active", "evicting", "cycle"]


class ExplanationFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="workload__team__name")
    queue = django_filters.CharFilter(field_name="workload__queue__name")
    resource_class = django_filters.CharFilter(field_name="workload__resource_class__name")
    reason = django_filters.CharFilter()

    class Meta:
        model = Explanation
        fields = ["workload", "team", "queue", "resource_class", "reason"]


class SchedulingCycleFilterSet(django_filters.FilterSet):
    outcome = django_filters.ChoiceFilter(choices=SchedulingCycle.Outcome.choices)
    started_after = UtcIsoDateTimeFilter(field_name="started_at", lookup_expr="gte")
    started_before = UtcIsoDateTimeFilter(field_name="started_at", lookup_expr="lt")

    class Meta:
        model = SchedulingCycle
        fields = ["cluster", "outcome"]
