"""Admin writes are audited like API writes: policy, quota and inventory edits made in the Django
admin leave an immutable event with before/after, and move the cluster generation."""

import json

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.forms.models import model_to_dict

from broker.audit.models import record
from broker.events import request_cycle_after_commit
from broker.inventory.models import ClusterState


def admin_snapshot(instance):
    """Every concrete and many-to-many field, in JSON-friendly values (related rows by primary key)."""
    return json.loads(json.dumps(model_to_dict(instance), cls=DjangoJSONEncoder, default=str))


class AuditedAdminMixin:
    # Set on admins whose edits are hand-made changes to capacity (quotas, health, cordons).
    manual_intervention = False

    def audit_action(self, verb):
        return f"{self.model._meta.model_name}.{verb}"

    def after_write(self, reason):
        ClusterState.bump(settings.CLUSTER_NAME)
        request_cycle_after_commit(reason)

    # The admin wraps each change form in one transaction, so the row and its event commit together.
    def save_model(self, request, obj, form, change):
        form._audit_before = admin_snapshot(self.model.objects.get(pk=obj.pk)) if change else None
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        # Many-to-many fields and inlines are saved here, after save_model: record once they are.
        super().save_related(request, form, formsets, change)
        obj, before = form.instance, getattr(form, "_audit_before", None)
        record(
            self.audit_action("update" if change else "create"),
            obj,
            actor=request.user,
            before=before,
            after=admin_snapshot(obj),
            reason="edited in the admin",
            manual_intervention=self.manual_intervention and change,
        )
        self.after_write(f"{self.model._meta.verbose_name} edited in the admin")

    def delete_model(self, request, obj):
        with transaction.atomic():
            before = admin_snapshot(obj)
            record(self.audit_action("delete"), obj, actor=request.user, before=before, reason="deleted in the admin")
            super().delete_model(request, obj)
            self.after_write(f"{self.model._meta.verbose_name} deleted in the admin")

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for obj in queryset:
                record(
                    self.audit_action("delete"),
                    obj,
                    actor=request.user,
                    before=admin_snapshot(obj),
                    reason="deleted in the admin",
                )
            super().delete_queryset(request, queryset)
            self.after_write(f"{self.model._meta.verbose_name_plural} deleted in the admin")
