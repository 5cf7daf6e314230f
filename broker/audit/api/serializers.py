from rest_framework import serializers

from broker.audit.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "at",
            "actor",
            "actor_name",
            "action",
            "target_type",
            "target_id",
            "target_repr",
            "before",
            "after",
            "reason",
            "manual_intervention",
        ]
        read_only_fields = fields
