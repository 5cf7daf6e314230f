from django.contrib import admin

from broker.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: audit events are never edited or deleted, not even by a superuser."""

    list_display = ("at", "actor_name", "action", "target_type", "target_repr", "manual_intervention")
    list_filter = ("action", "target_type", "manual_intervention")
    search_fields = ("actor_name", "target_repr", "reason")
    date_hierarchy = "at"

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
