from django.contrib import admin

from broker.audit.admin_mixins import AuditedAdminMixin
from broker.inventory.models import ClusterState, Device, Domain, Node, TopologyLevel


@admin.register(TopologyLevel)
class TopologyLevelAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "order")
    ordering = ("order",)


@admin.register(Domain)
class DomainAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "level", "parent")
    list_filter = ("level",)
    search_fields = ("name",)
    list_select_related = ("level", "parent")
    autocomplete_fields = ("parent",)


class DeviceInline(admin.TabularInline):
    model = Device
    fields = (
        "name", "driver", "health", "attributes", "capacity", "taints", "consumes_counters",
        "allow_multiple_allocations",
    )  # fmt: skip
    extra = 0
    show_change_link = True


@admin.register(Node)
class NodeAdmin(AuditedAdminMixin, admin.ModelAdmin):
    manual_intervention = True

    list_display = ("name", "domain", "cordoned", "device_count")
    list_filter = ("cordoned", "domain__level", "domain")
    search_fields = ("name", "domain__name")
    list_select_related = ("domain",)
    autocomplete_fields = ("domain",)
    inlines = [DeviceInline]

    @admin.display(description="devices")
    def device_count(self, obj):
        return obj.devices.count()


@admin.register(Device)
class DeviceAdmin(AuditedAdminMixin, admin.ModelAdmin):
    manual_intervention = True

    list_display = ("qualified_name", "driver", "health", "model", "parent")
    list_filter = ("health", "driver", "node__domain")
    search_fields = ("name", "node__name", "pool")
    list_select_related = ("node",)
    raw_id_fields = ("node", "parent")

    @admin.display(description="model")
    def model(self, obj):
        return obj.attributes.get("model", "")


@admin.register(ClusterState)
class ClusterStateAdmin(admin.ModelAdmin):
    list_display = ("name", "generation")
    readonly_fields = ("generation",)
