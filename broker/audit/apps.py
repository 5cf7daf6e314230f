from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "broker.audit"
    label = "audit"
