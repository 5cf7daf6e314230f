from django.apps import AppConfig


class GovernanceConfig(AppConfig):
    name = "broker.governance"
    label = "governance"
    verbose_name = "Governance: menu, approvals, audit"

    def ready(self):
        from broker.governance import notify  # noqa: F401  (tells approvers of approval events)
