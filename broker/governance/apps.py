from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    name = "broker.governance"
    label = "governance"
    verbose_name = "Governance: menu, approvals, audit"
