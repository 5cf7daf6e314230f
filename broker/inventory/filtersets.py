import django_filters

from broker.inventory.models import Device, Domain, Health, Node, TopologyLevel


class TopologyLevelFilterSet(django_filters.FilterSet):
    class Meta:
        model = TopologyLevel
        fields = ["name"]


class DomainFilterSet(django_filters.FilterSet):
    level = django_filters.CharFilter(field_name="level__name")

    class Meta:
        model = Domain
        fields = ["level", "name", "parent"]


class NodeFilterSet(django_filters.FilterSet):
    domain_name = django_filters.CharFilter(field_name="domain__name", help_text="The node's finest domain.")

    class Meta:
        model = Node
        fields = ["name", "domain", "domain_name", "cordoned"]


class DeviceFilterSet(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name")
    health = django_filters.ChoiceFilter(choices=Health.choices)
    model = django_filters.CharFilter(field_name="attributes__model", help_text="The device's model attribute.")
    tainted = django_filters.BooleanFilter(method="filter_tainted")

    class Meta:
        model = Device
        fields = ["node", "driver", "pool", "name", "health", "model", "parent"]

    def filter_tainted(self, queryset, name, value):
        return queryset.exclude(taints=[]) if value else queryset.filter(taints=[])
