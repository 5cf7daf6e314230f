from django.contrib import admin

from broker.audit.admin_mixins import AuditedAdminMixin
from broker.limits import BoundedFieldsAdminMixin
from broker.policy.models import (
    Cohort,
    DeviceClass,
    PriorityClass,
    Queue,
    Reservation,
    ResourceClass,
    ResourceClassDeviceClass,
    Team,
)


@admin.register(Team)
class TeamAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "display_name")
    search_fields = ("name", "display_name")
    filter_horizontal = ("members",)


@admin.register(PriorityClass)
class PriorityClassAdmin(BoundedFieldsAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "value", "preemptible")
    list_filter = ("preemptible",)
    search_fields = ("name",)


@admin.register(DeviceClass)
class DeviceClassAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "selector", "price_per_hour")
    search_fields = ("name", "selector")


@admin.register(Cohort)
class CohortAdmin(AuditedAdminMixin, admin.ModelAdmin):
    manual_intervention = True

    list_display = ("name", "parent")
    search_fields = ("name",)


@admin.register(Queue)
class QueueAdmin(AuditedAdminMixin, admin.ModelAdmin):
    manual_intervention = True

    list_display = ("name", "team", "cohort", "fair_share_weight", "within_queue_preemption", "reclaim_within_cohort")
    list_filter = ("cohort", "within_queue_preemption", "reclaim_within_cohort")
    search_fields = ("name", "team__name")
    list_select_related = ("team", "cohort")


class DeviceClassChoiceInline(admin.TabularInline):
    model = ResourceClassDeviceClass
    extra = 1
    ordering = ("rank",)


@admin.register(ResourceClass)
class ResourceClassAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "display_name", "priority_class", "preemptible", "approval_required", "topology_required")
    list_filter = ("approval_required", "preemptible", "sharing", "allowed_teams")
    search_fields = ("name", "display_name", "cost_label")
    filter_horizontal = ("allowed_teams",)
    inlines = [DeviceClassChoiceInline]


@admin.register(Reservation)
class ReservationAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "team", "device_class", "count", "domain", "start", "end")
    list_filter = ("team", "device_class")
    search_fields = ("name", "team__name", "reason")
    date_hierarchy = "start"
