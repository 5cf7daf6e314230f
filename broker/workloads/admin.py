from django import forms
from django.contrib import admin

from broker.audit.admin_mixins import AuditedAdminMixin
from broker.limits import BoundedFieldsAdminMixin
from broker.workloads import services
from broker.workloads.models import (
    Allocation,
    Explanation,
    ExplanationChange,
    PodSet,
    SchedulingCycle,
    Workload,
    WorkloadTransition,
)


class PodSetInline(BoundedFieldsAdminMixin, admin.TabularInline):
    model = PodSet
    extra = 0


class TransitionInline(admin.TabularInline):
    model = WorkloadTransition
    extra = 0
    can_delete = False
    readonly_fields = ("from_state", "to_state", "at", "actor", "reason")

    def has_add_permission(self, request, obj=None):
        return False


class WorkloadAdminForm(forms.ModelForm):
    """Group claims are checked as the API checks them: a malformed one is refused with its reasons."""

    class Meta:
        model = Workload
        fields = ["resource_class", "group_claims"]  # the admin adds the others it shows

    def clean(self):
        cleaned = super().clean()
        group_claims = cleaned.get("group_claims") or []
        resource_class = cleaned.get("resource_class")
        if not isinstance(group_claims, list) or not all(isinstance(claim, dict) for claim in group_claims):
            self.add_error("group_claims", "A list of {name, requests, constraints} objects.")
        elif group_claims and resource_class is not None:
            problems = [
                f"{claim.get('name', index)}: {message}"
                for index, (claim, errors) in enumerate(
                    zip(group_claims, services.group_claim_errors(group_claims, resource_class), strict=True)
                )
                for messages in errors.values()
                for message in messages
            ]
            if problems:
                self.add_error("group_claims", problems)
        return cleaned


@admin.register(Workload)
class WorkloadAdmin(BoundedFieldsAdminMixin, AuditedAdminMixin, admin.ModelAdmin):
    form = WorkloadAdminForm
    # A workload changed by hand (its priority, its pod sets) is an intervention like one in the dashboard,
    # and moves the cluster's generation: a cycle that read it before is refused, and the dashboard's
    # state (which reads pending pod sets) is read again.
    manual_intervention = True
    list_display = ("name", "team", "queue", "resource_class", "state", "priority", "submitted_at")
    list_filter = ("state", "team", "queue", "resource_class", "approval", "disruption_mode")
    search_fields = ("name", "team__name", "trace_id")
    date_hierarchy = "submitted_at"
    list_select_related = ("team", "queue", "resource_class")
    readonly_fields = ("state", "state_changed_at", "admitted_at", "started_at", "finished_at", "chosen_device_class")
    inlines = [PodSetInline, TransitionInline]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("device", "workload", "pod_set", "pod_index", "share_millionths", "allocated_at", "released_at")
    list_filter = ("device_class", ("released_at", admin.EmptyFieldListFilter))
    search_fields = ("workload__name", "device__node__name")
    list_select_related = ("device__node", "workload__team")
    raw_id_fields = ("workload", "device", "cycle")


@admin.register(Explanation)
class ExplanationAdmin(admin.ModelAdmin):
    list_display = ("workload", "reason", "position_in_queue", "position_in_cluster", "estimated_start", "updated_at")
    list_filter = ("reason",)
    search_fields = ("workload__name", "message")
    raw_id_fields = ("workload", "cycle")


@admin.register(ExplanationChange)
class ExplanationChangeAdmin(admin.ModelAdmin):
    list_display = ("workload", "reason", "at")
    list_filter = ("reason",)
    raw_id_fields = ("workload", "cycle")


@admin.register(SchedulingCycle)
class SchedulingCycleAdmin(admin.ModelAdmin):
    list_display = ("id", "started_at", "outcome", "pending_count", "admitted_count", "preempted_count", "decide_ms")
    list_filter = ("outcome", "cluster")
    date_hierarchy = "started_at"

    def has_change_permission(self, request, obj=None):
        return False
