import django_filters
from django.db.models import Q

from broker.limits import UtcIsoDateTimeFilter
from broker.policy.models import Cohort, DeviceClass, PriorityClass, Queue, Reservation, ResourceClass, Team


class TeamFilterSet(django_filters.FilterSet):
    member = django_filters.CharFilter(field_name="members__username")

    class Meta:
        model = Team
        fields = ["name", "member"]


class PriorityClassFilterSet(django_filters.FilterSet):
    class Meta:
        model = PriorityClass
        fields = {"name": ["exact"], "value": ["exact", "gte", "lte"], "preemptible": ["exact"]}


class DeviceClassFilterSet(django_filters.FilterSet):
    class Meta:
        model = DeviceClass
        fields = ["name"]


class CohortFilterSet(django_filters.FilterSet):
    parent = django_filters.CharFilter(field_name="parent__name")

    class Meta:
        model = Cohort
        fields = ["name", "parent"]


class QueueFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    cohort = django_filters.CharFilter(field_name="cohort__name")

    class Meta:
        model = Queue
        fields = ["name", "team", "cohort"]


class ResourceClassFilterSet(django_filters.FilterSet):
    priority_class = django_filters.CharFilter(field_name="priority_class__name")
    device_class = django_filters.CharFilter(field_name="device_class_choices__device_class__name", distinct=True)
    allowed_team = django_filters.CharFilter(field_name="allowed_teams__name", distinct=True)
    entitled = django_filters.BooleanFilter(
        method="filter_entitled", help_text="true: only the classes one of your teams may use (the member's menu)."
    )

    class Meta:
        model = ResourceClass
        fields = ["name", "sharing", "preemptible", "approval_required", "priority_class", "device_class"]

    def filter_entitled(self, queryset, name, value):
        if value is None:
            return queryset
        teams = self.request.user.teams.all()
        entitled = Q(allowed_teams__isnull=True) | Q(allowed_teams__in=teams)
        return queryset.filter(entitled).distinct() if value else queryset.exclude(entitled)


class ReservationFilterSet(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    device_class = django_filters.CharFilter(field_name="device_class__name")
    active_at = UtcIsoDateTimeFilter(method="filter_active_at", help_text="Held at this instant.")

    class Meta:
        model = Reservation
        fields = ["name", "team", "device_class", "domain"]

    def filter_active_at(self, queryset, name, value):
        return queryset.filter(start__lte=value, end__gt=value)
